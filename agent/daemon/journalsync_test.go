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

// flakyReporter fails the first fails reports with a retryable error.
type flakyReporter struct {
	fails   int
	reports atomic.Int64
}

func (r *flakyReporter) Report(context.Context, int64, protocol.RunResult) ([]protocol.WorkItem, error) {
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
		fails, syncs int
	}{
		"taken at once":          {fails: 0, syncs: 1},
		"taken at the third try": {fails: 2, syncs: 2},
	} {
		t.Run(name, func(t *testing.T) {
			syncs := countSyncs(t)
			dir := filepath.Join(t.TempDir(), RecordsDir)
			rep := &flakyReporter{fails: tc.fails}
			a := &agent{cfg: Config{RetryMin: time.Millisecond, RetryMax: time.Millisecond},
				log: slog.New(slog.NewTextHandler(io.Discard, nil)), rep: rep, records: &Records{Dir: dir}}
			rec := &RunRecord{RunID: 1, Attempt: 1, Task: "t", Phase: PhaseStarted}
			require.NoError(t, a.records.CreateRun(rec))
			a.finish(context.Background(), a.log, rec, protocol.RunResult{Attempt: 1, ExitCode: 3})

			assert.EqualValues(t, tc.fails+1, rep.reports.Load())
			assert.EqualValues(t, tc.syncs, syncs.Load())
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
