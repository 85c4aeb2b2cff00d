package daemon_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
)

// appendCmd appends a line to a file outside the agent's work directory, so
// the count survives whatever the agent does to its own files.
func appendCmd(path string) string { return fmt.Sprintf("echo ran >> %q; echo done", path) }

func countLines(t *testing.T, path string) int {
	t.Helper()
	if _, err := os.Stat(path); os.IsNotExist(err) {
		return 0
	}
	return lines(t, path)
}

// TestOfferedTwiceExecutedOnce: a run offered again (its acknowledgement or
// result lost on the way) is executed once; the second offer gets the
// stored result.
func TestOfferedTwiceExecutedOnce(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	start(t, testConfig(t, f, dir))

	item := work(50, 1, appendCmd(count))
	f.push(item, item) // the same offer twice in one answer
	f.push(item)       // and once more later
	got := f.waitResults(t, 50, 3)
	assert.Equal(t, 1, countLines(t, count), "executed once")
	for _, r := range got {
		assert.Equal(t, got[0], r)
	}
	assert.Equal(t, "done\n", got[0].StdoutTail)
	rec, err := (&daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}).LoadRun(50, 1)
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.Equal(t, daemon.PhaseFinished, rec.Phase)
	assert.Equal(t, got[0], *rec.Result)
	st, err := os.Stat(filepath.Join(dir, daemon.RecordsDir))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
}

// TestRestartedAgentReportsStoredResult: an agent restarted on a work
// directory whose record holds a finished run reports that result when the
// run is offered again, without running the command.
func TestRestartedAgentReportsStoredResult(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	stop, _ := start(t, testConfig(t, f, dir))
	f.push(work(60, 2, appendCmd(count)))
	first := f.waitResults(t, 60, 1)[0]
	require.NoError(t, stop())
	f.waitNoPolls(t)

	cfg := testConfig(t, f, dir)
	cfg.EnrollToken = ""
	start(t, cfg)
	f.push(work(60, 2, appendCmd(count)))
	again := f.waitResults(t, 60, 2)[1]
	assert.Equal(t, first, again)
	assert.Equal(t, 1, countLines(t, count), "not run again after the restart")

	// A record written by hand says the same: its result is what is reported.
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	stored := protocol.RunResult{Attempt: 1, ExitCode: 5, StdoutTail: "from the record\n",
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), FinishedAt: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 61, Attempt: 1, Phase: daemon.PhaseFinished, Result: &stored}))
	f.push(work(61, 1, appendCmd(count)))
	assert.Equal(t, stored, f.waitResults(t, 61, 1)[0])
	assert.Equal(t, 1, countLines(t, count))
}

// TestStartedUnfinishedRecordReportedFailed: a run a previous agent process
// started and never finished is reported failed at start (not re-run), a
// later offer of it gets the same failure, and a new attempt runs.
func TestStartedUnfinishedRecordReportedFailed(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 70, Attempt: 2, Task: "task70", Phase: daemon.PhaseStarted}))
	// Received but never started (the agent died before acknowledging):
	// safe to run when offered again.
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 71, Attempt: 1, Phase: daemon.PhaseReceived}))

	start(t, testConfig(t, f, dir))
	failed := f.waitResults(t, 70, 1)[0]
	assert.Equal(t, 2, failed.Attempt)
	assert.Equal(t, -1, failed.ExitCode)
	assert.Contains(t, failed.Error, "interrupted: the agent")
	assert.Contains(t, failed.Error, "not run again")

	f.push(work(70, 2, appendCmd(count)))
	again := f.waitResults(t, 70, 2)[1]
	assert.Equal(t, failed, again)
	assert.Equal(t, 0, countLines(t, count), "the interrupted run is not run again")

	f.push(work(71, 1, appendCmd(count)))
	assert.True(t, f.waitResults(t, 71, 1)[0].Succeeded())
	assert.Equal(t, 1, countLines(t, count))

	f.push(work(70, 3, appendCmd(count)))
	r3 := f.waitResults(t, 70, 3)[2]
	assert.Equal(t, 3, r3.Attempt)
	assert.True(t, r3.Succeeded(), "a new attempt runs")
	assert.Equal(t, 2, countLines(t, count))
}

// TestRefusedAckDoesNotRun: a run the API refuses to hand over (a stale
// attempt, a stopped transaction) is not executed.
func TestRefusedAckDoesNotRun(t *testing.T) {
	f := newFakeAPI(t)
	f.ackStatus[80] = http.StatusConflict
	count := filepath.Join(t.TempDir(), "count")
	start(t, testConfig(t, f, t.TempDir()))
	f.push(work(80, 1, appendCmd(count)), work(81, 1, "echo next"))
	f.waitResults(t, 81, 1)
	assert.Equal(t, 0, countLines(t, count))
	assert.Zero(t, f.count(f.resultPosts, 80))
}

// TestSoftwareRoundAppliedOnce: a software deployment round listed again
// (its signal lost, the agent restarted) runs its hook once; a round a
// dead agent had started is signalled failed, not applied again.
func TestSoftwareRoundAppliedOnce(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	f.software = []protocol.SoftwareDeployment{{ID: 5, Round: 1, Action: "CREATE", Group: "script", TimeoutSec: 10,
		Config: fmt.Sprintf("echo applied >> %q; echo ok", count)}}
	signals := func(n int) []protocol.SoftwareSignal {
		t.Helper()
		var got []protocol.SoftwareSignal
		require.Eventually(t, func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			got = append([]protocol.SoftwareSignal(nil), f.signals[5]...)
			return len(got) >= n
		}, 10*time.Second, 10*time.Millisecond)
		return got
	}
	stop, _ := start(t, testConfig(t, f, dir))
	got := signals(3)
	assert.Equal(t, 0, got[0].StatusCode)
	assert.Equal(t, "ok\n", got[0].Stdout)
	assert.Equal(t, got[0], got[2], "the stored signal, again")
	require.NoError(t, stop())
	f.waitNoPolls(t)
	f.mu.Lock()
	before := len(f.signals[5])
	f.mu.Unlock()

	cfg := testConfig(t, f, dir)
	cfg.EnrollToken = ""
	stop, _ = start(t, cfg)
	got = signals(before + 2)
	assert.Equal(t, got[0], got[len(got)-1])
	assert.Equal(t, 1, countLines(t, count), "applied once across the restart")
	require.NoError(t, stop())

	// A round the previous process started and never finished.
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	require.NoError(t, recs.SaveSoftware(&daemon.SoftwareRecord{ID: 6, Round: 2, Phase: daemon.PhaseStarted}))
	f.mu.Lock()
	f.software = []protocol.SoftwareDeployment{{ID: 6, Round: 2, Action: "UPDATE", Group: "script", TimeoutSec: 10,
		Config: fmt.Sprintf("echo applied >> %q", count)}}
	f.mu.Unlock()
	start(t, cfg)
	var sig protocol.SoftwareSignal
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.signals[6]) == 0 {
			return false
		}
		sig = f.signals[6][0]
		return true
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, daemon.HookBroken, sig.StatusCode)
	assert.Equal(t, 2, sig.Round)
	assert.Contains(t, sig.StatusReason, "interrupted")
	assert.Equal(t, 1, countLines(t, count), "the interrupted round is not applied again")
}

// CreateRun appends a run's first record to the journal, private and
// readable, and no file of its own; a record already there (an earlier
// agent's "received") is superseded; an older agent's torn record file
// reads as an error, never as no record.
func TestCreateRunRecord(t *testing.T) {
	recs := &daemon.Records{Dir: filepath.Join(t.TempDir(), daemon.RecordsDir)}
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 90, Attempt: 1, Task: "t", Phase: daemon.PhaseStarted}))
	got, err := recs.LoadRun(90, 1)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, daemon.PhaseStarted, got.Phase)
	assert.Equal(t, os.Getpid(), got.PID)
	st, err := os.Stat(filepath.Join(recs.Dir, daemon.JournalFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.NoFileExists(t, recs.RunRecordPath(90, 1), "no file per attempt")

	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 91, Attempt: 1, Phase: daemon.PhaseReceived}))
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 91, Attempt: 1, Phase: daemon.PhaseStarted}))
	got, err = recs.LoadRun(91, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase, "replaced")
	entries, err := os.ReadDir(recs.Dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the journal alone, no temporary file left behind")
	assert.Equal(t, daemon.JournalFile, entries[0].Name())
	assert.Len(t, journalLines(t, recs.Dir), 3, "one line per record")

	// A record file an older agent left, read by the next agent process.
	require.NoError(t, os.WriteFile(recs.RunRecordPath(92, 1), []byte(`{"run_id": 92, "attempt": 1, "pha`), 0o600))
	require.NoError(t, recs.Close())
	recs = &daemon.Records{Dir: recs.Dir}
	_, err = recs.LoadRun(92, 1)
	assert.Error(t, err, "a torn record is unreadable")
}

// The result is appended to the journal: an attempt's record is its last
// line; a torn last line (a crash while it was appended) leaves the line
// before it, and is cut off so that the next append is a line of its own.
func TestRunRecordAppends(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	recs := &daemon.Records{Dir: dir}
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 94, Attempt: 1, Phase: daemon.PhaseStarted}))
	res := protocol.RunResult{Attempt: 1, ExitCode: 3}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 94, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
	got, err := recs.LoadRun(94, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseFinished, got.Phase)
	require.NotNil(t, got.Result)
	assert.Equal(t, 3, got.Result.ExitCode)
	assert.Len(t, journalLines(t, dir), 2)
	require.NoError(t, recs.Close())

	// A crash while the result was appended: the run started, and no more.
	path := filepath.Join(dir, daemon.JournalFile)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data[:len(data)-10], 0o600))
	recs = &daemon.Records{Dir: dir}
	got, err = recs.LoadRun(94, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase)
	assert.Nil(t, got.Result)
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	require.Len(t, unfinished, 1)
	assert.Equal(t, int64(94), unfinished[0].RunID)

	// The next record is whole, and so is every line.
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 97, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
	require.NoError(t, recs.Close())
	assert.Len(t, journalLines(t, dir), 2, "the torn line is gone")
	recs = &daemon.Records{Dir: dir}
	got, err = recs.LoadRun(97, 1)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, daemon.PhaseFinished, got.Phase)
	got, err = recs.LoadRun(94, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase)

	// A crash while a run's first record was appended: its command never
	// started (it starts once the record is synced), so there is no record.
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 98, Attempt: 1, Phase: daemon.PhaseStarted}))
	require.NoError(t, recs.Close())
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data[:len(data)-10], 0o600))
	recs = &daemon.Records{Dir: dir}
	got, err = recs.LoadRun(98, 1)
	require.NoError(t, err)
	assert.Nil(t, got)
	unfinished, err = recs.Unfinished()
	require.NoError(t, err)
	assert.Equal(t, []int64{94}, runIDs(unfinished))
}

// Records outlive the Records that wrote them: a new one on the same
// directory (the next agent process) finds every attempt's last record,
// and the runs left started.
func TestRecordsSurviveReopening(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	recs := &daemon.Records{Dir: dir}
	res := protocol.RunResult{Attempt: 2, ExitCode: 7, StdoutTail: "tail\n"}
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 1, Attempt: 2, Task: "one", Phase: daemon.PhaseStarted}))
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 2, Attempt: 1, Task: "two", Phase: daemon.PhaseStarted}))
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 1, Attempt: 2, Task: "one", Phase: daemon.PhaseFinished, Result: &res}))
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 3, Attempt: 1, Task: "three", Phase: daemon.PhaseStarted}))
	require.NoError(t, recs.Close())

	recs = &daemon.Records{Dir: dir}
	got, err := recs.LoadRun(1, 2)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, daemon.PhaseFinished, got.Phase)
	assert.Equal(t, "one", got.Task)
	assert.Equal(t, res, *got.Result)
	got, err = recs.LoadRun(1, 1)
	require.NoError(t, err)
	assert.Nil(t, got, "another attempt has no record")
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	require.Len(t, unfinished, 2)
	assert.Equal(t, []string{"two", "three"}, []string{unfinished[0].Task, unfinished[1].Task})
}

// A Records reads what another one on the same directory wrote since it
// opened the journal (a record written by hand while the agent runs), even
// after a compaction replaced the file.
func TestRecordsSeeAnotherWriter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	agent, other := &daemon.Records{Dir: dir}, &daemon.Records{Dir: dir}
	require.NoError(t, agent.CreateRun(&daemon.RunRecord{RunID: 1, Attempt: 1, Phase: daemon.PhaseStarted}))
	require.NoError(t, other.SaveRun(&daemon.RunRecord{RunID: 2, Attempt: 1, Phase: daemon.PhaseStarted}))
	assert.Equal(t, daemon.PhaseStarted, phaseOf(t, agent, 2), "appended by the other")
	require.NoError(t, agent.SaveRun(&daemon.RunRecord{RunID: 3, Attempt: 1, Phase: daemon.PhaseFinished}))
	assert.Equal(t, daemon.PhaseFinished, phaseOf(t, agent, 3), "its own line, after the other's")

	require.NoError(t, other.Prune(time.Now().Add(time.Hour)))        // drops 3, rewrites the journal
	long := protocol.RunResult{StdoutTail: strings.Repeat("x", 1000)} // the new file outgrows the old
	require.NoError(t, other.SaveRun(&daemon.RunRecord{RunID: 5, Attempt: 1, Phase: daemon.PhaseFinished, Result: &long}))
	assert.Equal(t, daemon.PhaseFinished, phaseOf(t, agent, 5), "the compacted journal is read")
	assert.Empty(t, phaseOf(t, agent, 3), "the compacted journal is read")
	require.NoError(t, agent.SaveRun(&daemon.RunRecord{RunID: 4, Attempt: 1, Phase: daemon.PhaseStarted}))
	assert.Equal(t, daemon.PhaseStarted, phaseOf(t, other, 4), "appended to the new journal, not the replaced one")
}

// An agent upgraded in place reads the record files its previous version
// wrote, one per attempt, the last whole line the record: a finished one
// gives its result, a started one is unfinished until the journal has a
// later record of it, one with no whole line is unreadable. Prune removes
// the old ones and keeps the journal, however old it is.
func TestLegacyRunRecordFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	recs := &daemon.Records{Dir: dir}
	legacy := func(runID int64, content string) { writeRecordFile(t, recs, runID, content) }
	legacy(10, `{"run_id": 10, "attempt": 1, "phase": "started"}`+"\n"+
		`{"run_id": 10, "attempt": 1, "phase": "finished", "result": {"attempt": 1, "exit_code": 4}}`+"\n")
	legacy(11, `{"run_id": 11, "attempt": 1, "phase": "started"}`) // whole, without a newline
	legacy(12, `{"run_id": 12, "attempt": 1, "phase": "started"}`+"\n"+`{"run_id": 12, "attempt": 1, "pha`)
	legacy(13, `{"run_id": 13, "attempt": 1, "pha`)
	legacy(14, "")

	got, err := recs.LoadRun(10, 1)
	require.NoError(t, err)
	require.NotNil(t, got.Result)
	assert.Equal(t, 4, got.Result.ExitCode)
	got, err = recs.LoadRun(12, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase, "the line before a torn one stands")
	for _, id := range []int64{13, 14} {
		_, err = recs.LoadRun(id, 1)
		assert.Error(t, err, "run %d: no whole record", id)
	}
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	assert.ElementsMatch(t, []int64{11, 12}, runIDs(unfinished))

	res := protocol.RunResult{Attempt: 1, ExitCode: -1, Error: "interrupted"}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 11, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
	got, err = recs.LoadRun(11, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseFinished, got.Phase, "the journal's record is the later one")
	unfinished, err = recs.Unfinished()
	require.NoError(t, err)
	assert.Equal(t, []int64{12}, runIDs(unfinished))
	assert.Equal(t, `{"run_id": 11, "attempt": 1, "phase": "started"}`, readFile(t, recs.RunRecordPath(11, 1)),
		"new records go to the journal")

	// Eight days later, nothing written since.
	old := time.Now().Add(-daemon.RecordRetention - 24*time.Hour)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.Chtimes(filepath.Join(dir, e.Name()), old, old))
	}
	require.NoError(t, recs.Prune(time.Now().Add(-daemon.RecordRetention)))
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, daemon.JournalFile, entries[0].Name())
	got, err = recs.LoadRun(11, 1)
	require.NoError(t, err)
	assert.NotNil(t, got, "a recent record in an old journal is kept")
}

// Compaction keeps the last record of each attempt written after the
// cutoff and every record still started, however old, and drops the rest:
// superseded lines, garbled ones, old records.
func TestPruneCompactsJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	old, recent := time.Now().Add(-8*24*time.Hour).UTC(), time.Now().Add(-time.Hour).UTC()
	res := &protocol.RunResult{Attempt: 1}
	writeJournal(t, dir, []string{
		recordLine(t, daemon.RunRecord{RunID: 200, Attempt: 1, Phase: daemon.PhaseStarted, UpdatedAt: old}),
		recordLine(t, daemon.RunRecord{RunID: 200, Attempt: 1, Phase: daemon.PhaseFinished, UpdatedAt: old, Result: res}),
		recordLine(t, daemon.RunRecord{RunID: 201, Attempt: 1, Phase: daemon.PhaseStarted, UpdatedAt: old}),
		recordLine(t, daemon.RunRecord{RunID: 202, Attempt: 1, Phase: daemon.PhaseStarted, UpdatedAt: recent}),
		`not a record`,
		recordLine(t, daemon.RunRecord{RunID: 202, Attempt: 1, Phase: daemon.PhaseFinished, UpdatedAt: recent, Result: res}),
		recordLine(t, daemon.RunRecord{RunID: 203, Attempt: 1, Phase: daemon.PhaseReceived, UpdatedAt: old}),
	})
	recs := &daemon.Records{Dir: dir}
	require.NoError(t, recs.Prune(time.Now().Add(-daemon.RecordRetention)))
	lines := journalLines(t, dir)
	assert.Len(t, lines, 2)

	recs = &daemon.Records{Dir: dir}
	for id, phase := range map[int64]string{200: "", 201: daemon.PhaseStarted, 202: daemon.PhaseFinished, 203: ""} {
		assert.Equal(t, phase, phaseOf(t, recs, id), "run %d", id)
	}
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	assert.Equal(t, []int64{201}, runIDs(unfinished))
}

// The journal compacts itself as it grows past CompactSize, keeping what
// Prune keeps, and a journal of recent records alone is not rewritten at
// every append: the next compaction waits until it has doubled.
func TestJournalCompactsWhenLarge(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	old := time.Now().Add(-8 * 24 * time.Hour).UTC()
	writeJournal(t, dir, []string{
		recordLine(t, daemon.RunRecord{RunID: 1, Attempt: 1, Phase: daemon.PhaseFinished, UpdatedAt: old, Result: &protocol.RunResult{}}),
		recordLine(t, daemon.RunRecord{RunID: 2, Attempt: 1, Phase: daemon.PhaseStarted, UpdatedAt: old}),
	})
	recs := &daemon.Records{Dir: dir, CompactSize: 4096}
	path := filepath.Join(dir, daemon.JournalFile)
	var ino uint64
	compactions := 0 // the file replaced (inodes are reused: only a change counts)
	const runs = 300
	for id := int64(100); id < 100+runs; id++ {
		require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: id, Attempt: 1, Phase: daemon.PhaseStarted}))
		res := protocol.RunResult{Attempt: 1, StdoutTail: strings.Repeat("x", 100)}
		require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: id, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
		st, err := os.Stat(path)
		require.NoError(t, err)
		if i := st.Sys().(*syscall.Stat_t).Ino; i != ino {
			compactions++
			ino = i
		}
	}
	assert.Greater(t, compactions, 3, "compacted")
	assert.Less(t, compactions, 15, "not at every append")

	lines := journalLines(t, dir)
	assert.Less(t, len(lines), 2*runs, "superseded lines dropped")
	recs = &daemon.Records{Dir: dir}
	got, err := recs.LoadRun(1, 1)
	require.NoError(t, err)
	assert.Nil(t, got, "an old finished record is dropped")
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	assert.Equal(t, []int64{2}, runIDs(unfinished), "an old started one is kept")
	for id := int64(100); id < 100+runs; id++ {
		got, err := recs.LoadRun(id, 1)
		require.NoError(t, err)
		require.NotNil(t, got, "run %d", id)
		assert.Equal(t, daemon.PhaseFinished, got.Phase)
	}
}

// Runs record from several goroutines at once (the work loop, the
// software loop, a report of an interrupted run) while the journal
// compacts itself; every record stands.
func TestConcurrentSaveRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	recs := &daemon.Records{Dir: dir, CompactSize: 8192}
	const goroutines, each = 8, 40
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				id := int64(g*1000 + i)
				assert.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: id, Attempt: 1, Phase: daemon.PhaseStarted}))
				got, err := recs.LoadRun(id, 1)
				if assert.NoError(t, err) && assert.NotNil(t, got) {
					assert.Equal(t, daemon.PhaseStarted, got.Phase)
				}
				res := protocol.RunResult{Attempt: 1, ExitCode: g}
				assert.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: id, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, recs.Close())

	journalLines(t, dir)
	recs = &daemon.Records{Dir: dir}
	for g := range goroutines {
		for i := range each {
			got, err := recs.LoadRun(int64(g*1000+i), 1)
			require.NoError(t, err)
			require.NotNil(t, got)
			assert.Equal(t, daemon.PhaseFinished, got.Phase)
			assert.Equal(t, g, got.Result.ExitCode)
		}
	}
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	assert.Empty(t, unfinished)
}

// An agent upgraded in place honours its previous version's record files:
// a finished run offered again gets its stored result, a started one is
// reported interrupted, a torn one failed, and none runs.
func TestUpgradedAgentHonoursRecordFiles(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	writeRecordFile(t, recs, 110, `{"run_id": 110, "attempt": 1, "phase": "started"}`+"\n"+
		`{"run_id": 110, "attempt": 1, "phase": "finished", "result": {"attempt": 1, "exit_code": 6, "stdout_tail": "stored\n"}}`+"\n")
	writeRecordFile(t, recs, 111, `{"run_id": 111, "attempt": 1, "task": "task111", "phase": "started"}`+"\n")
	writeRecordFile(t, recs, 112, `{"run_id": 112, "attempt": 1, "pha`)

	start(t, testConfig(t, f, dir))
	failed := f.waitResults(t, 111, 1)[0]
	assert.Contains(t, failed.Error, "interrupted: the agent")
	f.push(work(110, 1, appendCmd(count)), work(111, 1, appendCmd(count)), work(112, 1, appendCmd(count)))
	stored := f.waitResults(t, 110, 1)[0]
	assert.Equal(t, 6, stored.ExitCode)
	assert.Equal(t, "stored\n", stored.StdoutTail)
	assert.Equal(t, failed, f.waitResults(t, 111, 2)[1])
	assert.Contains(t, f.waitResults(t, 112, 1)[0].Error, "record of this run is unreadable")
	assert.Equal(t, 0, countLines(t, count), "none of them runs")
}

// journalLines returns the journal's lines in dir, each checked to be a
// whole record ending with a newline.
func journalLines(t *testing.T, dir string) []string {
	t.Helper()
	data := readFile(t, filepath.Join(dir, daemon.JournalFile))
	require.True(t, strings.HasSuffix(data, "\n"), "the journal ends with a whole line")
	lines := strings.Split(strings.TrimSuffix(data, "\n"), "\n")
	for _, l := range lines {
		var rec daemon.RunRecord
		require.NoError(t, json.Unmarshal([]byte(l), &rec), "line %q", l)
	}
	return lines
}

// writeRecordFile writes a run's record file as agents before the journal
// did, one per attempt.
func writeRecordFile(t *testing.T, recs *daemon.Records, runID int64, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(recs.Dir, 0o700))
	require.NoError(t, os.WriteFile(recs.RunRecordPath(runID, 1), []byte(content), 0o600))
}

// writeJournal writes a journal by hand, as an earlier process left it.
func writeJournal(t *testing.T, dir string, lines []string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, daemon.JournalFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600))
}

func recordLine(t *testing.T, rec daemon.RunRecord) string {
	t.Helper()
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	return string(data)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

// phaseOf returns the phase of the record of a run's first attempt, ""
// when there is none.
func phaseOf(t *testing.T, recs *daemon.Records, runID int64) string {
	t.Helper()
	rec, err := recs.LoadRun(runID, 1)
	require.NoError(t, err)
	if rec == nil {
		return ""
	}
	return rec.Phase
}

func runIDs(recs []*daemon.RunRecord) []int64 {
	var ids []int64
	for _, r := range recs {
		ids = append(ids, r.RunID)
	}
	return ids
}

// A record that cannot be read (an older agent's torn record file, or a
// journal line whose header reads but not the rest) is never read as "not
// run": the run offered is reported failed and not executed, and recorded
// finished with that result, so that offered again it gets the same
// answer (and the unreadable line is no longer its record).
func TestTornRecordNotRun(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	require.NoError(t, os.MkdirAll(recs.Dir, 0o700))
	require.NoError(t, os.WriteFile(recs.RunRecordPath(93, 1), []byte(`{"run_id": 93, "attempt": 1, "pha`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(recs.Dir, daemon.JournalFile),
		[]byte(`{"run_id": 94, "attempt": 1, "phase": "started", "result": "not an object"}`+"\n"), 0o600))
	start(t, testConfig(t, f, dir))
	for _, id := range []int64{93, 94} {
		f.push(work(id, 1, appendCmd(count)))
		res := f.waitResults(t, id, 1)[0]
		assert.False(t, res.Succeeded())
		assert.Contains(t, res.Error, "record of this run is unreadable")
		f.push(work(id, 1, appendCmd(count)))
		assert.Equal(t, res, f.waitResults(t, id, 2)[1], "run %d offered again: the same answer", id)
		rec, err := recs.LoadRun(id, 1)
		require.NoError(t, err)
		assert.Equal(t, daemon.PhaseFinished, rec.Phase)
	}
	assert.Equal(t, 0, countLines(t, count), "not run")
}

// A started record in the journal that cannot be read whole does not keep
// the others from being listed unfinished (and so reported interrupted).
func TestUnfinishedSkipsUnreadableRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	journal := `{"run_id": 5, "attempt": 1, "phase": "started", "result": "not an object"}` + "\n" +
		`{"run_id": 6, "attempt": 1, "phase": "started"}` + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, daemon.JournalFile), []byte(journal), 0o600))
	recs := &daemon.Records{Dir: dir}
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	require.Len(t, unfinished, 1)
	assert.Equal(t, int64(6), unfinished[0].RunID)
	_, err = recs.LoadRun(5, 1)
	assert.Error(t, err, "the unreadable one is an error when its run comes")
}
