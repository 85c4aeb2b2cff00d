package activities_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/mocks"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// fakeRuns keeps task runs in memory the way the kernel store does for
// the activities: a pending, running or failed run is (re)dispatched with
// the activity's task token, a finished one is returned as it is, and a
// node can be made busy.
type fakeRuns struct {
	mu         sync.Mutex
	runs       map[int64]*models.TaskRun
	busy       string // the node is busy with this, if set
	down       int    // this many more dispatches find the database restarting
	dispatches int
	tokens     [][]byte
}

func newFakeRuns(runs ...models.TaskRun) *fakeRuns {
	f := &fakeRuns{runs: map[int64]*models.TaskRun{}}
	for i := range runs {
		f.runs[runs[i].ID] = &runs[i]
	}
	return f
}

func (f *fakeRuns) DispatchRun(_ context.Context, runID int64, token []byte) (*models.TaskRun, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	run, ok := f.runs[runID]
	if !ok {
		return nil, models.NotFound("run", runID)
	}
	if f.busy != "" {
		return nil, &models.NodeBusyError{Node: run.NodeName, Reason: f.busy}
	}
	if f.down > 0 {
		f.down--
		return nil, &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"}
	}
	switch run.State {
	case contract.RunPending, contract.RunRunning, contract.RunFailed:
		run.State, run.Attempt, run.TaskToken = contract.RunRunning, run.Attempt+1, token
		f.dispatches++
		f.tokens = append(f.tokens, token)
	}
	out := *run
	return &out, nil
}

// DispatchChain walks the chain as the kernel store does: runs that ended
// well are passed over, the first other dispatchable one is dispatched,
// and a blocked or cancelled one ends the chain.
func (f *fakeRuns) DispatchChain(ctx context.Context, runIDs []int64, token []byte) (*models.TaskRun, error) {
	for _, id := range runIDs {
		f.mu.Lock()
		run, ok := f.runs[id]
		f.mu.Unlock()
		if !ok {
			return nil, models.NotFound("run", id)
		}
		switch run.State {
		case contract.RunSucceeded, contract.RunSkipped:
			continue
		case contract.RunPending, contract.RunRunning, contract.RunFailed:
			return f.DispatchRun(ctx, id, token)
		}
		return nil, nil
	}
	return nil, nil
}

// report is the agent's report as the store records it.
func (f *fakeRuns) report(runID int64, exit int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	run := f.runs[runID]
	run.ExitCode = &exit
	run.State = contract.RunSucceeded
	if exit != 0 {
		run.State = contract.RunFailed
	}
}

func (f *fakeRuns) lastToken() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tokens) == 0 {
		return nil
	}
	return f.tokens[len(f.tokens)-1]
}

func (f *fakeRuns) CutChain(context.Context, int64) error { return nil }
func (f *fakeRuns) EndLostChain(context.Context, int64, string) (*contract.LostChainEnd, error) {
	return &contract.LostChainEnd{}, nil
}
func (f *fakeRuns) FailRun(context.Context, int64, string, []int64) error { return nil }
func (f *fakeRuns) CancelRuns(context.Context, []int64, string) error     { return nil }
func (f *fakeRuns) RunStates(_ context.Context, ids []int64) (map[int64]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]string{}
	for _, id := range ids {
		if r, ok := f.runs[id]; ok {
			out[id] = r.State
		}
	}
	return out, nil
}
func (f *fakeRuns) AbandonNodeRuns(context.Context, uuid.UUID, int, int64, string) error { return nil }
func (f *fakeRuns) SucceedNoOp(context.Context, int64) error                             { return nil }
func (f *fakeRuns) RunDelivery(context.Context, int64) (*contract.RunDelivery, error) {
	return nil, nil
}

// fakePlans answers every planning call with err (a missing transaction,
// say), counting the calls.
type fakePlans struct {
	err   error
	calls int
}

func (f *fakePlans) PlanGraph(context.Context, uuid.UUID, int) (*contract.GraphPlan, error) {
	f.calls++
	return nil, f.err
}
func (f *fakePlans) StartNodePlan(context.Context, uuid.UUID, int, int64) (*contract.NodePlan, error) {
	f.calls++
	return nil, f.err
}
func (f *fakePlans) FinishNodeGraph(context.Context, uuid.UUID, int, int64, string) error {
	return f.err
}
func (f *fakePlans) FinishTransaction(context.Context, uuid.UUID, bool, string) (*fuel.TransactionStatus, error) {
	f.calls++
	return nil, f.err
}

// fakeNodeRoles answers a bootstrap with err, counting the calls.
type fakeNodeRoles struct {
	err   error
	calls int
}

func (f *fakeNodeRoles) NextNodeRoles(context.Context, int64, int) ([]crowbar.NodeRole, error) {
	return nil, nil
}
func (f *fakeNodeRoles) StartNodeRole(context.Context, int64, func(*crowbar.NodeRole) error) (*crowbar.NodeRole, error) {
	return nil, nil
}
func (f *fakeNodeRoles) NodeRolesInTransition(context.Context) ([]crowbar.NodeRole, error) {
	return nil, nil
}
func (f *fakeNodeRoles) PrepareNodeRoleRun(context.Context, int64, int) (*contract.NodeRoleRunPlan, error) {
	return nil, nil
}
func (f *fakeNodeRoles) FinishNodeRoleRun(context.Context, int64, int, bool, string) (*crowbar.NodeRole, error) {
	return nil, nil
}
func (f *fakeNodeRoles) BootstrapNode(context.Context, int64) (*contract.BootstrapResult, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &contract.BootstrapResult{Node: "n1.anneal.test", Flag: models.FlagDiscovery}, nil
}

var quiet = slog.New(slog.DiscardHandler)

func pendingRun() models.TaskRun {
	return models.TaskRun{ID: 7, NodeName: "n1.anneal.test", TaskName: "setup", State: contract.RunPending}
}

func appErrType(t *testing.T, err error) string {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr, "want an application error, got %v", err)
	return appErr.Type()
}

// A run the store skips at dispatch (LCM: the runs it depends on handed
// over the same outputs) completes at once, as a success, without an agent.
func TestRunTaskOnNodeSkippedAtDispatch(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	run := pendingRun()
	run.State = contract.RunSkipped
	runs := newFakeRuns(run)
	env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet})
	val, err := env.ExecuteActivity(contract.RunTaskOnNodeActivity, contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"})
	require.NoError(t, err)
	var out contract.RunOutcome
	require.NoError(t, val.Get(&out))
	assert.Equal(t, 0, out.ExitCode)
	assert.Zero(t, runs.dispatches)
}

// A node busy for longer than the activity waits fails RunTaskOnNode with
// NodeBusy, not retried by the activity (the workflow waits instead), and
// nothing is dispatched.
func TestRunTaskOnNodeNodeBusy(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	runs := newFakeRuns(pendingRun())
	runs.busy = "noderole db-server is in transition"
	env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet, NodeBusyWait: 50 * time.Millisecond})
	_, err := env.ExecuteActivity(contract.RunTaskOnNodeActivity, contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"})
	require.Error(t, err)
	assert.Equal(t, contract.ErrTypeNodeBusy, appErrType(t, err))
	assert.Contains(t, err.Error(), "noderole db-server is in transition")
	assert.Zero(t, runs.dispatches)
}

// Postgres restarting while a run is dispatched costs the run nothing: the
// activity waits, heartbeating, and dispatches once the database is back,
// instead of failing an attempt of a task that never ran.
func TestRunTaskOnNodeWaitsForTheDatabase(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	runs := newFakeRuns(pendingRun())
	runs.down = 2
	env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet})
	_, err := env.ExecuteActivity(contract.RunTaskOnNodeActivity, contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"})
	require.ErrorIs(t, err, activity.ErrResultPending, "dispatched once the database answered")
	assert.Equal(t, 1, runs.dispatches)
	assert.Zero(t, runs.down)
}

// RunChainOnNode hands the whole chain to the store and waits for the API
// while a run of it was dispatched; when the store dispatched nothing
// (every run ended well) it completes at once with the runs' states; an
// empty chain is refused. (The store's walk itself, resuming at the first
// unfinished run, is tested in models: TestChainsInTheStore.)
func TestRunChainOnNode(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	done := pendingRun()
	done.State, done.Attempt = contract.RunSucceeded, 1
	next := pendingRun()
	next.ID, next.TaskName = 8, "configure"
	runs := newFakeRuns(done, next)
	env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet})
	in := contract.RunChainInput{Node: "n1.anneal.test", Runs: []contract.ChainRun{{RunID: 7, Task: "setup"}, {RunID: 8, Task: "configure"}}}
	_, err := env.ExecuteActivity(contract.RunChainOnNodeActivity, in)
	require.ErrorIs(t, err, activity.ErrResultPending, "the second run was dispatched, and the API completes the activity")
	assert.Equal(t, 1, runs.dispatches)
	assert.Equal(t, 1, runs.runs[7].Attempt, "the run that succeeded is not run again")
	assert.Equal(t, contract.RunRunning, runs.runs[8].State)

	// Once every run ended well, the chain completes at once with their
	// states, dispatching nothing.
	runs.report(8, 0)
	val, err := env.ExecuteActivity(contract.RunChainOnNodeActivity, in)
	require.NoError(t, err)
	var out contract.ChainOutcome
	require.NoError(t, val.Get(&out))
	assert.Equal(t, map[int64]string{7: contract.RunSucceeded, 8: contract.RunSucceeded}, out.States)
	assert.Equal(t, 1, runs.dispatches)

	_, err = env.ExecuteActivity(contract.RunChainOnNodeActivity, contract.RunChainInput{Node: "n1.anneal.test"})
	assert.Equal(t, contract.ErrTypeBadInput, appErrType(t, err))
}

func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P03"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{fmt.Errorf("dispatch: %w", &pgconn.PgError{Code: "57P01"}), true},
		{&pgconn.PgError{Code: "23505"}, false},
		{models.Invalid("x", "bad"), false},
		{&models.NodeBusyError{Node: "n", Reason: "r"}, false},
		{nil, false},
	} {
		assert.Equal(t, tc.want, models.Unavailable(tc.err), "%v", tc.err)
	}
}

// runTaskWorkflow runs one task on its node with retries, as a node
// workflow does, and returns its outcome.
func runTaskWorkflow(ctx workflow.Context, in contract.RunTaskInput) (*contract.RunOutcome, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3},
	})
	var out contract.RunOutcome
	err := workflow.ExecuteActivity(ctx, contract.RunTaskOnNodeActivity, in).Get(ctx, &out)
	return &out, err
}

// envCompleter completes activities of the test environment the way the
// API completes them with its Temporal client.
type envCompleter struct {
	env *testsuite.TestWorkflowEnvironment
}

func (c envCompleter) CompleteActivity(_ context.Context, token []byte, result any, err error) error {
	return c.env.CompleteActivity(token, result, err)
}

// RunTaskOnNode completes asynchronously: the activity returns pending
// once the run is dispatched, and the agent's report, arriving later,
// completes it through contract.CompleteRunOnNode, as the API does.
func TestRunTaskOnNodeCompletesWhenTheAgentReports(t *testing.T) {
	for _, tc := range []struct {
		name string
		exit int
	}{{"success", 0}, {"failure", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			var ts testsuite.WorkflowTestSuite
			env := loadedEnv(&ts)
			runs := newFakeRuns(pendingRun())
			env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet})
			env.RegisterWorkflow(runTaskWorkflow)
			// The agent reports a minute later.
			env.RegisterDelayedCallback(func() {
				runs.report(7, tc.exit)
				require.NotNil(t, runs.lastToken(), "the run was dispatched with the activity's task token")
				require.NoError(t, contract.CompleteRunOnNode(context.Background(), envCompleter{env}, runs.lastToken(),
					tc.exit == 0, tc.exit, "task setup failed on n1.anneal.test with exit code 3"))
			}, time.Minute)
			env.ExecuteWorkflow(runTaskWorkflow, contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"})
			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			if tc.exit == 0 {
				require.NoError(t, err)
				var out contract.RunOutcome
				require.NoError(t, env.GetWorkflowResult(&out))
				assert.Equal(t, 0, out.ExitCode)
				assert.Equal(t, 1, runs.dispatches, "dispatched once")
				return
			}
			require.Error(t, err)
			assert.Equal(t, contract.ErrTypeTaskFailed, appErrType(t, err))
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			var out contract.RunOutcome
			require.NoError(t, appErr.Details(&out))
			assert.Equal(t, 3, out.ExitCode)
			assert.Contains(t, err.Error(), "exit code 3")
		})
	}
}

// An attempt of RunTaskOnNode that comes after the agent already reported
// success (the activity timed out in between, say) returns the outcome and
// does not dispatch the run again.
func TestRetriedRunTaskOnNodeDoesNotRunTwice(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	runs := newFakeRuns(pendingRun())
	env.RegisterActivity(&activities.Activities{Runs: runs, Log: quiet})
	in := contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"}

	_, err := env.ExecuteActivity(contract.RunTaskOnNodeActivity, in)
	require.ErrorIs(t, err, activity.ErrResultPending, "the first attempt dispatches and waits for the agent")
	require.Equal(t, 1, runs.dispatches)

	runs.report(7, 0)
	val, err := env.ExecuteActivity(contract.RunTaskOnNodeActivity, in)
	require.NoError(t, err)
	var out contract.RunOutcome
	require.NoError(t, val.Get(&out))
	assert.Equal(t, 0, out.ExitCode)
	assert.Equal(t, 1, runs.dispatches, "the retry found the run succeeded and dispatched nothing")
}

// A transaction whose row never appears (its creation rolled back) fails
// the activity for good after a few attempts, instead of retrying forever.
func TestMissingTransactionFailsAfterAFewAttempts(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	plans := &fakePlans{err: models.NotFound("transaction", "T")}
	env.RegisterActivity(&activities.Activities{Plans: plans, Log: quiet})
	wf := func(ctx workflow.Context, ref contract.GraphRef) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute,
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumInterval: time.Millisecond},
		})
		return workflow.ExecuteActivity(ctx, contract.PlanGraphActivity, ref).Get(ctx, nil)
	}
	env.RegisterWorkflow(wf)
	env.ExecuteWorkflow(wf, contract.GraphRef{TransactionID: uuid.NewString()})
	err := env.GetWorkflowError()
	require.Error(t, err)
	assert.Equal(t, contract.ErrTypeBadInput, appErrType(t, err))
	assert.Contains(t, err.Error(), "its creation was rolled back")
	assert.Equal(t, 6, plans.calls, "retried until the sixth attempt, then final")
}

// A malformed transaction id is final at once; so is a graph that cannot
// be planned.
func TestPlanGraphFinalErrors(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	env.RegisterActivity(&activities.Activities{Plans: &fakePlans{err: &fuel.PlanError{Reason: "cycle: a -> b -> a"}}, Log: quiet})
	_, err := env.ExecuteActivity(contract.PlanGraphActivity, contract.GraphRef{TransactionID: "not-a-uuid"})
	assert.Equal(t, contract.ErrTypeBadInput, appErrType(t, err))
	_, err = env.ExecuteActivity(contract.PlanGraphActivity, contract.GraphRef{TransactionID: uuid.NewString()})
	assert.Equal(t, contract.ErrTypePlan, appErrType(t, err))
	assert.Contains(t, err.Error(), "cycle: a -> b -> a")
}

// A bootstrap the release makes impossible (a bad binding, a conflict) is
// final; a database error is retried; success wakes the annealer.
func TestBootstrapNodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantType  string
		retryable bool
	}{
		{"input", models.Invalid("role", "discovery role x requires y, which is nowhere"), contract.ErrTypeBadInput, false},
		{"conflict", &models.ConflictError{Reason: "system is being committed"}, contract.ErrTypeBadInput, false},
		{"database", errors.New("connection refused"), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts testsuite.WorkflowTestSuite
			env := ts.NewTestActivityEnvironment()
			roles := &fakeNodeRoles{err: tc.err}
			env.RegisterActivity(&activities.Activities{NodeRoles: roles, Log: quiet})
			_, err := env.ExecuteActivity(contract.BootstrapNodeActivity, contract.NodeBootstrapInput{NodeID: 1, Node: "n1.anneal.test"})
			require.Error(t, err)
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			assert.Equal(t, tc.retryable, !appErr.NonRetryable(), "retryable")
			if tc.wantType != "" {
				assert.Equal(t, tc.wantType, appErr.Type())
			}
			assert.Contains(t, err.Error(), tc.err.Error())
		})
	}
	t.Run("success kicks the annealer", func(t *testing.T) {
		var ts testsuite.WorkflowTestSuite
		env := ts.NewTestActivityEnvironment()
		tc := &mocks.Client{}
		tc.On("SignalWithStartWorkflow", mock.Anything, contract.AnnealerWorkflowID("q"), contract.SignalAnnealerKick,
			"node n1.anneal.test bootstrapped", mock.Anything, contract.AnnealerWorkflow, contract.AnnealerInput{}).Return(nil, nil).Once()
		env.RegisterActivity(&activities.Activities{NodeRoles: &fakeNodeRoles{}, Temporal: tc, TaskQueue: "q", Log: quiet})
		val, err := env.ExecuteActivity(contract.BootstrapNodeActivity, contract.NodeBootstrapInput{NodeID: 1, Node: "n1.anneal.test"})
		require.NoError(t, err)
		var res contract.BootstrapResult
		require.NoError(t, val.Get(&res))
		assert.Equal(t, "n1.anneal.test", res.Node)
		tc.AssertExpectations(t)
	})
}

// loadedEnv is a workflow test environment whose deadlock detector allows
// for a loaded machine: the suite runs beside Temporal, Postgres and agents
// on two cores, where a workflow goroutine may wait past the default 1 s
// for the CPU without being stuck.
func loadedEnv(ts *testsuite.WorkflowTestSuite) *testsuite.TestWorkflowEnvironment {
	env := ts.NewTestWorkflowEnvironment()
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	return env
}

// TestWakeNodes signals each node workflow named with its own states. A
// node workflow that is not there (not started yet, or ended), or whose
// signal the server refuses for good, is skipped; a failure that may pass
// fails the activity for a retry, naming the node, and the others are
// still woken.
func TestWakeNodes(t *testing.T) {
	in := contract.WakeNodes{TransactionID: "T", Wakes: []contract.NodeWake{
		{Node: "a.test", States: map[int64]string{1: contract.RunSucceeded}},
		{Node: "b.test", States: map[int64]string{1: contract.RunSucceeded, 2: contract.RunFailed}},
		{Node: "c.test", States: map[int64]string{1: contract.RunSucceeded}},
	}}
	for _, tc := range []struct {
		name  string
		bErr  error
		fails string
	}{
		{"all woken", nil, ""},
		{"one not there", serviceerror.NewNotFound("workflow not found"), ""},
		{"one refused", serviceerror.NewInvalidArgument("too many signals"), ""},
		{"one unavailable", serviceerror.NewUnavailable("server down"), "wake the workflow of node b.test (tx-T/b.test): server down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts testsuite.WorkflowTestSuite
			env := ts.NewTestActivityEnvironment()
			c := &mocks.Client{}
			for i, w := range in.Wakes {
				var err error
				if i == 1 {
					err = tc.bErr
				}
				call := c.On("SignalWorkflow", mock.Anything, "tx-T/"+w.Node, "", contract.SignalRunsFinished,
					contract.RunsFinished{States: w.States}).Return(err).Once()
				if i != 1 {
					// Slower than b's: a failure of b's must not cut them short.
					call.Run(func(args mock.Arguments) {
						time.Sleep(100 * time.Millisecond)
						assert.NoError(t, args.Get(0).(context.Context).Err(), "signalled with a cancelled context")
					})
				}
			}
			env.RegisterActivity(&activities.Activities{Temporal: c, Log: quiet})
			_, err := env.ExecuteActivity(contract.WakeNodesActivity, in)
			if tc.fails == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.fails)
			}
			c.AssertExpectations(t) // every node was signalled
		})
	}
}
