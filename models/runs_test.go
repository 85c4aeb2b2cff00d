package models_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
)

func TestCreateTransactionValidation(t *testing.T) {
	f := newFixture(t)
	noop := func(*models.Transaction) error { return nil }
	ghost, _, err := f.store.CreateNode(f.ctx, models.NodeInput{Name: "ghost.anneal.test"}, true)
	require.NoError(t, err)

	tests := []struct {
		name  string
		in    models.ExecuteInput
		field string
	}{
		{"no deployment", models.ExecuteInput{Graphs: []models.GraphRequest{{Type: "deployment"}}}, "deployment"},
		{"unknown deployment", models.ExecuteInput{Deployment: "nope", Graphs: []models.GraphRequest{{Type: "deployment"}}}, "deployment"},
		{"no graphs", models.ExecuteInput{Deployment: "prod"}, "graphs"},
		{"no type", models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{}}}, "graphs[0].type"},
		{"unknown type", models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{Type: "deployment"}, {Type: "nope"}}}, "graphs[1].type"},
		{"unknown task", models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{Type: "deployment", Tasks: []string{"db", "nope"}}}}, "graphs[0].tasks[1]"},
		{"node of another deployment", models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{Type: "deployment", Nodes: []int64{f.ctl.ID, ghost.ID}}}}, "graphs[0].nodes[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.store.CreateTransaction(f.ctx, tt.in, noop)
			requireInput(t, err, tt.field)
		})
	}

	// A failing start rolls the transaction back.
	boom := errors.New("temporal is down")
	_, err = f.store.CreateTransaction(f.ctx, models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{Type: "deployment"}}},
		func(*models.Transaction) error { return boom })
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, count(t, f.store, &models.Transaction{}))

	var started *models.Transaction
	txn, err := f.store.CreateTransaction(f.ctx, models.ExecuteInput{Deployment: "prod", Graphs: []models.GraphRequest{{Type: "deployment"}}, Force: true},
		func(tx *models.Transaction) error { started = tx; return nil })
	require.NoError(t, err)
	assert.Same(t, txn, started)
	assert.Equal(t, models.TxPending, txn.Status)
	assert.Equal(t, "tx-"+txn.ID.String(), txn.WorkflowID)
	assert.Equal(t, f.dep.ID, txn.DeploymentID)
	loaded, err := f.store.Transaction(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.True(t, loaded.Force)
	assert.Equal(t, []models.GraphRequest{{Type: "deployment"}}, loaded.Graphs)
	_, err = f.store.Transaction(f.ctx, uuid.New())
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestPlanGraph(t *testing.T) {
	f := newFixture(t)
	txn, gp := f.plan(t)
	want := &models.GraphPlan{
		GraphType: "deployment",
		// ctl first: nova on cmp waits for db on ctl.
		Nodes: []models.PlannedNode{
			{ID: f.ctl.ID, Name: ctlName, Runs: 2},
			{ID: f.cmp.ID, Name: cmpName, Runs: 2},
		},
		Runs:             4,
		MaxNodesInFlight: models.DefaultMaxNodesInFlight,
		FailureThreshold: ptr(models.DefaultFailureThreshold),
	}
	assert.Equal(t, want, gp)
	assert.EqualValues(t, 4, count(t, f.store, &models.TaskRun{}))
	assert.EqualValues(t, 3, count(t, f.store, &models.RunEdge{}))

	loaded, err := f.store.Transaction(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, models.TxRunning, loaded.Status)
	require.NotNil(t, loaded.StartedAt)

	runs := f.runsByLabel(t, txn)
	require.Len(t, runs, 4)
	setup := runs["setup@"+ctlName]
	assert.Equal(t, models.RunPending, setup.State)
	assert.Equal(t, "shell", setup.TaskType)
	assert.Equal(t, models.RunSpec{Jig: models.JigAgent, Cmd: "echo setup", TimeoutSec: 30, Retries: 2}, setup.Spec)
	assert.Equal(t, models.DefaultTaskTimeoutSec, runs["db@"+ctlName].Spec.TimeoutSec)
	assert.Less(t, runs["db@"+ctlName].Position, runs["nova@"+cmpName].Position, "plan order is topological")

	// Planning again (an activity retry) returns the same plan and writes nothing.
	again, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.Equal(t, want, again)
	assert.EqualValues(t, 4, count(t, f.store, &models.TaskRun{}))
	assert.EqualValues(t, 3, count(t, f.store, &models.RunEdge{}))
	loaded2, err := f.store.Transaction(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, loaded.StartedAt, loaded2.StartedAt, "a retry does not restart the transaction")

	_, err = f.store.PlanGraph(f.ctx, txn.ID, 1)
	assert.Error(t, err)
	_, err = f.store.PlanGraph(f.ctx, uuid.New(), 0)
	assert.ErrorIs(t, err, models.ErrNotFound)

	// Runs filters by node name or id and by state.
	mine, err := f.store.Runs(f.ctx, txn.ID, models.RunFilter{Node: cmpName})
	require.NoError(t, err)
	assert.Len(t, mine, 2)
	const ghostName = "ghost.anneal.test"
	mine, err = f.store.Runs(f.ctx, txn.ID, models.RunFilter{Node: ghostName, State: models.RunPending})
	require.NoError(t, err)
	assert.Empty(t, mine)
	_, err = f.store.Runs(f.ctx, uuid.New(), models.RunFilter{})
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestPlanGraphFiltersAndDryRun(t *testing.T) {
	f := newFixture(t)
	txn := f.execute(t, models.ExecuteInput{DryRun: true, Graphs: []models.GraphRequest{
		{Type: "deployment", Nodes: []int64{f.ctl.ID}},
		{Type: "provision"},
	}})
	gp, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.True(t, gp.DryRun)
	assert.Equal(t, 2, gp.Runs)
	require.Len(t, gp.Nodes, 1)
	assert.Equal(t, ctlName, gp.Nodes[0].Name)

	gp, err = f.store.PlanGraph(f.ctx, txn.ID, 1)
	require.NoError(t, err)
	assert.Equal(t, "provision", gp.GraphType)
	assert.Equal(t, 2, gp.Runs, "the noop task selects every node")

	runs, err := f.store.Runs(f.ctx, txn.ID, models.RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 4)
	for _, r := range runs {
		assert.Equal(t, models.RunPlanned, r.State, "a dry run only records its plan")
	}
	assert.Equal(t, 0, runs[0].GraphIndex)
	assert.Equal(t, 1, runs[3].GraphIndex)

	np, err := f.store.NodePlan(f.ctx, txn.ID, 1, f.cmp.ID)
	require.NoError(t, err)
	require.Len(t, np.Runs, 1)
	assert.True(t, np.Runs[0].NoOp)

	st, err := f.store.FinishTransaction(f.ctx, txn.ID, false, "")
	require.NoError(t, err)
	assert.Equal(t, models.TxReady, st.Status)
	assert.Equal(t, 100, st.Progress)
	assert.Equal(t, map[string]int{models.RunPlanned: 4}, st.Counts)
}

func TestNodePlan(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	runs := f.runsByLabel(t, txn)
	setupCtl, db := runs["setup@"+ctlName], runs["db@"+ctlName]
	setupCmp, nova := runs["setup@"+cmpName], runs["nova@"+cmpName]

	cmp, err := f.store.NodePlan(f.ctx, txn.ID, 0, f.cmp.ID)
	require.NoError(t, err)
	require.Len(t, cmp.Runs, 2)
	assert.Equal(t, models.NodeRun{ID: setupCmp.ID, Task: "setup", State: models.RunPending, TimeoutSec: 30, Retries: 2}, cmp.Runs[0])
	assert.Equal(t, models.NodeRun{
		ID: nova.ID, Task: "nova", State: models.RunPending, TimeoutSec: models.DefaultTaskTimeoutSec,
		Parents: []int64{setupCmp.ID}, Remote: []int64{db.ID},
	}, cmp.Runs[1])
	assert.Equal(t, map[int64]string{db.ID: models.RunPending}, cmp.RemoteStates)

	ctl, err := f.store.NodePlan(f.ctx, txn.ID, 0, f.ctl.ID)
	require.NoError(t, err)
	require.Len(t, ctl.Runs, 2)
	assert.Equal(t, setupCtl.ID, ctl.Runs[0].ID)
	assert.Empty(t, ctl.Runs[0].Parents)
	assert.Equal(t, []int64{setupCtl.ID}, ctl.Runs[1].Parents, "a local edge is listed once")
	assert.Empty(t, ctl.Runs[1].Remote)
	assert.Equal(t, []models.Peer{{RunID: nova.ID, Node: cmpName}}, ctl.Runs[1].RemoteKids)
	assert.Empty(t, ctl.RemoteStates)

	// A node workflow started late learns what its remote parents did.
	require.NoError(t, f.store.SucceedNoOp(f.ctx, db.ID))
	cmp, err = f.store.NodePlan(f.ctx, txn.ID, 0, f.cmp.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{db.ID: models.RunSucceeded}, cmp.RemoteStates)
	states, err := f.store.RunStates(f.ctx, []int64{db.ID, nova.ID})
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{db.ID: models.RunSucceeded, nova.ID: models.RunPending}, states)

	none, err := f.store.NodePlan(f.ctx, txn.ID, 0, f.ctl.ID+f.cmp.ID+100)
	require.NoError(t, err)
	assert.Empty(t, none.Runs)
}

func TestDispatchAndClaim(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	setup := f.runsByLabel(t, txn)["setup@"+ctlName]

	empty, err := f.store.ClaimWork(f.ctx, f.ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, empty, "pending runs are not handed out")

	run, err := f.store.DispatchRun(f.ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	assert.Equal(t, setup.ID, run.ID)

	claimed, err := f.store.ClaimWork(f.ctx, f.ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.Equal(t, setup.ID, claimed[0].ID)
	assert.Equal(t, models.RunRunning, claimed[0].State)
	assert.Equal(t, 1, claimed[0].Attempt)
	assert.Equal(t, "echo setup", claimed[0].Spec.Cmd)
	assert.Equal(t, []byte("token-1"), claimed[0].TaskToken)
	assert.NotNil(t, claimed[0].ClaimedAt)

	again, err := f.store.ClaimWork(f.ctx, f.ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, again, "a run is handed out once per attempt")
	other, err := f.store.ClaimWork(f.ctx, f.cmp.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, other, "another node's run is not its work")

	// A retried activity dispatches a new attempt: the agent gets it again.
	_, err = f.store.DispatchRun(f.ctx, setup.ID, []byte("token-2"))
	require.NoError(t, err)
	claimed, err = f.store.ClaimWork(f.ctx, f.ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.Equal(t, 2, claimed[0].Attempt)
	assert.Equal(t, []byte("token-2"), claimed[0].TaskToken)

	// Once it succeeded, a further dispatch returns it untouched.
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: 2})
	require.NoError(t, err)
	run, err = f.store.DispatchRun(f.ctx, setup.ID, []byte("token-3"))
	require.NoError(t, err)
	assert.Equal(t, models.RunSucceeded, run.State)
	assert.Equal(t, 2, run.Attempt)
	claimed, err = f.store.ClaimWork(f.ctx, f.ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, claimed)

	_, err = f.store.DispatchRun(f.ctx, setup.ID+1000, nil)
	assert.ErrorIs(t, err, models.ErrNotFound)

	mine, err := f.store.AgentRun(f.ctx, f.ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, setup.ID, mine.ID)
	_, err = f.store.AgentRun(f.ctx, f.cmp.ID, setup.ID)
	assert.ErrorIs(t, err, models.ErrForbidden)
	_, err = f.store.AgentRun(f.ctx, f.ctl.ID, setup.ID+1000)
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestRecordRunResult(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	runs := f.runsByLabel(t, txn)
	setup, db := runs["setup@"+ctlName], runs["db@"+ctlName]

	_, err := f.store.DispatchRun(f.ctx, setup.ID, nil)
	require.NoError(t, err)

	ok := protocol.RunResult{Attempt: 1, StdoutTail: "done\x00", Outputs: map[string]string{"url": "http://x\x00"}}
	_, err = f.store.RecordRunResult(f.ctx, f.cmp.ID, setup.ID, ok)
	assert.ErrorIs(t, err, models.ErrForbidden, "another node's run")
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: 2})
	requireConflict(t, err)
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID+1000, ok)
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, db.ID, protocol.RunResult{Attempt: 1})
	requireConflict(t, err) // pending, not running

	rec, err := f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, ok)
	require.NoError(t, err)
	assert.True(t, rec.Changed)
	assert.Equal(t, models.RunSucceeded, rec.Run.State)

	loaded, err := f.store.AgentRun(f.ctx, f.ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, models.RunSucceeded, loaded.State)
	require.NotNil(t, loaded.ExitCode)
	assert.Equal(t, 0, *loaded.ExitCode)
	assert.Equal(t, "done", loaded.StdoutTail, "NUL bytes are stripped")
	assert.Equal(t, map[string]string{"url": "http://x"}, loaded.Outputs)
	assert.NotNil(t, loaded.FinishedAt)

	// The agent reporting again (a lost answer) changes nothing.
	rec, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 9})
	require.NoError(t, err)
	assert.False(t, rec.Changed)
	assert.Equal(t, models.RunSucceeded, rec.Run.State)

	// A failure by exit code and one by error message.
	_, err = f.store.DispatchRun(f.ctx, db.ID, nil)
	require.NoError(t, err)
	rec, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, db.ID, protocol.RunResult{Attempt: 1, ExitCode: 3})
	require.NoError(t, err)
	assert.True(t, rec.Changed)
	assert.Equal(t, models.RunFailed, rec.Run.State)
	nova := runs["nova@"+cmpName]
	_, err = f.store.DispatchRun(f.ctx, nova.ID, nil)
	require.NoError(t, err)
	rec, err = f.store.RecordRunResult(f.ctx, f.cmp.ID, nova.ID, protocol.RunResult{Attempt: 1, Error: "timed out"})
	require.NoError(t, err)
	assert.Equal(t, models.RunFailed, rec.Run.State)

	st, err := f.store.TransactionStatus(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, "prod", st.Deployment)
	assert.Equal(t, 4, st.Total)
	assert.Equal(t, 75, st.Progress)
	assert.ElementsMatch(t, []string{"db@" + ctlName + ": exit code 3", "nova@" + cmpName + ": timed out"}, st.FailedRuns)
}

func TestFailRun(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	runs := f.runsByLabel(t, txn)
	setupCtl, db := runs["setup@"+ctlName], runs["db@"+ctlName]
	setupCmp, nova := runs["setup@"+cmpName], runs["nova@"+cmpName]

	_, err := f.store.DispatchRun(f.ctx, setupCtl.ID, nil)
	require.NoError(t, err)
	_, err = f.store.DispatchRun(f.ctx, setupCmp.ID, nil)
	require.NoError(t, err)
	_, err = f.store.RecordRunResult(f.ctx, f.cmp.ID, setupCmp.ID, protocol.RunResult{Attempt: 1})
	require.NoError(t, err)

	// setup@ctl times out; only pending runs can be blocked by it.
	require.NoError(t, f.store.FailRun(f.ctx, setupCtl.ID, "heartbeat timeout", []int64{db.ID, nova.ID, setupCmp.ID}))
	got := f.runsByLabel(t, txn)
	assert.Equal(t, models.RunFailed, got["setup@"+ctlName].State)
	assert.Equal(t, "heartbeat timeout", got["setup@"+ctlName].Error)
	assert.NotNil(t, got["setup@"+ctlName].FinishedAt)
	assert.Equal(t, models.RunBlocked, got["db@"+ctlName].State)
	assert.Equal(t, models.RunBlocked, got["nova@"+cmpName].State)
	assert.Equal(t, models.RunSucceeded, got["setup@"+cmpName].State, "a finished run is not blocked")

	// Failing a run that already ended changes nothing.
	require.NoError(t, f.store.FailRun(f.ctx, setupCmp.ID, "late", nil))
	got = f.runsByLabel(t, txn)
	assert.Equal(t, models.RunSucceeded, got["setup@"+cmpName].State)
	assert.Empty(t, got["setup@"+cmpName].Error)

	// Only blocking, without a run of its own to fail.
	txn2, _ := f.plan(t)
	runs2 := f.runsByLabel(t, txn2)
	_, err = f.store.DispatchRun(f.ctx, runs2["db@"+ctlName].ID, nil)
	require.NoError(t, err)
	require.NoError(t, f.store.FailRun(f.ctx, 0, "", []int64{runs2["db@"+ctlName].ID, runs2["nova@"+cmpName].ID}))
	got = f.runsByLabel(t, txn2)
	assert.Equal(t, models.RunRunning, got["db@"+ctlName].State, "a running run is not blocked")
	assert.Equal(t, models.RunBlocked, got["nova@"+cmpName].State)

	require.NoError(t, f.store.CancelRuns(f.ctx, []int64{runs2["setup@"+cmpName].ID, runs2["nova@"+cmpName].ID}, "stopped"))
	got = f.runsByLabel(t, txn2)
	assert.Equal(t, models.RunCancelled, got["setup@"+cmpName].State)
	assert.Equal(t, models.RunBlocked, got["nova@"+cmpName].State, "only pending runs are cancelled")

	require.NoError(t, f.store.AbandonNodeRuns(f.ctx, txn2.ID, 0, f.ctl.ID, "node workflow terminated"))
	got = f.runsByLabel(t, txn2)
	assert.Equal(t, models.RunFailed, got["db@"+ctlName].State)
	assert.Equal(t, models.RunFailed, got["setup@"+ctlName].State)
	assert.Equal(t, "node workflow terminated", got["setup@"+ctlName].Error)
	assert.Equal(t, models.RunCancelled, got["setup@"+cmpName].State, "another node's runs are left alone")
}

func TestFinishTransaction(t *testing.T) {
	f := newFixture(t)
	succeedAll := func(t *testing.T, txn *models.Transaction) {
		for _, r := range f.runsByLabel(t, txn) {
			require.NoError(t, f.store.SucceedNoOp(f.ctx, r.ID))
		}
	}

	t.Run("ready", func(t *testing.T) {
		txn, _ := f.plan(t)
		succeedAll(t, txn)
		st, err := f.store.FinishTransaction(f.ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxReady, st.Status)
		assert.Empty(t, st.Error)
		assert.NotNil(t, st.FinishedAt)
		assert.Equal(t, 100, st.Progress)
		assert.Equal(t, map[string]int{models.RunSucceeded: 4}, st.Counts)
	})

	t.Run("failed run makes error and leftovers are cancelled", func(t *testing.T) {
		txn, _ := f.plan(t)
		runs := f.runsByLabel(t, txn)
		setup, db := runs["setup@"+ctlName], runs["db@"+ctlName]
		require.NoError(t, f.store.SucceedNoOp(f.ctx, runs["setup@"+cmpName].ID))
		_, err := f.store.DispatchRun(f.ctx, setup.ID, nil)
		require.NoError(t, err)
		_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 2})
		require.NoError(t, err)
		require.NoError(t, f.store.FailRun(f.ctx, 0, "", []int64{db.ID}))

		st, err := f.store.FinishTransaction(f.ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxError, st.Status)
		assert.Contains(t, st.Error, "1 run(s) failed, 1 blocked")
		assert.Contains(t, st.Error, "setup@"+ctlName+": exit code 2")
		assert.Equal(t, map[string]int{
			models.RunSucceeded: 1, models.RunFailed: 1, models.RunBlocked: 1, models.RunCancelled: 1,
		}, st.Counts, "nova never ran: cancelled")
		assert.Equal(t, 100, st.Progress)
	})

	t.Run("stopped", func(t *testing.T) {
		txn, _ := f.plan(t)
		runs := f.runsByLabel(t, txn)
		require.NoError(t, f.store.SucceedNoOp(f.ctx, runs["setup@"+ctlName].ID))
		st, err := f.store.FinishTransaction(f.ctx, txn.ID, true, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxStopped, st.Status)
		assert.Equal(t, "stopped by request", st.Error)
		assert.Equal(t, map[string]int{models.RunSucceeded: 1, models.RunCancelled: 3}, st.Counts)
	})

	t.Run("fail reason wins", func(t *testing.T) {
		txn, _ := f.plan(t)
		succeedAll(t, txn)
		st, err := f.store.FinishTransaction(f.ctx, txn.ID, true, "graph 0 could not be planned: cycle")
		require.NoError(t, err)
		assert.Equal(t, models.TxError, st.Status)
		assert.Equal(t, "graph 0 could not be planned: cycle", st.Error)
	})

	t.Run("unplanned transaction", func(t *testing.T) {
		txn := f.execute(t, models.ExecuteInput{})
		st, err := f.store.FinishTransaction(f.ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxReady, st.Status)
		assert.Zero(t, st.Total)
		assert.Equal(t, 100, st.Progress)
	})

	t.Run("unknown transaction", func(t *testing.T) {
		_, err := f.store.FinishTransaction(f.ctx, uuid.New(), false, "")
		assert.ErrorIs(t, err, models.ErrNotFound)
	})
}

func TestPlanGraphAgainReopensUnfinishedRuns(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	runs := f.runsByLabel(t, txn)
	setup, db := runs["setup@"+ctlName], runs["db@"+ctlName]
	require.NoError(t, f.store.SucceedNoOp(f.ctx, runs["setup@"+cmpName].ID))
	_, err := f.store.DispatchRun(f.ctx, setup.ID, nil)
	require.NoError(t, err)
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 1})
	require.NoError(t, err)
	require.NoError(t, f.store.FailRun(f.ctx, 0, "", []int64{db.ID}))
	st, err := f.store.FinishTransaction(f.ctx, txn.ID, false, "")
	require.NoError(t, err)
	require.Equal(t, models.TxError, st.Status)

	// The workflow is reset and plans again: the plan is kept, what did not
	// succeed is pending again and the transaction runs again.
	gp, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.Equal(t, 4, gp.Runs)
	assert.EqualValues(t, 4, count(t, f.store, &models.TaskRun{}))
	loaded, err := f.store.Transaction(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, models.TxRunning, loaded.Status)
	assert.Empty(t, loaded.Error)
	assert.Nil(t, loaded.FinishedAt)
	got := f.runsByLabel(t, txn)
	assert.Equal(t, models.RunSucceeded, got["setup@"+cmpName].State)
	for _, label := range []string{"setup@" + ctlName, "db@" + ctlName, "nova@" + cmpName} {
		assert.Equal(t, models.RunPending, got[label].State, label)
		assert.Empty(t, got[label].Error, label)
		assert.Nil(t, got[label].ExitCode, label)
		assert.Nil(t, got[label].FinishedAt, label)
	}
}

func ptr[T any](v T) *T { return &v }
