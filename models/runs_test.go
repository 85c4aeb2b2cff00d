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
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

func TestCreateTransactionValidation(t *testing.T) {
	f := storetest.NewFixture(t)
	noop := func(*fuel.Transaction) error { return nil }
	ghost, _, err := f.Store.CreateNode(f.Ctx, models.NodeInput{Name: "ghost.anneal.test"}, true)
	require.NoError(t, err)

	tests := []struct {
		name  string
		in    fuel.ExecuteInput
		field string
	}{
		{"no deployment", fuel.ExecuteInput{Graphs: []fuel.GraphRequest{{Type: "deployment"}}}, "deployment"},
		{"unknown deployment", fuel.ExecuteInput{Deployment: "nope", Graphs: []fuel.GraphRequest{{Type: "deployment"}}}, "deployment"},
		{"no graphs", fuel.ExecuteInput{Deployment: "prod"}, "graphs"},
		{"no type", fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{}}}, "graphs[0].type"},
		{"unknown type", fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{Type: "deployment"}, {Type: "nope"}}}, "graphs[1].type"},
		{"unknown task", fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{Type: "deployment", Tasks: []string{"db", "nope"}}}}, "graphs[0].tasks[1]"},
		{"node of another deployment", fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{Type: "deployment", Nodes: []int64{f.Ctl.ID, ghost.ID}}}}, "graphs[0].nodes[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.Store.CreateTransaction(f.Ctx, tt.in, noop)
			storetest.RequireInput(t, err, tt.field)
		})
	}

	// A failing start rolls the transaction back.
	boom := errors.New("temporal is down")
	_, err = f.Store.CreateTransaction(f.Ctx, fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
		func(*fuel.Transaction) error { return boom })
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, storetest.Count(t, f.Store, &fuel.Transaction{}))

	var started *fuel.Transaction
	txn, err := f.Store.CreateTransaction(f.Ctx, fuel.ExecuteInput{Deployment: "prod", Graphs: []fuel.GraphRequest{{Type: "deployment"}}, Force: true},
		func(tx *fuel.Transaction) error { started = tx; return nil })
	require.NoError(t, err)
	assert.Same(t, txn, started)
	assert.Equal(t, models.TxPending, txn.Status)
	assert.Equal(t, "tx-"+txn.ID.String(), txn.WorkflowID)
	assert.Equal(t, f.Dep.ID, txn.DeploymentID)
	loaded, err := f.Store.Transaction(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.True(t, loaded.Force)
	assert.Equal(t, []fuel.GraphRequest{{Type: "deployment"}}, loaded.Graphs)
	_, err = f.Store.Transaction(f.Ctx, uuid.New())
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestPlanGraph(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, gp := f.Plan(t)
	want := &contract.GraphPlan{
		GraphType: "deployment",
		// ctl first: nova on cmp waits for db on ctl.
		Nodes: []contract.PlannedNode{
			{ID: f.Ctl.ID, Name: storetest.CtlName, Runs: 2},
			{ID: f.Cmp.ID, Name: storetest.CmpName, Runs: 2},
		},
		Runs:             4,
		MaxNodesInFlight: contract.DefaultMaxNodesInFlight,
		FailureThreshold: ptr(fuel.DefaultFailureThreshold),
	}
	assert.Equal(t, want, gp)
	assert.EqualValues(t, 4, storetest.Count(t, f.Store, &models.TaskRun{}))
	assert.EqualValues(t, 3, storetest.Count(t, f.Store, &models.RunEdge{}))

	loaded, err := f.Store.Transaction(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, models.TxRunning, loaded.Status)
	require.NotNil(t, loaded.StartedAt)

	runs := f.RunsByLabel(t, txn)
	require.Len(t, runs, 4)
	setup := runs["setup@"+storetest.CtlName]
	assert.Equal(t, contract.RunPending, setup.State)
	assert.Equal(t, "shell", setup.TaskType)
	assert.Equal(t, models.RunSpec{Jig: fuel.JigAgent, Cmd: "echo setup", TimeoutSec: 30, Retries: 2}, setup.Spec)
	assert.Equal(t, models.DefaultTaskTimeoutSec, runs["db@"+storetest.CtlName].Spec.TimeoutSec)
	assert.Less(t, runs["db@"+storetest.CtlName].Position, runs["nova@"+storetest.CmpName].Position, "plan order is topological")

	// Planning again (an activity retry) returns the same plan and writes nothing.
	again, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.Equal(t, want, again)
	assert.EqualValues(t, 4, storetest.Count(t, f.Store, &models.TaskRun{}))
	assert.EqualValues(t, 3, storetest.Count(t, f.Store, &models.RunEdge{}))
	loaded2, err := f.Store.Transaction(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, loaded.StartedAt, loaded2.StartedAt, "a retry does not restart the transaction")

	_, err = f.Store.PlanGraph(f.Ctx, txn.ID, 1)
	assert.Error(t, err)
	_, err = f.Store.PlanGraph(f.Ctx, uuid.New(), 0)
	assert.ErrorIs(t, err, models.ErrNotFound)

	// Runs filters by node name or id and by state.
	mine, err := f.Store.Runs(f.Ctx, txn.ID, fuel.RunFilter{Node: storetest.CmpName})
	require.NoError(t, err)
	assert.Len(t, mine, 2)
	const ghostName = "ghost.anneal.test"
	mine, err = f.Store.Runs(f.Ctx, txn.ID, fuel.RunFilter{Node: ghostName, State: contract.RunPending})
	require.NoError(t, err)
	assert.Empty(t, mine)
	_, err = f.Store.Runs(f.Ctx, uuid.New(), fuel.RunFilter{})
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestPlanGraphFiltersAndDryRun(t *testing.T) {
	f := storetest.NewFixture(t)
	txn := f.Execute(t, fuel.ExecuteInput{DryRun: true, Graphs: []fuel.GraphRequest{
		{Type: "deployment", Nodes: []int64{f.Ctl.ID}},
		{Type: "provision"},
	}})
	gp, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.True(t, gp.DryRun)
	assert.Equal(t, 2, gp.Runs)
	require.Len(t, gp.Nodes, 1)
	assert.Equal(t, storetest.CtlName, gp.Nodes[0].Name)

	gp, err = f.Store.PlanGraph(f.Ctx, txn.ID, 1)
	require.NoError(t, err)
	assert.Equal(t, "provision", gp.GraphType)
	assert.Equal(t, 2, gp.Runs, "the noop task selects every node")

	runs, err := f.Store.Runs(f.Ctx, txn.ID, fuel.RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 4)
	for _, r := range runs {
		assert.Equal(t, contract.RunPlanned, r.State, "a dry run only records its plan")
	}
	assert.Equal(t, 0, runs[0].GraphIndex)
	assert.Equal(t, 1, runs[3].GraphIndex)

	np, err := f.Store.NodePlan(f.Ctx, txn.ID, 1, f.Cmp.ID)
	require.NoError(t, err)
	require.Len(t, np.Runs, 1)
	assert.True(t, np.Runs[0].NoOp)

	st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
	require.NoError(t, err)
	assert.Equal(t, models.TxReady, st.Status)
	assert.Equal(t, 100, st.Progress)
	assert.Equal(t, map[string]int{contract.RunPlanned: 4}, st.Counts)
}

func TestNodePlan(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setupCtl, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	setupCmp, nova := runs["setup@"+storetest.CmpName], runs["nova@"+storetest.CmpName]

	cmp, err := f.Store.NodePlan(f.Ctx, txn.ID, 0, f.Cmp.ID)
	require.NoError(t, err)
	require.Len(t, cmp.Runs, 2)
	assert.Equal(t, contract.NodeRun{ID: setupCmp.ID, Task: "setup", State: contract.RunPending, TimeoutSec: 30, Retries: 2}, cmp.Runs[0])
	assert.Equal(t, contract.NodeRun{
		ID: nova.ID, Task: "nova", State: contract.RunPending, TimeoutSec: models.DefaultTaskTimeoutSec,
		Parents: []int64{setupCmp.ID}, Remote: []int64{db.ID},
	}, cmp.Runs[1])
	assert.Equal(t, map[int64]string{db.ID: contract.RunPending}, cmp.RemoteStates)

	ctl, err := f.Store.NodePlan(f.Ctx, txn.ID, 0, f.Ctl.ID)
	require.NoError(t, err)
	require.Len(t, ctl.Runs, 2)
	assert.Equal(t, setupCtl.ID, ctl.Runs[0].ID)
	assert.Empty(t, ctl.Runs[0].Parents)
	assert.Equal(t, []int64{setupCtl.ID}, ctl.Runs[1].Parents, "a local edge is listed once")
	assert.Empty(t, ctl.Runs[1].Remote)
	assert.Equal(t, []contract.Peer{{RunID: nova.ID, Node: storetest.CmpName}}, ctl.Runs[1].RemoteKids)
	assert.Empty(t, ctl.RemoteStates)

	// A node workflow started late learns what its remote parents did.
	require.NoError(t, f.Store.SucceedNoOp(f.Ctx, db.ID))
	cmp, err = f.Store.NodePlan(f.Ctx, txn.ID, 0, f.Cmp.ID)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{db.ID: contract.RunSucceeded}, cmp.RemoteStates)
	states, err := f.Store.RunStates(f.Ctx, []int64{db.ID, nova.ID})
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{db.ID: contract.RunSucceeded, nova.ID: contract.RunPending}, states)

	none, err := f.Store.NodePlan(f.Ctx, txn.ID, 0, f.Ctl.ID+f.Cmp.ID+100)
	require.NoError(t, err)
	assert.Empty(t, none.Runs)
}

func TestDispatchAndClaim(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]

	empty, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, empty, "pending runs are not handed out")

	run, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	assert.Equal(t, setup.ID, run.ID)

	claimed, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.Equal(t, setup.ID, claimed[0].ID)
	assert.Equal(t, contract.RunRunning, claimed[0].State)
	assert.Equal(t, 1, claimed[0].Attempt)
	assert.Equal(t, "echo setup", claimed[0].Spec.Cmd)
	assert.Equal(t, []byte("token-1"), claimed[0].TaskToken)
	assert.NotNil(t, claimed[0].ClaimedAt)

	again, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, again, "a run is handed out once per attempt")
	other, err := f.Store.ClaimWork(f.Ctx, f.Cmp.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, other, "another node's run is not its work")

	// A retried activity dispatches a new attempt: the agent gets it again.
	_, err = f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-2"))
	require.NoError(t, err)
	claimed, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.Equal(t, 2, claimed[0].Attempt)
	assert.Equal(t, []byte("token-2"), claimed[0].TaskToken)

	// Once it succeeded, a further dispatch returns it untouched.
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 2})
	require.NoError(t, err)
	run, err = f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-3"))
	require.NoError(t, err)
	assert.Equal(t, contract.RunSucceeded, run.State)
	assert.Equal(t, 2, run.Attempt)
	claimed, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, claimed)

	_, err = f.Store.DispatchRun(f.Ctx, setup.ID+1000, nil)
	assert.ErrorIs(t, err, models.ErrNotFound)

	mine, err := f.Store.AgentRun(f.Ctx, f.Ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, setup.ID, mine.ID)
	_, err = f.Store.AgentRun(f.Ctx, f.Cmp.ID, setup.ID)
	assert.ErrorIs(t, err, models.ErrForbidden)
	_, err = f.Store.AgentRun(f.Ctx, f.Ctl.ID, setup.ID+1000)
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestRecordRunResult(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]

	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)

	ok := protocol.RunResult{Attempt: 1, StdoutTail: "done\x00", Outputs: map[string]string{"url": "http://x\x00"}}
	_, err = f.Store.RecordRunResult(f.Ctx, f.Cmp.ID, setup.ID, ok)
	assert.ErrorIs(t, err, models.ErrForbidden, "another node's run")
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 2})
	storetest.RequireConflict(t, err)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID+1000, ok)
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 1})
	storetest.RequireConflict(t, err) // pending, not running

	rec, err := f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, ok)
	require.NoError(t, err)
	assert.True(t, rec.Changed)
	assert.Equal(t, contract.RunSucceeded, rec.Run.State)
	// What the API answers and continues with comes back with it.
	assert.Equal(t, setup.ID, rec.Run.ID)
	assert.Equal(t, txn.ID, rec.Run.TransactionID)
	assert.Equal(t, setup.TaskName, rec.Run.TaskName)
	assert.Equal(t, storetest.CtlName, rec.Run.NodeName)
	assert.Equal(t, f.Ctl.ID, rec.Run.NodeID)
	assert.Equal(t, 1, rec.Run.Attempt)
	assert.Equal(t, map[string]string{"url": "http://x"}, rec.Run.Outputs)

	loaded, err := f.Store.AgentRun(f.Ctx, f.Ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, contract.RunSucceeded, loaded.State)
	require.NotNil(t, loaded.ExitCode)
	assert.Equal(t, 0, *loaded.ExitCode)
	assert.Equal(t, "done", loaded.StdoutTail, "NUL bytes are stripped")
	assert.Equal(t, map[string]string{"url": "http://x"}, loaded.Outputs)
	assert.NotNil(t, loaded.FinishedAt)

	// The agent reporting again (a lost answer) changes nothing.
	rec, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 9})
	require.NoError(t, err)
	assert.False(t, rec.Changed)
	assert.Equal(t, contract.RunSucceeded, rec.Run.State)

	// A failure by exit code and one by error message.
	_, err = f.Store.DispatchRun(f.Ctx, db.ID, nil)
	require.NoError(t, err)
	rec, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 1, ExitCode: 3})
	require.NoError(t, err)
	assert.True(t, rec.Changed)
	assert.Equal(t, contract.RunFailed, rec.Run.State)
	nova := runs["nova@"+storetest.CmpName]
	_, err = f.Store.DispatchRun(f.Ctx, nova.ID, nil)
	require.NoError(t, err)
	rec, err = f.Store.RecordRunResult(f.Ctx, f.Cmp.ID, nova.ID, protocol.RunResult{Attempt: 1, Error: "timed out"})
	require.NoError(t, err)
	assert.Equal(t, contract.RunFailed, rec.Run.State)

	st, err := f.Store.TransactionStatus(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, "prod", st.Deployment)
	assert.Equal(t, 4, st.Total)
	assert.Equal(t, 75, st.Progress)
	assert.ElementsMatch(t, []string{"db@" + storetest.CtlName + ": exit code 3", "nova@" + storetest.CmpName + ": timed out"}, st.FailedRuns)
}

func TestFailRun(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setupCtl, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	setupCmp, nova := runs["setup@"+storetest.CmpName], runs["nova@"+storetest.CmpName]

	_, err := f.Store.DispatchRun(f.Ctx, setupCtl.ID, nil)
	require.NoError(t, err)
	_, err = f.Store.DispatchRun(f.Ctx, setupCmp.ID, nil)
	require.NoError(t, err)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Cmp.ID, setupCmp.ID, protocol.RunResult{Attempt: 1})
	require.NoError(t, err)

	// setup@ctl times out; only pending runs can be blocked by it.
	require.NoError(t, f.Store.FailRun(f.Ctx, setupCtl.ID, "heartbeat timeout", []int64{db.ID, nova.ID, setupCmp.ID}))
	got := f.RunsByLabel(t, txn)
	assert.Equal(t, contract.RunFailed, got["setup@"+storetest.CtlName].State)
	assert.Equal(t, "heartbeat timeout", got["setup@"+storetest.CtlName].Error)
	assert.NotNil(t, got["setup@"+storetest.CtlName].FinishedAt)
	assert.Equal(t, contract.RunBlocked, got["db@"+storetest.CtlName].State)
	assert.Equal(t, contract.RunBlocked, got["nova@"+storetest.CmpName].State)
	assert.Equal(t, contract.RunSucceeded, got["setup@"+storetest.CmpName].State, "a finished run is not blocked")

	// Failing a run that already ended changes nothing.
	require.NoError(t, f.Store.FailRun(f.Ctx, setupCmp.ID, "late", nil))
	got = f.RunsByLabel(t, txn)
	assert.Equal(t, contract.RunSucceeded, got["setup@"+storetest.CmpName].State)
	assert.Empty(t, got["setup@"+storetest.CmpName].Error)

	// Only blocking, without a run of its own to fail.
	txn2, _ := f.Plan(t)
	runs2 := f.RunsByLabel(t, txn2)
	_, err = f.Store.DispatchRun(f.Ctx, runs2["db@"+storetest.CtlName].ID, nil)
	require.NoError(t, err)
	require.NoError(t, f.Store.FailRun(f.Ctx, 0, "", []int64{runs2["db@"+storetest.CtlName].ID, runs2["nova@"+storetest.CmpName].ID}))
	got = f.RunsByLabel(t, txn2)
	assert.Equal(t, contract.RunRunning, got["db@"+storetest.CtlName].State, "a running run is not blocked")
	assert.Equal(t, contract.RunBlocked, got["nova@"+storetest.CmpName].State)

	require.NoError(t, f.Store.CancelRuns(f.Ctx, []int64{runs2["setup@"+storetest.CmpName].ID, runs2["nova@"+storetest.CmpName].ID}, "stopped"))
	got = f.RunsByLabel(t, txn2)
	assert.Equal(t, contract.RunCancelled, got["setup@"+storetest.CmpName].State)
	assert.Equal(t, contract.RunBlocked, got["nova@"+storetest.CmpName].State, "only pending runs are cancelled")

	require.NoError(t, f.Store.AbandonNodeRuns(f.Ctx, txn2.ID, 0, f.Ctl.ID, "node workflow terminated"))
	got = f.RunsByLabel(t, txn2)
	assert.Equal(t, contract.RunFailed, got["db@"+storetest.CtlName].State)
	assert.Equal(t, contract.RunFailed, got["setup@"+storetest.CtlName].State)
	assert.Equal(t, "node workflow terminated", got["setup@"+storetest.CtlName].Error)
	assert.Equal(t, contract.RunCancelled, got["setup@"+storetest.CmpName].State, "another node's runs are left alone")
}

func TestFinishTransaction(t *testing.T) {
	f := storetest.NewFixture(t)
	succeedAll := func(t *testing.T, txn *fuel.Transaction) {
		for _, r := range f.RunsByLabel(t, txn) {
			require.NoError(t, f.Store.SucceedNoOp(f.Ctx, r.ID))
		}
	}

	t.Run("ready", func(t *testing.T) {
		txn, _ := f.Plan(t)
		succeedAll(t, txn)
		st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxReady, st.Status)
		assert.Empty(t, st.Error)
		assert.NotNil(t, st.FinishedAt)
		assert.Equal(t, 100, st.Progress)
		assert.Equal(t, map[string]int{contract.RunSucceeded: 4}, st.Counts)
	})

	t.Run("failed run makes error and leftovers are cancelled", func(t *testing.T) {
		txn, _ := f.Plan(t)
		runs := f.RunsByLabel(t, txn)
		setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
		require.NoError(t, f.Store.SucceedNoOp(f.Ctx, runs["setup@"+storetest.CmpName].ID))
		_, err := f.Store.DispatchRun(f.Ctx, setup.ID, nil)
		require.NoError(t, err)
		_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 2})
		require.NoError(t, err)
		require.NoError(t, f.Store.FailRun(f.Ctx, 0, "", []int64{db.ID}))

		st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxError, st.Status)
		assert.Contains(t, st.Error, "1 run(s) failed, 1 blocked")
		assert.Contains(t, st.Error, "setup@"+storetest.CtlName+": exit code 2")
		assert.Equal(t, map[string]int{
			contract.RunSucceeded: 1, contract.RunFailed: 1, contract.RunBlocked: 1, contract.RunCancelled: 1,
		}, st.Counts, "nova never ran: cancelled")
		assert.Equal(t, 100, st.Progress)
	})

	t.Run("stopped", func(t *testing.T) {
		txn, _ := f.Plan(t)
		runs := f.RunsByLabel(t, txn)
		require.NoError(t, f.Store.SucceedNoOp(f.Ctx, runs["setup@"+storetest.CtlName].ID))
		st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, true, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxStopped, st.Status)
		assert.Equal(t, "stopped by request", st.Error)
		assert.Equal(t, map[string]int{contract.RunSucceeded: 1, contract.RunCancelled: 3}, st.Counts)
	})

	t.Run("fail reason wins", func(t *testing.T) {
		txn, _ := f.Plan(t)
		succeedAll(t, txn)
		st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, true, "graph 0 could not be planned: cycle")
		require.NoError(t, err)
		assert.Equal(t, models.TxError, st.Status)
		assert.Equal(t, "graph 0 could not be planned: cycle", st.Error)
	})

	t.Run("unplanned transaction", func(t *testing.T) {
		txn := f.Execute(t, fuel.ExecuteInput{})
		st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
		require.NoError(t, err)
		assert.Equal(t, models.TxReady, st.Status)
		assert.Zero(t, st.Total)
		assert.Equal(t, 100, st.Progress)
	})

	t.Run("unknown transaction", func(t *testing.T) {
		_, err := f.Store.FinishTransaction(f.Ctx, uuid.New(), false, "")
		assert.ErrorIs(t, err, models.ErrNotFound)
	})
}

func TestPlanGraphAgainReopensUnfinishedRuns(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]
	require.NoError(t, f.Store.SucceedNoOp(f.Ctx, runs["setup@"+storetest.CmpName].ID))
	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: 1})
	require.NoError(t, err)
	require.NoError(t, f.Store.FailRun(f.Ctx, 0, "", []int64{db.ID}))
	st, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
	require.NoError(t, err)
	require.Equal(t, models.TxError, st.Status)

	// The workflow is reset and plans again: the plan is kept, what did not
	// succeed is pending again and the transaction runs again.
	gp, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	assert.Equal(t, 4, gp.Runs)
	assert.EqualValues(t, 4, storetest.Count(t, f.Store, &models.TaskRun{}))
	loaded, err := f.Store.Transaction(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, models.TxRunning, loaded.Status)
	assert.Empty(t, loaded.Error)
	assert.Nil(t, loaded.FinishedAt)
	got := f.RunsByLabel(t, txn)
	assert.Equal(t, contract.RunSucceeded, got["setup@"+storetest.CmpName].State)
	for _, label := range []string{"setup@" + storetest.CtlName, "db@" + storetest.CtlName, "nova@" + storetest.CmpName} {
		assert.Equal(t, contract.RunPending, got[label].State, label)
		assert.Empty(t, got[label].Error, label)
		assert.Nil(t, got[label].ExitCode, label)
		assert.Nil(t, got[label].FinishedAt, label)
	}
}

func ptr[T any](v T) *T { return &v }

// TestRecordRunResultRedacts: the server redacts every secret of the
// node's deployment from a report, whatever the agent did; a report with
// no text in it is recorded without the secrets being read.
func TestRecordRunResultRedacts(t *testing.T) {
	f := storetest.NewFixture(t)
	var err error
	f.Store.Keys, err = secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	_, _, err = f.Store.SetSecret(f.Ctx, f.Dep.Name, "db-password", "hunter22-prod")
	require.NoError(t, err)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup, db := runs["setup@"+storetest.CtlName], runs["db@"+storetest.CtlName]

	_, err = f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)
	leaky := protocol.RunResult{Attempt: 1, ExitCode: 1, StdoutTail: "pw hunter22-prod", StderrTail: "err hunter22-prod",
		Error: "failed with hunter22-prod", Outputs: map[string]string{"pw": "hunter22-prod"}, Attrs: []byte(`{"pw": "hunter22-prod"}`)}
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, leaky)
	require.NoError(t, err)
	got, err := f.Store.AgentRun(f.Ctx, f.Ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Equal(t, "pw ***", got.StdoutTail)
	assert.Equal(t, "err ***", got.StderrTail)
	assert.Equal(t, "failed with ***", got.Error)
	assert.Equal(t, map[string]string{"pw": "***"}, got.Outputs)
	assert.Equal(t, map[string]any{"pw": "***"}, got.AttrsOut)

	// Its retry hands nothing back: the attributes are unchanged, and the
	// first attempt's answer does not stay.
	_, err = f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 2, StdoutTail: "ok"})
	require.NoError(t, err)
	got, err = f.Store.AgentRun(f.Ctx, f.Ctl.ID, setup.ID)
	require.NoError(t, err)
	assert.Nil(t, got.AttrsOut)

	// Without text, the secrets are not read: a keyring that cannot open
	// them would fail the report if they were.
	f.Store.Keys, err = secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	_, err = f.Store.DispatchRun(f.Ctx, db.ID, nil)
	require.NoError(t, err)
	rec, err := f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 1})
	require.NoError(t, err)
	assert.Equal(t, contract.RunSucceeded, rec.Run.State)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, db.ID, protocol.RunResult{Attempt: 1, StdoutTail: "x"})
	assert.Error(t, err, "with text, the secrets are read (and cannot be opened with the wrong key)")
}
