package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
)

// fakeBatches is the fake API's batch route (protocol.PathRunResults).
type fakeBatches struct {
	on     bool // the route exists; else 404 without an envelope, as an older API answers
	status int  // answer batches with this status
	posts  []protocol.RunResults
	// ahead holds the runs handed ahead with the answer to a batch whose
	// last result is the key's, for aheadMs; ackAhead, those handed ahead
	// with the answer to the key's ack that asks, which ackCancel answers
	// with cancel too.
	ahead    map[int64][]protocol.WorkItem
	ackAhead map[int64][]protocol.WorkItem
	// pollAhead holds the runs handed ahead with the answer to a poll
	// that asks (protocol.WorkAheadParam) and hands out the key's run,
	// taken as acknowledged then.
	pollAhead map[int64][]protocol.WorkItem
	ackCancel map[int64]bool
	aheadMs   int
	// releaseStatus answers batches that only release runs with this
	// status.
	releaseStatus int
	// resultsAt holds, for each batch posted, how many results the fake
	// had stored before it.
	resultsAt []int
}

func (f *fakeAPI) batchResults(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	f.mu.Lock()
	on := f.batch.on
	f.mu.Unlock()
	if !on {
		http.NotFound(w, r)
		return
	}
	if !f.authorized(w, r) {
		return
	}
	var batch protocol.RunResults
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&batch); err != nil || len(batch.Results)+len(batch.Released) == 0 {
		apiError(w, http.StatusBadRequest, "invalid_input", "not a batch of results")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batch.posts = append(f.batch.posts, batch)
	stored := 0
	for _, res := range f.results {
		stored += len(res)
	}
	f.batch.resultsAt = append(f.batch.resultsAt, stored)
	if st := f.batch.status; st != 0 {
		apiError(w, st, "invalid_input", "batch refused")
		return
	}
	if len(batch.Results) == 0 {
		// It only releases runs.
		if st := f.batch.releaseStatus; st != 0 {
			apiError(w, st, "unavailable", "release refused")
			return
		}
		writeJSON(w, protocol.RunResultResponse{})
		return
	}
	for _, res := range batch.Results {
		f.keepResult(res.RunID, res.RunResult)
	}
	last := batch.Results[len(batch.Results)-1].RunID
	resp := protocol.RunResultResponse{RunID: last, State: "succeeded"}
	if next := f.batch.ahead[last]; len(next) > 0 {
		delete(f.batch.ahead, last)
		resp.NextRunID, resp.Runs, resp.AheadMs = next[0].RunID, next, f.batch.aheadMs
	} else if next := f.handBack[last]; len(next) > 0 {
		delete(f.handBack, last)
		resp.NextRunID, resp.Runs = next[0].RunID, next
	}
	writeJSON(w, resp)
}

// batchPosts returns the batches posted so far.
func (f *fakeAPI) batchPosts() []protocol.RunResults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.RunResults(nil), f.batch.posts...)
}

// waitBatches waits until n batches were posted and returns them.
func (f *fakeAPI) waitBatches(t *testing.T, n int) []protocol.RunResults {
	t.Helper()
	var got []protocol.RunResults
	require.Eventually(t, func() bool { got = f.batchPosts(); return len(got) >= n }, 10*time.Second, 10*time.Millisecond,
		"%d batches", n)
	return got
}

// handAhead has the answer to the batch ending with run after hand items
// ahead for ms milliseconds, taken as acknowledged as the API does.
func (f *fakeAPI) handAhead(after int64, ms int, items ...protocol.WorkItem) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aheadIn(&f.batch.ahead, after, ms, items)
}

// handAheadWithAck has the answer to run after's ack, when it asks, hand
// items ahead for ms milliseconds, taken as acknowledged as the API does;
// with cancel, the answer also says that run after is no longer awaited.
func (f *fakeAPI) handAheadWithAck(after int64, ms int, cancel bool, items ...protocol.WorkItem) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aheadIn(&f.batch.ackAhead, after, ms, items)
	if f.batch.ackCancel == nil {
		f.batch.ackCancel = map[int64]bool{}
	}
	f.batch.ackCancel[after] = cancel
}

// handAheadWithPoll has the answer to a poll that asks and hands out run
// after take it as acknowledged and hand items ahead with it for ms
// milliseconds, as the API does.
func (f *fakeAPI) handAheadWithPoll(after int64, ms int, items ...protocol.WorkItem) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aheadIn(&f.batch.pollAhead, after, ms, items)
}

// aheadIn files items, taken as acknowledged as the API does, in answers
// (one of the batch route's maps) as the runs handed ahead after run
// after, for ms milliseconds. The caller holds mu.
func (f *fakeAPI) aheadIn(answers *map[int64][]protocol.WorkItem, after int64, ms int, items []protocol.WorkItem) {
	for i := range items {
		items[i].Acknowledged = true
	}
	f.batch.on, f.batch.aheadMs = true, ms
	if *answers == nil {
		*answers = map[int64][]protocol.WorkItem{}
	}
	(*answers)[after] = items
}

// pollAnswer answers a poll that asks (protocol.WorkAheadParam) with
// runs: the first taken as acknowledged, with the runs handed ahead after
// it, when handAheadWithPoll set some. The caller holds mu.
func (f *fakeAPI) pollAnswer(runs []protocol.WorkItem) protocol.WorkResponse {
	next := f.batch.pollAhead[runs[0].RunID]
	if len(next) == 0 {
		return protocol.WorkResponse{Runs: runs}
	}
	delete(f.batch.pollAhead, runs[0].RunID)
	runs[0].Acknowledged = true
	return protocol.WorkResponse{Runs: runs, Ahead: next, AheadMs: f.batch.aheadMs}
}

// ackAnswer answers run id's ack. The caller holds mu.
func (f *fakeAPI) ackAnswer(id int64, req protocol.RunAck) protocol.RunAckResponse {
	next := f.batch.ackAhead[id]
	if !req.Ahead || len(next) == 0 {
		return protocol.RunAckResponse{}
	}
	delete(f.batch.ackAhead, id)
	return protocol.RunAckResponse{Cancel: f.batch.ackCancel[id], Runs: next, AheadMs: f.batch.aheadMs}
}

func resultIDs(b protocol.RunResults) []int64 {
	var ids []int64
	for _, r := range b.Results {
		ids = append(ids, r.RunID)
	}
	return ids
}

func releasedIDs(b protocol.RunResults) []int64 {
	var ids []int64
	for _, r := range b.Released {
		ids = append(ids, r.RunID)
	}
	return ids
}

// countCalls counts the requests to path.
func (f *fakeAPI) countCalls(path string) int {
	_, _, calls := f.snapshot()
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, "POST "+path+" ") {
			n++
		}
	}
	return n
}

// Runs handed ahead run one after the other without a report in between,
// and their results (each with the end of its log) go in one batch, in
// the order they ran; they are not acknowledged (their hand-ahead was).
// A single result goes as a batch too, so the answer may hand runs ahead.
func TestAheadRunsReportedInOneBatch(t *testing.T) {
	f := newFakeAPI(t)
	var items []protocol.WorkItem
	for _, id := range []int64{2, 3, 4} {
		it := work(id, 1, "echo out"+string(rune('0'+id)))
		it.LogWithResult = true
		items = append(items, it)
	}
	f.handAhead(1, 10000, items...)
	start(t, testConfig(t, f, t.TempDir()))
	f.push(work(1, 1, "echo first"))

	f.waitResults(t, 4, 1)
	posts := f.waitBatches(t, 2)
	require.Len(t, posts, 2)
	assert.Equal(t, []int64{1}, resultIDs(posts[0]))
	assert.Equal(t, []int64{2, 3, 4}, resultIDs(posts[1]), "one batch, in the order they ran")
	assert.Empty(t, posts[1].Released)
	for i, r := range posts[1].Results {
		assert.True(t, r.Succeeded())
		assert.Equal(t, "out"+string(rune('2'+i))+"\n", r.StdoutTail)
		require.NotNil(t, r.Log, "run %d: the end of its log rides on its result", r.RunID)
		assert.Contains(t, string(r.Log.Data), "out"+string(rune('2'+i)))
	}
	assert.Zero(t, f.countCalls(strings.Replace(protocol.PathRunResult, "%d", "2", 1)))
	f.mu.Lock()
	for _, id := range []int64{1, 2, 3, 4} {
		assert.Zero(t, f.resultPosts[id], "run %d: no single report", id)
	}
	for _, id := range []int64{2, 3, 4} {
		assert.Empty(t, f.acks[id], "run %d: acknowledged by its hand-ahead", id)
	}
	f.mu.Unlock()
}

// The agent stops going on through runs handed ahead after a run that
// failed, left outputs or handed attributes back: the results so far go
// in one batch, and the rest are released, never run. (Once the deadline
// has passed: TestAheadReleasedAtDeadline.)
func TestAheadStopsGoingOn(t *testing.T) {
	for name, tc := range map[string]struct {
		ms       int
		second   func(count string) protocol.WorkItem // run 2
		third    string                               // run 3's command, given the count file; "" runs appendCmd
		reported []int64
		released []int64
	}{
		"failed": {ms: 10000, second: func(c string) protocol.WorkItem { return work(2, 1, appendCmd(c)+"; exit 3") },
			reported: []int64{2}, released: []int64{3, 4}},
		"failed after one that succeeded": {ms: 10000, second: func(c string) protocol.WorkItem { return work(2, 1, appendCmd(c)) },
			third: appendCmd("%s") + "; exit 3", reported: []int64{2, 3}, released: []int64{4}},
		"outputs": {ms: 10000, second: func(c string) protocol.WorkItem {
			return work(2, 1, appendCmd(c)+`; echo k=v > "$ANNEAL_OUTPUTS"`)
		}, reported: []int64{2}, released: []int64{3, 4}},
		"attributes": {ms: 10000, second: func(c string) protocol.WorkItem {
			it := work(2, 1, appendCmd(c)+`; printf '{"a":2}' > "$ANNEAL_ATTRS_OUT"`)
			it.Attrs = json.RawMessage(`{"a":1}`)
			return it
		}, reported: []int64{2}, released: []int64{3, 4}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t)
			count := filepath.Join(t.TempDir(), "count")
			third := appendCmd(count)
			if tc.third != "" {
				third = strings.ReplaceAll(tc.third, "%s", count)
			}
			f.handAhead(1, tc.ms, tc.second(count), work(3, 1, third), work(4, 1, appendCmd(count)))
			start(t, testConfig(t, f, t.TempDir()))
			f.push(work(1, 1, "true"))

			posts := f.waitBatches(t, 2)
			assert.Equal(t, tc.reported, resultIDs(posts[1]))
			assert.Equal(t, tc.released, releasedIDs(posts[1]))
			// Nothing else runs: the next poll finds nothing.
			f.push(work(9, 1, "true"))
			f.waitResults(t, 9, 1)
			assert.Equal(t, len(tc.reported), countLines(t, count), "the released runs never run")
			f.mu.Lock()
			for _, id := range tc.released {
				assert.Empty(t, f.results[id], "run %d", id)
			}
			f.mu.Unlock()
		})
	}
}

// When the ahead window closes while a run handed ahead goes on, the runs
// after it are released at once, in a batch of their own, not when it
// ends: they must not show running in the API all that time. They never
// run; the run's result goes in the next batch. When that release fails,
// they are released with the result, as before.
func TestAheadReleasedAtDeadline(t *testing.T) {
	for name, refused := range map[string]int{"released": 0, "release refused": http.StatusServiceUnavailable} {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.batch.releaseStatus = refused
			count := filepath.Join(t.TempDir(), "count")
			f.handAhead(1, 200, work(2, 1, "sleep 1; "+appendCmd(count)), work(3, 1, appendCmd(count)), work(4, 1, appendCmd(count)))
			start(t, testConfig(t, f, t.TempDir()))
			f.push(work(1, 1, "true"))

			posts := f.waitBatches(t, 2)
			assert.Empty(t, posts[1].Results, "a batch that only releases runs")
			assert.Equal(t, []int64{3, 4}, releasedIDs(posts[1]))
			f.mu.Lock()
			assert.Equal(t, 1, f.batch.resultsAt[1], "sent while run 2 went on, before its result")
			f.mu.Unlock()
			f.waitResults(t, 2, 1)
			posts = f.batchPosts()
			last := posts[len(posts)-1]
			assert.Equal(t, []int64{2}, resultIDs(last))
			if refused == 0 {
				assert.Len(t, posts, 3, "released once")
				assert.Empty(t, last.Released)
			} else {
				assert.Len(t, posts, 2+3, "three tries, then with the result")
				assert.Equal(t, []int64{3, 4}, releasedIDs(last))
			}
			f.push(work(9, 1, "true"))
			f.waitResults(t, 9, 1)
			assert.Equal(t, 1, countLines(t, count), "run 2 only")
		})
	}
}

// ranInOneBatch checks that runs 1, 2 and 3 (each appending its name to
// count) ran once each, in order, and were reported in one batch.
func ranInOneBatch(t *testing.T, f *fakeAPI, count string) {
	t.Helper()
	posts := f.waitBatches(t, 1)
	require.Len(t, posts, 1)
	assert.Equal(t, []int64{1, 2, 3}, resultIDs(posts[0]), "one batch, in the order they ran")
	assert.Empty(t, posts[0].Released)
	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\nthree\n", string(data))
}

// The answer to the ack of a chain's head may hand the chain's next runs
// ahead: they run after it, in order, without being acknowledged, and all
// the results go in one batch. The ack asked for them; an older API that
// refuses the field (and has no batch route) is asked no more, and its
// runs run all the same.
func TestAheadHandedWithAck(t *testing.T) {
	t.Run("handed ahead", func(t *testing.T) {
		f := newFakeAPI(t)
		count := filepath.Join(t.TempDir(), "count")
		f.handAheadWithAck(1, 10000, false, work(2, 1, "echo two >> "+count), work(3, 1, "echo three >> "+count))
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one >> "+count))

		ranInOneBatch(t, f, count)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Equal(t, []bool{true}, f.ackAheads[1], "the ack asked for runs ahead")
		for _, id := range []int64{1, 2, 3} {
			assert.Zero(t, f.resultPosts[id], "run %d: no single report", id)
		}
		for _, id := range []int64{2, 3} {
			assert.Empty(t, f.acks[id], "run %d: acknowledged by its hand-ahead", id)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		// The head is not run: the runs handed ahead with it are released
		// in a batch of their own.
		f := newFakeAPI(t)
		count := filepath.Join(t.TempDir(), "count")
		f.handAheadWithAck(1, 10000, true, work(2, 1, appendCmd(count)), work(3, 1, appendCmd(count)))
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, appendCmd(count)))

		posts := f.waitBatches(t, 1)
		assert.Empty(t, posts[0].Results)
		assert.Equal(t, []int64{2, 3}, releasedIDs(posts[0]))
		f.push(work(9, 1, "true"))
		f.waitResults(t, 9, 1)
		assert.Zero(t, countLines(t, count), "none ran")
	})
	t.Run("older API", func(t *testing.T) {
		f := newFakeAPI(t) // no batch route; refuses "ahead"
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one"), work(2, 1, "echo two"))
		assert.Equal(t, "one\n", f.waitResults(t, 1, 1)[0].StdoutTail)
		f.push(work(3, 1, "echo three"))
		assert.Equal(t, "three\n", f.waitResults(t, 3, 1)[0].StdoutTail)
		assert.Equal(t, "two\n", f.waitResults(t, 2, 1)[0].StdoutTail)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Equal(t, 1, f.ackRefused, "asked once")
		for _, id := range []int64{1, 2, 3} {
			assert.Equal(t, []bool{false}, f.ackAheads[id], "run %d", id)
		}
	})
}

// The answer to a poll may take its run as acknowledged and hand the
// chain's next runs ahead with it (the agent polls asking, as it reports
// batches): no ack is sent for any, they run in order, and all the
// results go in one batch. An agent that finds no batch route asks no
// more.
func TestAheadHandedWithPoll(t *testing.T) {
	t.Run("handed ahead", func(t *testing.T) {
		f := newFakeAPI(t)
		count := filepath.Join(t.TempDir(), "count")
		f.handAheadWithPoll(1, 10000, work(2, 1, "echo two >> "+count), work(3, 1, "echo three >> "+count))
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one >> "+count))

		ranInOneBatch(t, f, count)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.True(t, f.pollAheads[0], "the poll asked")
		for _, id := range []int64{1, 2, 3} {
			assert.Empty(t, f.acks[id], "run %d: no ack", id)
			assert.Zero(t, f.resultPosts[id], "run %d: no single report", id)
		}
	})
	t.Run("late", func(t *testing.T) {
		// The window has passed when the first run ends: the runs ahead
		// are released, never run.
		f := newFakeAPI(t)
		count := filepath.Join(t.TempDir(), "count")
		f.handAheadWithPoll(1, 1, work(2, 1, appendCmd(count)), work(3, 1, appendCmd(count)))
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "sleep 0.2"))
		f.waitResults(t, 1, 1)
		var released []int64
		for _, p := range f.batchPosts() {
			released = append(released, releasedIDs(p)...)
		}
		assert.Equal(t, []int64{2, 3}, released)
		assert.Zero(t, countLines(t, count), "none ran")
	})
	t.Run("older API", func(t *testing.T) {
		f := newFakeAPI(t) // no batch route: its polls hand nothing ahead
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one"))
		f.waitResults(t, 1, 1)
		f.push(work(2, 1, "echo two"))
		f.waitResults(t, 2, 1)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Equal(t, []int{1}, f.acks[1], "acknowledged: the poll's answer did not take it")
		assert.True(t, f.pollAheads[0], "asked before the agent knew")
		assert.False(t, f.pollAheads[len(f.pollAheads)-1], "not once it found no batch route")
	})
}

// An agent stopping while a batch is kept (a run handed ahead going on)
// sends it once, with its interrupted run's result and the rest released.
func TestAheadBatchSentOnStop(t *testing.T) {
	f := newFakeAPI(t)
	f.handAhead(1, 10000, work(2, 1, "true"), work(3, 1, "sleep 30"), work(4, 1, "true"))
	stop, _ := start(t, testConfig(t, f, t.TempDir()))
	f.push(work(1, 1, "true"))
	require.Eventually(t, func() bool { return f.count(f.runHeartbeats, 3) > 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())

	posts := f.batchPosts()
	require.Len(t, posts, 2)
	assert.Equal(t, []int64{2, 3}, resultIDs(posts[1]))
	assert.Equal(t, "cancelled: the agent is stopping", posts[1].Results[1].Error)
	assert.Equal(t, []int64{4}, releasedIDs(posts[1]))
}

// An API without the batch route (404 without an error envelope) gets each
// result on its own, and is not asked again for the life of the process;
// a batch refused otherwise goes again one result at a time, and the next
// result is tried as a batch again.
func TestBatchFallsBackToSingleReports(t *testing.T) {
	t.Run("no route", func(t *testing.T) {
		f := newFakeAPI(t)
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one"), work(2, 1, "echo two"))
		assert.Equal(t, "one\n", f.waitResults(t, 1, 1)[0].StdoutTail)
		assert.Equal(t, "two\n", f.waitResults(t, 2, 1)[0].StdoutTail)
		assert.Equal(t, 1, f.countCalls(protocol.PathRunResults), "asked once")
		assert.Empty(t, f.batchPosts())
	})
	t.Run("refused", func(t *testing.T) {
		f := newFakeAPI(t)
		f.batch.on, f.batch.status = true, http.StatusBadRequest
		start(t, testConfig(t, f, t.TempDir()))
		f.push(work(1, 1, "echo one"))
		assert.Equal(t, "one\n", f.waitResults(t, 1, 1)[0].StdoutTail)
		f.push(work(2, 1, "echo two"))
		assert.Equal(t, "two\n", f.waitResults(t, 2, 1)[0].StdoutTail)
		assert.Equal(t, []int64{1}, resultIDs(f.batchPosts()[0]))
		assert.Len(t, f.batchPosts(), 2, "each result tried as a batch first")
		assert.Equal(t, 1, f.count(f.resultPosts, 1))
		assert.Equal(t, 1, f.count(f.resultPosts, 2))
	})
}

// A journal left by an agent killed while results were kept for a batch
// (finished, report_pending) and a run going on (started) is reported at
// the next start in the journal's order, one result per request (they may
// be different activities' runs); results an older agent wrote (no
// report_pending) are not sent again, nor, after the API took them, are
// these at a later start.
func TestUnreportedResultsSentAtStart(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	recsDir := filepath.Join(dir, daemon.RecordsDir)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	finished := func(id int64, out string, pending bool) string {
		res := protocol.RunResult{Attempt: 1, StdoutTail: out, StartedAt: at, FinishedAt: at}
		return recordLine(t, daemon.RunRecord{RunID: id, Attempt: 1, Task: "t", Phase: daemon.PhaseFinished,
			UpdatedAt: at, Result: &res, ReportPending: pending})
	}
	writeJournal(t, recsDir, []string{
		finished(1, "old\n", false), // an older agent's: reported
		finished(2, "two\n", true),
		// A field this agent does not know (a later agent's) is ignored.
		strings.Replace(recordLine(t, daemon.RunRecord{RunID: 3, Attempt: 1, Task: "t", Phase: daemon.PhaseStarted, UpdatedAt: at}),
			`{`, `{"later_field":1,`, 1),
		finished(4, "four\n", true),
	})
	f.batch.on = true
	stop, _ := start(t, testConfig(t, f, dir))
	posts := f.waitBatches(t, 3)
	require.Len(t, posts, 3)
	for i, id := range []int64{2, 3, 4} {
		assert.Equal(t, []int64{id}, resultIDs(posts[i]), "one at a time, in the order they ran")
	}
	assert.Equal(t, "two\n", posts[0].Results[0].StdoutTail)
	assert.Contains(t, posts[1].Results[0].Error, "interrupted: the agent")
	assert.Equal(t, "four\n", posts[2].Results[0].StdoutTail)
	require.NoError(t, stop())
	f.waitNoPolls(t)

	unreported, err := (&daemon.Records{Dir: recsDir}).Unreported()
	require.NoError(t, err)
	assert.Empty(t, unreported, "marked reported once the API took them")

	cfg := testConfig(t, f, dir)
	cfg.EnrollToken = ""
	start(t, cfg)
	f.push(work(5, 1, "true"))
	f.waitResults(t, 5, 1)
	posts = f.batchPosts()
	require.Len(t, posts, 4)
	assert.Equal(t, []int64{5}, resultIDs(posts[3]), "nothing sent again")
	f.mu.Lock()
	assert.Empty(t, f.results[1])
	f.mu.Unlock()
}

// Results still to be reported are listed in the journal's order, kept by
// compaction however old, and no longer listed once marked reported, by
// the Records that marked them and by a new one.
func TestUnreportedRecords(t *testing.T) {
	dir := filepath.Join(t.TempDir(), daemon.RecordsDir)
	old := time.Now().UTC().Add(-daemon.RecordRetention - time.Hour)
	res := protocol.RunResult{Attempt: 1}
	rec := func(id int64, phase string, pending bool) string {
		r := daemon.RunRecord{RunID: id, Attempt: 1, Phase: phase, UpdatedAt: old, ReportPending: pending}
		if phase == daemon.PhaseFinished {
			r.Result = &res
		}
		return recordLine(t, r)
	}
	writeJournal(t, dir, []string{rec(1, daemon.PhaseFinished, true), rec(2, daemon.PhaseFinished, false),
		rec(3, daemon.PhaseStarted, false), rec(4, daemon.PhaseFinished, true)})
	recs := &daemon.Records{Dir: dir}
	require.NoError(t, recs.Prune(time.Now().Add(-daemon.RecordRetention)))
	assert.Len(t, journalLines(t, dir), 3, "the old reported result goes; the unreported ones stay")
	unreported, err := recs.Unreported()
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 3, 4}, runIDs(unreported))
	unfinished, err := recs.Unfinished()
	require.NoError(t, err)
	assert.Equal(t, []int64{3}, runIDs(unfinished))

	require.NoError(t, recs.MarkReported(unreported[0], unreported[2]))
	assert.Len(t, journalLines(t, dir), 5, "appended again")
	for _, r := range []*daemon.Records{recs, {Dir: dir}} {
		unreported, err := r.Unreported()
		require.NoError(t, err)
		assert.Equal(t, []int64{3}, runIDs(unreported))
		got, err := r.LoadRun(4, 1)
		require.NoError(t, err)
		assert.False(t, got.ReportPending)
		assert.NotNil(t, got.Result)
	}
}

// ReportBatch posts the batch to PathRunResults with the node's token and
// reads the answer, runs handed ahead included.
func TestHTTPReportBatch(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	batch := protocol.RunResults{
		Results: []protocol.RunReport{
			{RunID: 1, RunResult: protocol.RunResult{Attempt: 2, StdoutTail: "a\n", StartedAt: at, FinishedAt: at,
				Log: &protocol.RunLogTail{Offset: 3, Data: []byte("log")}}},
			{RunID: 2, RunResult: protocol.RunResult{Attempt: 1, ExitCode: 4, StartedAt: at, FinishedAt: at}},
		},
		Released: []protocol.RunAttempt{{RunID: 3, Attempt: 1}},
	}
	answer := protocol.RunResultResponse{RunID: 2, State: "failed", NextRunID: 5,
		Runs: []protocol.WorkItem{{RunID: 5, Attempt: 1, Acknowledged: true}}, AheadMs: 500}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, http.MethodPost, r.Method)
		assert.Equal(t, protocol.PathRunResults, r.URL.Path)
		assert.Equal(t, "Bearer tok", r.Header.Get("Authorization"))
		assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
		var got protocol.RunResults
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		assert.NoError(t, dec.Decode(&got))
		assert.Equal(t, batch, got)
		writeJSON(w, answer)
	}))
	defer srv.Close()
	tr := &daemon.HTTPTransport{BaseURL: srv.URL, Token: "tok"}
	resp, err := tr.ReportBatch(context.Background(), batch)
	require.NoError(t, err)
	assert.Equal(t, answer, resp)
}
