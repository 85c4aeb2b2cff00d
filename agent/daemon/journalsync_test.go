package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// countSyncs counts the journal's fdatasyncs for the rest of the test.
func countSyncs(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	fdatasync = func(fd int) error {
		n.Add(1)
		return unix.Fdatasync(fd)
	}
	t.Cleanup(func() { fdatasync = unix.Fdatasync })
	return &n
}

// flakyReporter fails the first fails reports with a retryable error,
// noting how many syncs the journal had when each report came.
type flakyReporter struct {
	fails    int
	syncs    *atomic.Int64
	reports  atomic.Int64
	syncedAt []int64
}

func (r *flakyReporter) Report(context.Context, int64, protocol.RunResult) ([]protocol.WorkItem, error) {
	r.syncedAt = append(r.syncedAt, r.syncs.Load())
	if int(r.reports.Add(1)) <= r.fails {
		return nil, errors.New("connection refused")
	}
	return nil, nil
}

func (r *flakyReporter) RunHeartbeat(context.Context, int64, int) (bool, error) { return false, nil }

// A run's started record is synced before its command; its result is
// synced only when the API does not take it at the first try, before the
// agent waits to try again. Unsynced, it is still there for the next
// process (the page cache keeps it when an agent is killed).
func TestResultSyncedOnlyWhenNotTakenAtOnce(t *testing.T) {
	for name, tc := range map[string]struct {
		fails    int
		syncedAt []int64 // the journal's syncs when each report was sent
	}{
		"taken at once":          {fails: 0, syncedAt: []int64{1}},
		"taken at the third try": {fails: 2, syncedAt: []int64{1, 2, 2}},
	} {
		t.Run(name, func(t *testing.T) {
			syncs := countSyncs(t)
			dir := filepath.Join(t.TempDir(), RecordsDir)
			rep := &flakyReporter{fails: tc.fails, syncs: syncs}
			a := &agent{cfg: Config{RetryMin: time.Millisecond, RetryMax: time.Millisecond},
				log: slog.New(slog.NewTextHandler(io.Discard, nil)), rep: rep, records: &Records{Dir: dir}}
			rec := &RunRecord{RunID: 1, Attempt: 1, Task: "t", Phase: PhaseStarted}
			require.NoError(t, a.records.CreateRun(rec))
			a.finish(context.Background(), a.log, rec, protocol.RunResult{Attempt: 1, ExitCode: 3})

			assert.Equal(t, tc.syncedAt, rep.syncedAt, "the result is synced after the first failed report, before the retry, and only once")
			assert.EqualValues(t, tc.syncedAt[len(tc.syncedAt)-1], syncs.Load())
			got, err := (&Records{Dir: dir}).LoadRun(1, 1)
			require.NoError(t, err)
			require.NotNil(t, got)
			assert.Equal(t, PhaseFinished, got.Phase)
			assert.Equal(t, 3, got.Result.ExitCode)
		})
	}
}

// Sync syncs the journal only when a line was appended unsynced since its
// last sync; a synced append (the next run's started record) covers the
// lines before it.
func TestJournalSyncOnlyWhatIsUnsynced(t *testing.T) {
	syncs := countSyncs(t)
	recs := &Records{Dir: filepath.Join(t.TempDir(), RecordsDir)}
	res := protocol.RunResult{Attempt: 1}
	require.NoError(t, recs.Sync(), "no journal yet")
	require.NoError(t, recs.SaveRunUnsynced(&RunRecord{RunID: 1, Attempt: 1, Phase: PhaseFinished, Result: &res}))
	assert.EqualValues(t, 0, syncs.Load())
	require.NoError(t, recs.Sync())
	require.NoError(t, recs.Sync())
	assert.EqualValues(t, 1, syncs.Load(), "the second Sync had nothing to do")

	require.NoError(t, recs.SaveRunUnsynced(&RunRecord{RunID: 2, Attempt: 1, Phase: PhaseFinished, Result: &res}))
	require.NoError(t, recs.CreateRun(&RunRecord{RunID: 3, Attempt: 1, Phase: PhaseStarted}))
	require.NoError(t, recs.Sync())
	assert.EqualValues(t, 2, syncs.Load(), "the started record's sync covered the result before it")
}

// Any retried request (the log shipped before a report, an ack) makes the
// journal's unsynced results durable before it waits; so does closing it,
// and a journal opened again after a killed process counts as unsynced.
func TestJournalSyncedBeforeAnyWait(t *testing.T) {
	syncs := countSyncs(t)
	dir := filepath.Join(t.TempDir(), RecordsDir)
	a := &agent{cfg: Config{RetryMin: time.Millisecond, RetryMax: time.Millisecond},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), records: &Records{Dir: dir}}
	res := protocol.RunResult{Attempt: 1}
	require.NoError(t, a.records.SaveRunUnsynced(&RunRecord{RunID: 1, Attempt: 1, Phase: PhaseFinished, Result: &res}))
	calls := 0
	err := a.retry(context.Background(), "shipping the log", func(context.Context) error {
		calls++
		if calls == 1 {
			assert.EqualValues(t, 0, syncs.Load())
			return errors.New("connection refused")
		}
		assert.EqualValues(t, 1, syncs.Load(), "synced before the wait")
		return nil
	})
	require.NoError(t, err)

	require.NoError(t, a.records.SaveRunUnsynced(&RunRecord{RunID: 2, Attempt: 1, Phase: PhaseFinished, Result: &res}))
	require.NoError(t, a.records.Close())
	assert.EqualValues(t, 2, syncs.Load(), "Close syncs what is unsynced")

	again := &Records{Dir: dir}
	require.NoError(t, again.Sync(), "no journal open yet")
	_, err = again.LoadRun(1, 1)
	require.NoError(t, err)
	require.NoError(t, again.Sync())
	assert.EqualValues(t, 3, syncs.Load(), "what a killed process left unsynced is synced by the next one")
}
