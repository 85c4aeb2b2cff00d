package models_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestChainsInTheStore follows a chain of ctl's two runs (setup -> db)
// through the store as the API and the workflow drive it: dispatched
// linked; continued once per report, however often the report comes;
// handed out again from its first unfinished run; and ended when its
// activity is lost, in agreement with what a late report may do.
func TestChainsInTheStore(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	chain := []int64{setup.ID, db.ID}

	first, err := f.Store.DispatchChain(f.Ctx, chain, []byte("token-1"))
	require.NoError(t, err)
	require.Equal(t, setup.ID, first.ID)
	assert.Equal(t, contract.RunRunning, first.State)
	require.NotNil(t, first.ChainNext)
	assert.Equal(t, db.ID, *first.ChainNext)
	var last models.TaskRun
	require.NoError(t, f.Store.DB.Take(&last, db.ID).Error)
	require.NotNil(t, last.ChainHead)
	assert.Equal(t, setup.ID, *last.ChainHead, "linked to its chain")
	assert.Nil(t, last.ChainNext, "the last run of the chain")

	walks := countOutputWalks(t, f)
	setupResult := protocol.RunResult{Attempt: first.Attempt, Outputs: map[string]string{"url": "http://db"}}
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, setupResult, time.Minute)
	require.NoError(t, err)
	assert.True(t, rep.Changed)
	assert.EqualValues(t, 1, walks.Load(), "the outputs its next run sees are read, once")
	next, fresh := rep.Next, rep.Fresh
	require.NotNil(t, next)
	assert.True(t, fresh, "dispatched for the reporting agent")
	assert.Equal(t, db.ID, next.ID)
	assert.Equal(t, 1, next.Attempt)
	assert.Equal(t, "echo db", next.Spec.Cmd, "the whole row, for the work item")
	require.NotNil(t, next.AckedAt, "taken by the reporting agent with the answer: no ack of its own")
	assert.Equal(t, next.ClaimedAt, next.AckedAt)
	// What its work item shows was read with its dispatch, as a poll
	// reads it; its inputs hash covers the outputs of the run before it.
	seen, err := f.Store.RunContextWith(f.Ctx, next, false)
	require.NoError(t, err)
	require.NotNil(t, next.Context)
	assert.Equal(t, seen.Outputs, next.Context.Outputs)
	assert.Equal(t, []models.RunOutputs{{TaskName: "setup", NodeName: storetest.CtlName, Outputs: map[string]string{"url": "http://db"}}}, next.Context.Outputs)
	upstream, err := models.UpstreamOutputsReference(f.Store.DB, next)
	require.NoError(t, err)
	assert.Equal(t, models.InputsHash(next.InputsBase, upstream), next.InputsHash)
	assert.NotEqual(t, models.InputsHash(next.InputsBase, nil), next.InputsHash, "the outputs count")
	offered, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, offered, "taken: never offered to a poll")

	// The report sent again (its answer lost): the same run goes back
	// again, whole, and is no longer the dispatch's to take back.
	rep, err = f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, setupResult, time.Minute)
	require.NoError(t, err)
	assert.False(t, rep.Changed, "the same result")
	again, fresh := rep.Next, rep.Fresh
	require.NotNil(t, again)
	assert.False(t, fresh)
	assert.Equal(t, 1, again.Attempt, "a repeated report dispatches nothing again")
	assert.Equal(t, "echo db", again.Spec.Cmd)
	require.NotNil(t, again.AckedAt)
	assert.Equal(t, again.ClaimedAt, again.AckedAt, "still a hand-back no agent confirmed")
	taken, err := f.Store.TakeBackHandBack(f.Ctx, next)
	require.NoError(t, err)
	assert.False(t, taken, "handed back again: an agent may have it")
	cur := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, []byte("token-1"), cur.TaskToken, "the chain's activity")
	states, err := f.Store.ChainStates(f.Ctx, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunSucceeded, db.ID: contract.RunRunning}, states)

	// The activity is lost with db handed to the agent: db fails with the
	// reason, and its report, should it still come, is refused.
	end, err := f.Store.EndLostChain(f.Ctx, setup.ID, "no result from the node's agent: timeout")
	require.NoError(t, err)
	assert.Empty(t, end.TakenBack)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunSucceeded, db.ID: contract.RunFailed}, end.States)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 1})
	storetest.RequireConflict(t, err)
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunFailed, got.State)
	assert.Equal(t, "no result from the node's agent: timeout", got.Error)

	// Handed out again: the run that succeeded is passed over.
	second, err := f.Store.DispatchChain(f.Ctx, chain, []byte("token-2"))
	require.NoError(t, err)
	require.Equal(t, db.ID, second.ID)
	assert.Equal(t, 2, second.Attempt)
	assert.Equal(t, 1, f.RunsByLabel(t, txn)["setup@"+storetest.CtlName].Attempt, "setup is not run again")

	// Lost again, this time before an agent took db: it is taken back.
	end, err = f.Store.EndLostChain(f.Ctx, setup.ID, "no result from the node's agent: timeout")
	require.NoError(t, err)
	assert.Equal(t, []int64{db.ID}, end.TakenBack)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunSucceeded, db.ID: contract.RunPending}, end.States)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 2})
	storetest.RequireConflict(t, err)
}

// A chain's next run dispatched for the answer to its predecessor's
// report is taken back when its activity turns out cancelled before that
// answer goes out (the API's heartbeatChain), although its hand-back acknowledged it.
func TestHandBackTakenBack(t *testing.T) {
	f, txn, db, next := handBackOfDB(t, time.Minute)
	taken, err := f.Store.TakeBackHandBack(f.Ctx, next)
	require.NoError(t, err)
	assert.True(t, taken)
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunPending, got.State)
	_, err = f.Store.AckRun(f.Ctx, f.Ctl.ID, db.ID, next.Attempt)
	require.NoError(t, err)
	assert.Equal(t, contract.RunPending, f.RunsByLabel(t, txn)["db@"+storetest.CtlName].State, "an ack does not bring it back")
}

// A hand-back whose answer never reached its agent (killed before it read
// it, stopped before it started the run) is offered to the node's polls
// once its lease has passed, still counted as taken; the agent's first
// run heartbeat confirms it, and it is offered no more. A hand-back an
// agent confirmed is not the dispatch's to take back.
func TestHandBackOfferedAgainUntilConfirmed(t *testing.T) {
	const lease = 200 * time.Millisecond
	f, txn, db, next := handBackOfDB(t, lease)
	offered, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
	require.NoError(t, err)
	assert.Empty(t, offered, "not while its lease lasts")
	at, err := f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	assert.False(t, at.IsZero(), "a poll wakes when its lease ends")

	time.Sleep(lease + 50*time.Millisecond)
	offered, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
	require.NoError(t, err)
	require.Len(t, offered, 1)
	assert.Equal(t, db.ID, offered[0].ID)
	assert.Equal(t, next.Attempt, offered[0].Attempt, "the same attempt: the agent's record decides")
	require.NotNil(t, offered[0].AckedAt)
	assert.Equal(t, offered[0].ClaimedAt, offered[0].AckedAt, "still taken: a lost chain fails it rather than run it twice")
	end, err := f.Store.RunDelivery(f.Ctx, db.ID)
	require.NoError(t, err)
	assert.True(t, end.Acked)
	taken, err := f.Store.TakeBackHandBack(f.Ctx, next)
	require.NoError(t, err)
	assert.False(t, taken, "offered again since: an agent may have it")

	// The run's first heartbeat confirms it: offered no more.
	_, err = f.Store.AckRun(f.Ctx, f.Ctl.ID, db.ID, next.Attempt)
	require.NoError(t, err)
	time.Sleep(lease + 50*time.Millisecond)
	offered, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
	require.NoError(t, err)
	assert.Empty(t, offered)
	at, err = f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	assert.True(t, at.IsZero())
	assert.Equal(t, contract.RunRunning, f.RunsByLabel(t, txn)["db@"+storetest.CtlName].State)
}

// handBackOfDB dispatches ctl's chain setup -> db, reports setup, and
// returns db as ReportRun handed it back (its lease lease).
func handBackOfDB(t *testing.T, lease time.Duration) (f *storetest.Fixture, txn *fuel.Transaction, db models.TaskRun, next *models.TaskRun) {
	t.Helper()
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: first.Attempt}, lease)
	require.NoError(t, err)
	require.NotNil(t, rep.Next)
	require.True(t, rep.Fresh)
	return f, txn, db, rep.Next
}

// countOutputWalks counts, from now on, the fixture's reads of the
// outputs a run sees (the walk up its ancestors, loadSeenOutputs).
func countOutputWalks(t *testing.T, f *storetest.Fixture) *atomic.Int64 {
	t.Helper()
	return countStatements(t, f, func(sql string) bool { return strings.Contains(sql, "WITH RECURSIVE ancestors") })
}

// countStatements counts the statements the store sends from now on that
// match (BEGIN and COMMIT aside).
func countStatements(t *testing.T, f *storetest.Fixture, match func(sql string) bool) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	spy := func(db *gorm.DB) {
		if match(db.Statement.SQL.String()) {
			n.Add(1)
		}
	}
	name := fmt.Sprintf("test:statements_%p", &n)
	require.NoError(t, f.Store.DB.Callback().Query().After("gorm:query").Register(name, spy))
	require.NoError(t, f.Store.DB.Callback().Row().After("gorm:row").Register(name+"_row", spy))
	require.NoError(t, f.Store.DB.Callback().Raw().After("gorm:raw").Register(name+"_raw", spy))
	require.NoError(t, f.Store.DB.Callback().Update().After("gorm:update").Register(name+"_update", spy))
	return &n
}

// chainOfSetupAndDB plans the fixture's transaction and dispatches ctl's
// chain setup -> db: the runs, and setup as dispatched.
func chainOfSetupAndDB(t *testing.T) (f *storetest.Fixture, txn *fuel.Transaction, setup, db models.TaskRun, first *models.TaskRun) {
	t.Helper()
	f = storetest.NewFixture(t)
	txn, _ = f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db = runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	first, err := f.Store.DispatchChain(f.Ctx, []int64{setup.ID, db.ID}, []byte("token"))
	require.NoError(t, err)
	return f, txn, setup, db, first
}

// A stop cuts a chain: the API then hands out none of its runs not yet
// started.
func TestChainCut(t *testing.T) {
	f, txn, setup, _, first := chainOfSetupAndDB(t)
	require.NoError(t, f.Store.CutChain(f.Ctx, setup.ID))
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: first.Attempt}, time.Minute)
	require.NoError(t, err)
	assert.Nil(t, rep.Next, "the chain was cut: nothing more is handed out")
	assert.Equal(t, contract.RunPending, f.RunsByLabel(t, txn)["db@"+storetest.CtlName].State)
}

// A chain's runs are found by their head's node and graph (migration 0031
// dropped the index on chain_head): its states, its cut and its end when
// lost see all of them and no other run, also once its node is deleted
// (its runs' node_id NULL) while the chain is out.
func TestChainRunsFoundByTheirHead(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		t.Run(fmt.Sprintf("node deleted %v", deleted), func(t *testing.T) {
			f, txn, setup, db, _ := chainOfSetupAndDB(t)
			if deleted {
				require.NoError(t, f.Store.DB.Exec("UPDATE task_runs SET node_id = NULL WHERE node_id = ?", f.Ctl.ID).Error)
			}
			states, err := f.Store.ChainStates(f.Ctx, setup.ID)
			require.NoError(t, err)
			assert.Equal(t, map[int64]string{setup.ID: contract.RunRunning, db.ID: contract.RunPending}, states)
			other, err := f.Store.ChainStates(f.Ctx, db.ID)
			require.NoError(t, err)
			assert.Empty(t, other, "a run that heads no chain")

			require.NoError(t, f.Store.CutChain(f.Ctx, setup.ID))
			states, err = f.Store.ChainStates(f.Ctx, setup.ID)
			require.NoError(t, err)
			assert.Equal(t, map[int64]string{setup.ID: contract.RunRunning}, states, "the run not yet dispatched is cut off")

			end, err := f.Store.EndLostChain(f.Ctx, setup.ID, "lost")
			require.NoError(t, err)
			assert.Equal(t, map[int64]string{setup.ID: contract.RunPending}, end.States, "not acknowledged: taken back")
			assert.Equal(t, []int64{setup.ID}, end.TakenBack)
			runs := f.RunsByLabel(t, txn)
			assert.Equal(t, contract.RunPending, runs["setup@"+storetest.CtlName].State)
			assert.Nil(t, runs["setup@"+storetest.CtlName].ChainHead, "unlinked")
		})
	}
}

// A report is stored whole or not at all (ReportRun): one refused for its
// log (a chunk past the server's copy) records no result and dispatches
// nothing; the report sent then stores its log, its result and the
// chain's next run together; and one refused for its result (the run
// failed without a report meanwhile) keeps none of the log it carried.
func TestReportRunWholeOrNothing(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	logged := func(runID int64) string {
		data, _, err := f.Store.RunLog(f.Ctx, runID, 1, 0)
		require.NoError(t, err)
		return string(data)
	}

	gap := protocol.RunResult{Attempt: first.Attempt, Log: &protocol.RunLogTail{Offset: 5, Data: []byte("late\n")}}
	_, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, gap, time.Minute)
	var offset *models.LogOffsetError
	require.ErrorAs(t, err, &offset)
	after := f.RunsByLabel(t, txn)
	assert.Equal(t, contract.RunRunning, after["setup@"+storetest.CtlName].State, "no result recorded")
	assert.Equal(t, contract.RunPending, after["db@"+storetest.CtlName].State, "nothing dispatched")

	walks := countOutputWalks(t, f)
	statements := countStatements(t, f, func(string) bool { return true })
	good := protocol.RunResult{Attempt: first.Attempt, Log: &protocol.RunLogTail{Offset: 0, Data: []byte("ran\n")}}
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, good, time.Minute)
	require.NoError(t, err)
	assert.EqualValues(t, 1, statements.Load(), "the log, the result and the next run's dispatch in one statement")
	assert.True(t, rep.Changed)
	assert.Equal(t, contract.RunSucceeded, rep.Run.State)
	require.NotNil(t, rep.Next)
	assert.Equal(t, db.ID, rep.Next.ID)
	assert.Equal(t, "ran\n", logged(setup.ID))
	// No run of the transaction left outputs: the dispatch did not look
	// for them (the lock's probe), and its inputs hash covers none.
	assert.Zero(t, walks.Load(), "the outputs a run sees are not read")
	require.NotNil(t, rep.Next.Context)
	assert.NotNil(t, rep.Next.Context.Outputs)
	assert.Empty(t, rep.Next.Context.Outputs)
	assert.Equal(t, models.InputsHash(rep.Next.InputsBase, nil), rep.Next.InputsHash)
	// Dispatched as the general path dispatches a run handed back: the
	// whole row, its chain's token, a new attempt, taken by the agent.
	next := rep.Next
	assert.Equal(t, contract.RunRunning, next.State)
	assert.Equal(t, 1, next.Attempt)
	assert.Equal(t, []byte("token"), next.TaskToken)
	assert.Equal(t, "echo db", next.Spec.Cmd)
	require.NotNil(t, next.ChainHead)
	assert.Equal(t, setup.ID, *next.ChainHead)
	require.NotNil(t, next.AckedAt)
	assert.Equal(t, next.ClaimedAt, next.AckedAt, "a hand-back, until the agent confirms it")
	assert.NotNil(t, next.StartedAt)
	var leased bool
	require.NoError(t, f.Store.DB.Raw("SELECT lease_until > now() FROM task_runs WHERE id = ?", next.ID).Row().Scan(&leased))
	assert.True(t, leased, "offered again after the lease unless confirmed")

	// The same report with more of the log (a log begun already: the
	// general path, a savepoint inside the report's transaction) stores
	// the rest and changes nothing else.
	more := protocol.RunResult{Attempt: first.Attempt, Log: &protocol.RunLogTail{Offset: 4, Data: []byte("more\n")}}
	again, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, more, time.Minute)
	require.NoError(t, err)
	assert.False(t, again.Changed)
	assert.Equal(t, "ran\nmore\n", logged(setup.ID))

	// The next run failed without a report meanwhile: a late report with
	// a gap in its log is refused for its log first (the agent ships it
	// on its own, then reports again), and then for its result, keeping
	// none of its log.
	require.NoError(t, f.Store.FailRun(f.Ctx, db.ID, "timed out", nil))
	gapLate := protocol.RunResult{Attempt: rep.Next.Attempt, Log: &protocol.RunLogTail{Offset: 5, Data: []byte("late\n")}}
	_, err = f.Store.ReportRun(f.Ctx, f.Ctl.ID, db.ID, gapLate, time.Minute)
	require.ErrorAs(t, err, &offset)
	late := protocol.RunResult{Attempt: rep.Next.Attempt, Log: &protocol.RunLogTail{Offset: 0, Data: []byte("too late\n")}}
	_, err = f.Store.ReportRun(f.Ctx, f.Ctl.ID, db.ID, late, time.Minute)
	var conflict *models.ConflictError
	require.ErrorAs(t, err, &conflict)
	assert.Empty(t, logged(db.ID), "the refused report's log is not kept")
}

// The report's single statement dispatches no run that LCM would skip: a
// chain's next run whose inputs are those of the last run of its task on
// its node, which succeeded, is skipped as ReportRun's general path skips
// it, and the chain ends there.
func TestReportLeavesLCMSkipToTheGeneralPath(t *testing.T) {
	f, _, setup, db, first := chainOfSetupAndDB(t) // forced: both run
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: first.Attempt}, time.Minute)
	require.NoError(t, err)
	require.NotNil(t, rep.Next)
	rep, err = f.Store.ReportRun(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: rep.Next.Attempt}, time.Minute)
	require.NoError(t, err)
	assert.True(t, rep.Changed)
	assert.Nil(t, rep.Next, "the end of the chain")
	// setup's run is made to look failed, so that the next transaction
	// runs it again; db's, which succeeded with the same inputs, stands.
	require.NoError(t, f.Store.DB.Exec("UPDATE task_runs SET state = ? WHERE id = ?", contract.RunFailed, setup.ID).Error)

	txn := f.Execute(t, fuel.ExecuteInput{}) // LCM applies
	_, err = f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	runs := f.RunsByLabel(t, txn)
	setup2, db2 := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	first, err = f.Store.DispatchChain(f.Ctx, []int64{setup2.ID, db2.ID}, []byte("token-2"))
	require.NoError(t, err)
	require.Equal(t, setup2.ID, first.ID, "setup runs again")
	rep, err = f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup2.ID, protocol.RunResult{Attempt: first.Attempt}, time.Minute)
	require.NoError(t, err)
	assert.True(t, rep.Changed)
	assert.Nil(t, rep.Next, "db is skipped, and the chain ends")
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunSkipped, got.State)
	assert.Equal(t, models.InputsHash(got.InputsBase, nil), got.InputsHash)
}

// A report whose log was begun by a log request (a long run's) and which
// carries it again from its start: the one statement records the result
// and goes on with the chain, and the log, which has a row already, is
// stored the general way, idempotent by offset (nothing twice).
func TestReportAfterALogRequest(t *testing.T) {
	f, _, setup, db, first := chainOfSetupAndDB(t)
	_, err := f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, 0, []byte("ran\n"))
	require.NoError(t, err)
	rep, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID,
		protocol.RunResult{Attempt: first.Attempt, Log: &protocol.RunLogTail{Offset: 0, Data: []byte("ran\nmore\n")}}, time.Minute)
	require.NoError(t, err)
	assert.True(t, rep.Changed)
	require.NotNil(t, rep.Next)
	assert.Equal(t, db.ID, rep.Next.ID)
	data, _, err := f.Store.RunLog(f.Ctx, setup.ID, first.Attempt, 0)
	require.NoError(t, err)
	assert.Equal(t, "ran\nmore\n", string(data), "the rest of the log, once")
}

// A run a poll claims knows whether its transaction has left outputs yet:
// its work item's context spares the walk up its ancestors while none
// has, and walks (and finds them) once one has.
func TestClaimedRunKnowsWhetherOutputsWereLeft(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]

	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	walks := countOutputWalks(t, f)
	claimed, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	rc, err := f.Store.RunContextWith(f.Ctx, &claimed[0], false)
	require.NoError(t, err)
	assert.Empty(t, rc.Outputs)
	assert.Zero(t, walks.Load(), "no outputs in the transaction: no walk")

	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID,
		protocol.RunResult{Attempt: claimed[0].Attempt, Outputs: map[string]string{"url": "http://db"}})
	require.NoError(t, err)
	_, err = f.Store.DispatchRun(f.Ctx, db.ID, []byte("token-2"))
	require.NoError(t, err)
	walks = countOutputWalks(t, f)
	claimed, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, db.ID, claimed[0].ID)
	rc, err = f.Store.RunContextWith(f.Ctx, &claimed[0], false)
	require.NoError(t, err)
	assert.EqualValues(t, 1, walks.Load(), "outputs left: walked once")
	assert.Equal(t, []models.RunOutputs{{TaskName: "setup", NodeName: storetest.CtlName, Outputs: map[string]string{"url": "http://db"}}}, rc.Outputs)
}

// A batch of reports (ReportRuns) is one statement that records the
// results and hands the chain's next run ahead; a batch sent again
// (its answer lost) releasing the run handed ahead takes it back, and the
// chain goes on with it at a new attempt.
func TestReportRunsHandsAheadAndReleases(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	ok := protocol.RunReport{RunID: setup.ID, RunResult: protocol.RunResult{Attempt: first.Attempt,
		Log: &protocol.RunLogTail{Data: []byte("setup ran\n")}}}

	statements := countStatements(t, f, func(string) bool { return true })
	rep, err := f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{ok}}, time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.EqualValues(t, 1, statements.Load(), "one statement: the result, its log and the dispatch ahead")
	assert.True(t, rep.Changed)
	require.NotNil(t, rep.Next)
	assert.True(t, rep.Fresh)
	assert.Equal(t, db.ID, rep.Next.ID)
	assert.Equal(t, 1, rep.Next.Attempt)
	assert.Empty(t, rep.Ahead, "the chain has no run after db")
	require.NotNil(t, rep.Next.AckedAt)
	assert.Equal(t, rep.Next.ClaimedAt, rep.Next.AckedAt, "handed back: taken by the agent")
	data, _, err := f.Store.RunLog(f.Ctx, setup.ID, 1, 0)
	require.NoError(t, err)
	assert.Equal(t, "setup ran\n", string(data))

	// Sent again, releasing db: db goes back to pending at attempt 0 and
	// is dispatched again at attempt 1, which the agent never started.
	again := protocol.RunResults{Results: []protocol.RunReport{ok}, Released: []protocol.RunAttempt{{RunID: db.ID, Attempt: 1}}}
	rep, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, again, time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.False(t, rep.Changed, "the same result")
	require.NotNil(t, rep.Next)
	assert.True(t, rep.Fresh, "released, then dispatched again")
	assert.Equal(t, 2, rep.Next.Attempt, "an attempt of its own: a late release cannot take it back")

	// db fails: the chain ends, its states are the runs'.
	rep, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{
		{RunID: db.ID, RunResult: protocol.RunResult{Attempt: 2, ExitCode: 3}}}}, time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Nil(t, rep.Next)
	states, err := f.Store.ChainStates(f.Ctx, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunSucceeded, db.ID: contract.RunFailed}, states)
	assert.Equal(t, 3, *f.RunsByLabel(t, txn)["db@"+storetest.CtlName].ExitCode)

	// A batch naming a run of another node, or no result, writes nothing.
	_, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{}, time.Minute, 1)
	storetest.RequireInput(t, err, "results")
	_, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{ok},
		Released: []protocol.RunAttempt{{RunID: db.ID}}}, time.Minute, 1)
	storetest.RequireInput(t, err, "released[0].attempt")
}

// A stop cuts a chain whose next run was handed ahead: the run may still
// start (bounded by the ahead window); released, it goes back to pending,
// stays in the chain's outcome, and the chain hands out nothing more.
func TestChainCutWithARunHandedAhead(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	ok := protocol.RunReport{RunID: setup.ID, RunResult: protocol.RunResult{Attempt: first.Attempt}}
	rep, err := f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{ok}}, time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	require.NotNil(t, rep.Next)
	require.Equal(t, db.ID, rep.Next.ID)

	require.NoError(t, f.Store.CutChain(f.Ctx, setup.ID))
	assert.Equal(t, contract.RunRunning, f.RunsByLabel(t, txn)["db@"+storetest.CtlName].State, "handed ahead: left to the agent")
	rep, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{ok},
		Released: []protocol.RunAttempt{{RunID: db.ID, Attempt: 1}}}, time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Nil(t, rep.Next, "cut: db is not handed out again")
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunPending, got.State)
	assert.Equal(t, 1, got.Attempt, "the attempt it was handed ahead at stays counted")
	states, err := f.Store.ChainStates(f.Ctx, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunSucceeded, db.ID: contract.RunPending}, states)
}

// An acknowledgement that asks for them gets the chain's next runs handed
// ahead (HandAhead), in one statement; a batch with no result releases
// them.
func TestHandAheadAtTheAck(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	const short = 100 * time.Millisecond
	none, err := f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, time.Minute, short, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Empty(t, none, "the graph's first run on the node: no short run before it")
	finishedBefore(t, f, db.ID, 10*time.Millisecond)
	none, err = f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, time.Minute, 5*time.Millisecond, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Empty(t, none, "after a run longer than short")

	statements := countStatements(t, f, func(string) bool { return true })
	ahead, err := f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, time.Minute, short, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.EqualValues(t, 1, statements.Load())
	require.Len(t, ahead, 1)
	assert.Equal(t, db.ID, ahead[0].ID)
	assert.Equal(t, 1, ahead[0].Attempt)
	assert.Equal(t, "echo db", ahead[0].Spec.Cmd, "the whole row, for the work item")
	again, err := f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, time.Minute, short, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Empty(t, again, "handed ahead once")
	none, err = f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt+1, time.Minute, short, models.MaxAheadRuns)
	require.NoError(t, err)
	assert.Empty(t, none, "another attempt")

	_, err = f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Released: []protocol.RunAttempt{{RunID: db.ID, Attempt: 1}}}, time.Minute, 1)
	require.NoError(t, err)
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunPending, got.State, "released")
	assert.Equal(t, 1, got.Attempt)
	assert.Equal(t, contract.RunRunning, f.RunsByLabel(t, txn)["setup@"+storetest.CtlName].State, "the run going on is untouched")
}

// A chain that ends on a report (a failure) while runs are still handed
// ahead after it, unconfirmed (the agent that had them restarted and
// reported the failure), takes them back before its outcome is read:
// no poll offers them after the run before them failed.
func TestEndChainTakesBackRunsHandedAhead(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	handDBAhead(t, f, setup, db, first, time.Minute)
	_, err := f.Store.ReportRuns(f.Ctx, f.Ctl.ID, protocol.RunResults{Results: []protocol.RunReport{
		{RunID: setup.ID, RunResult: protocol.RunResult{Attempt: first.Attempt, ExitCode: -1, Error: "interrupted"}}}}, time.Minute, 1)
	require.NoError(t, err)
	states, err := f.Store.EndChain(f.Ctx, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{setup.ID: contract.RunFailed, db.ID: contract.RunPending}, states)
	got := f.RunsByLabel(t, txn)["db@"+storetest.CtlName]
	assert.Equal(t, contract.RunPending, got.State)
	assert.Equal(t, 1, got.Attempt)
	offered, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, offered, "pending, not offered")
}

// handDBAhead hands db ahead with setup's ack (a short run of the node
// finished first), at lease, and returns what was handed ahead: db.
func handDBAhead(t *testing.T, f *storetest.Fixture, setup, db models.TaskRun, first *models.TaskRun, lease time.Duration) []models.TaskRun {
	t.Helper()
	finishedBefore(t, f, db.ID, 10*time.Millisecond)
	ahead, err := f.Store.HandAhead(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt, lease, 100*time.Millisecond, models.MaxAheadRuns)
	require.NoError(t, err)
	require.Len(t, ahead, 1)
	return ahead
}

// finishedBefore adds a run to the node and graph of run like that
// finished a second ago after took: what HandAhead looks at.
func finishedBefore(t *testing.T, f *storetest.Fixture, like int64, took time.Duration) {
	t.Helper()
	require.NoError(t, f.Store.DB.Exec(`INSERT INTO task_runs
SELECT (jsonb_populate_record(NULL::task_runs, to_jsonb(t) || jsonb_build_object('id', nextval('task_runs_id_seq'),
  'task_name', 'warmup', 'state', 'succeeded', 'chain_head', NULL, 'chain_next', NULL,
  'started_at', now() - interval '1 s' - make_interval(secs => ?), 'finished_at', now() - interval '1 s'))).*
FROM task_runs t WHERE id = ?`, took.Seconds(), like).Error)
}

// A poll offers a run handed ahead whose lease ran out only once the run
// before it in its chain ended well: the agent that had it may be gone,
// and a poll's runs run whatever became of the one before.
func TestPollOffersNoRunAheadOfItsPredecessor(t *testing.T) {
	f, _, setup, db, first := chainOfSetupAndDB(t)
	_, err := f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, first.Attempt)
	require.NoError(t, err)
	handDBAhead(t, f, setup, db, first, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // its lease runs out
	offered, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, offered, "setup has not ended: db is not offered")
	next, err := f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	assert.True(t, next.IsZero(), "nor is a time to offer it (no busy long poll)")

	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: first.Attempt})
	require.NoError(t, err)
	offered, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Millisecond)
	require.NoError(t, err)
	require.Len(t, offered, 1, "setup succeeded: db is offered again, as a lost hand-back")
	assert.Equal(t, db.ID, offered[0].ID)
	assert.Equal(t, 1, offered[0].Attempt, "the same attempt")
}

// Runs handed ahead together whose answer does not go out are taken back
// in one statement (TakeBackHandBacks), as long as no agent confirmed
// them.
func TestTakeBackRunsHandedAhead(t *testing.T) {
	f, txn, setup, db, first := chainOfSetupAndDB(t)
	ahead := handDBAhead(t, f, setup, db, first, time.Minute)
	statements := countStatements(t, f, func(string) bool { return true })
	n, err := f.Store.TakeBackHandBacks(f.Ctx, ahead)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	assert.EqualValues(t, 1, statements.Load())
	assert.Equal(t, contract.RunPending, f.RunsByLabel(t, txn)["db@"+storetest.CtlName].State)
	n, err = f.Store.TakeBackHandBacks(f.Ctx, ahead)
	require.NoError(t, err)
	assert.Zero(t, n, "taken back already")
}

// The hand-ahead walk reads only its node's unfinished runs, whatever the
// statistics say: analyzed while nearly every run was finished (an idle
// site), then with thousands of runs pending on other nodes, the generic
// plan had scanned task_runs_node_unfinished_idx whole at each step of
// the walk and for the update (26 to 63 ms a call in the bench's later
// rounds, against 0.17 in its first).
func TestHandAheadReadsOnlyItsNodesRuns(t *testing.T) {
	f, _, setup, db, first := chainOfSetupAndDB(t)
	finishedBefore(t, f, db.ID, 10*time.Millisecond)
	other, _, err := f.Store.CreateNode(f.Ctx, models.NodeInput{Name: "busy-elsewhere.anneal.test"}, true)
	require.NoError(t, err)
	require.NoError(t, f.Store.DB.Exec(`INSERT INTO task_runs
SELECT (jsonb_populate_record(NULL::task_runs, to_jsonb(t) || jsonb_build_object('id', nextval('task_runs_id_seq'),
  'node_id', ?::bigint, 'task_name', 'other-' || i, 'state', 'succeeded', 'chain_head', NULL, 'chain_next', NULL,
  'finished_at', now()))).*
FROM task_runs t, generate_series(1, 3000) i WHERE t.id = ?`, other.ID, db.ID).Error)
	require.NoError(t, f.Store.DB.Exec("ANALYZE task_runs").Error)
	require.NoError(t, f.Store.DB.Exec("UPDATE task_runs SET state = 'pending', finished_at = NULL WHERE node_id = ?", other.ID).Error)

	sql, params := models.HandAheadStatement()
	types := map[string]string{"run": "bigint", "node": "bigint", "attempt": "int", "ahead": "int", "lease": "float8", "short": "float8"}
	values := map[string]string{"run": fmt.Sprint(setup.ID), "node": fmt.Sprint(f.Ctl.ID), "attempt": fmt.Sprint(first.Attempt),
		"ahead": fmt.Sprint(models.MaxAheadRuns), "lease": "60", "short": "0.1"}
	var typeList, valueList []string
	for _, p := range params {
		require.Contains(t, types, p, "a parameter this test does not know")
		typeList, valueList = append(typeList, types[p]), append(valueList, values[p])
	}
	plan := storetest.ExplainGeneric(t, f.Store.DB, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)", sql,
		"("+strings.Join(typeList, ", ")+")", "("+strings.Join(valueList, ", ")+")")
	text := strings.Join(plan, "\n")
	for i, line := range plan {
		if strings.Contains(line, "task_runs_node_unfinished_idx") && !strings.Contains(line, "never executed") {
			require.Less(t, i+1, len(plan))
			assert.Contains(t, plan[i+1], "Index Cond: (node_id = ", "a scan of every node's unfinished runs:\n%s", text)
		}
	}
	var state string
	require.NoError(t, f.Store.DB.Raw("SELECT state FROM task_runs WHERE id = ?", db.ID).Scan(&state).Error)
	assert.Equal(t, contract.RunRunning, state, "db handed ahead by the statement explained")
}
