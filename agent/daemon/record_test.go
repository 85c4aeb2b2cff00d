package daemon_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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

// CreateRun writes a run's first record in place, private and readable; a
// record already there (an earlier agent's "received") is replaced; a torn
// record reads as an error, never as no record.
func TestCreateRunRecord(t *testing.T) {
	recs := &daemon.Records{Dir: filepath.Join(t.TempDir(), daemon.RecordsDir)}
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 90, Attempt: 1, Task: "t", Phase: daemon.PhaseStarted}))
	got, err := recs.LoadRun(90, 1)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, daemon.PhaseStarted, got.Phase)
	assert.Equal(t, os.Getpid(), got.PID)
	st, err := os.Stat(recs.RunRecordPath(90, 1))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 91, Attempt: 1, Phase: daemon.PhaseReceived}))
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 91, Attempt: 1, Phase: daemon.PhaseStarted}))
	got, err = recs.LoadRun(91, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase, "replaced")
	entries, err := os.ReadDir(recs.Dir)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "no temporary file left behind")

	require.NoError(t, os.WriteFile(recs.RunRecordPath(92, 1), []byte(`{"run_id": 92, "attempt": 1, "pha`), 0o600))
	_, err = recs.LoadRun(92, 1)
	assert.Error(t, err, "a torn record is unreadable")
}

// The result is appended to a run's record: the last whole line is the
// record, a torn last line (a crash while it was appended) leaves the one
// before it, and a record an older agent wrote whole (no newline at its
// end) takes an appended line too.
func TestRunRecordAppends(t *testing.T) {
	recs := &daemon.Records{Dir: filepath.Join(t.TempDir(), daemon.RecordsDir)}
	require.NoError(t, recs.CreateRun(&daemon.RunRecord{RunID: 94, Attempt: 1, Phase: daemon.PhaseStarted}))
	res := protocol.RunResult{Attempt: 1, ExitCode: 3}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 94, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
	got, err := recs.LoadRun(94, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseFinished, got.Phase)
	require.NotNil(t, got.Result)
	assert.Equal(t, 3, got.Result.ExitCode)
	entries, err := os.ReadDir(recs.Dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "one file per attempt, nothing renamed")

	// A crash while the result was appended: the run started, and no more.
	path := recs.RunRecordPath(94, 1)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data[:len(data)-10], 0o600))
	got, err = recs.LoadRun(94, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseStarted, got.Phase)
	assert.Nil(t, got.Result)
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	require.Len(t, unfinished, 1)
	assert.Equal(t, int64(94), unfinished[0].RunID)

	// An older agent's record, written whole without a newline.
	require.NoError(t, os.WriteFile(recs.RunRecordPath(95, 1), []byte(`{"run_id": 95, "attempt": 1, "phase": "started"}`), 0o600))
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 95, Attempt: 1, Phase: daemon.PhaseFinished, Result: &res}))
	got, err = recs.LoadRun(95, 1)
	require.NoError(t, err)
	assert.Equal(t, daemon.PhaseFinished, got.Phase)

	// Nothing whole at all is unreadable, as an empty file is.
	require.NoError(t, os.WriteFile(recs.RunRecordPath(96, 1), nil, 0o600))
	_, err = recs.LoadRun(96, 1)
	assert.Error(t, err)
}

// A torn record (a crash while it was first written) is never read as "not
// run": the run offered again is reported failed, and not executed.
func TestTornRecordNotRun(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	require.NoError(t, os.MkdirAll(recs.Dir, 0o700))
	require.NoError(t, os.WriteFile(recs.RunRecordPath(93, 1), []byte(`{"run_id": 93, "attempt": 1, "pha`), 0o600))
	start(t, testConfig(t, f, dir))
	f.push(work(93, 1, appendCmd(count)))
	res := f.waitResults(t, 93, 1)[0]
	assert.False(t, res.Succeeded())
	assert.Contains(t, res.Error, "record of this run is unreadable")
	assert.Equal(t, 0, countLines(t, count), "not run")
}
