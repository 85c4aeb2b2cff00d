package workflows_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// noderoleFake answers the activities of a noderole's run and records
// which jig ran and how the run ended.
type noderoleFake struct {
	mu    sync.Mutex
	plan  contract.NodeRoleRunPlan
	jig   error // what the jig activity returns
	busy  int   // how many first jig calls answer that the node is busy
	calls []string
	ends  []contract.NodeRoleRunEnd
}

func (f *noderoleFake) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func newNodeRoleEnv(t *testing.T, f *noderoleFake) *testsuite.TestWorkflowEnvironment {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	workflows.Register(env)
	a := &activities.Activities{}
	env.OnActivity(a.PrepareNodeRoleRun, mock.Anything, mock.Anything).Return(
		func(context.Context, contract.NodeRoleRunInput) (*contract.NodeRoleRunPlan, error) {
			f.record("prepare")
			p := f.plan
			return &p, nil
		}).Maybe()
	env.OnActivity(a.RunTaskOnNode, mock.Anything, mock.Anything).Return(
		func(context.Context, contract.RunTaskInput) (*contract.RunOutcome, error) {
			f.record("agent")
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.busy > 0 {
				f.busy--
				return nil, temporal.NewNonRetryableApplicationError("node n1 is busy: run 3 (setup) is running", contract.ErrTypeNodeBusy, nil)
			}
			return &contract.RunOutcome{}, f.jig
		}).Maybe()
	env.OnActivity(a.RunOnOrchestrator, mock.Anything, mock.Anything).Return(
		func(context.Context, contract.RunTaskInput) (*contract.RunOutcome, error) {
			f.record("local")
			return &contract.RunOutcome{}, f.jig
		}).Maybe()
	env.OnActivity(a.RunOverSSH, mock.Anything, mock.Anything).Return(
		func(context.Context, contract.RunTaskInput) (*contract.RunOutcome, error) {
			f.record("ssh")
			return &contract.RunOutcome{}, f.jig
		}).Maybe()
	env.OnActivity(a.RecordNoOp, mock.Anything, mock.Anything).Return(
		func(context.Context, int64) error {
			f.record("noop")
			return nil
		}).Maybe()
	env.OnActivity(a.FinishNodeRoleRun, mock.Anything, mock.Anything).Return(
		func(_ context.Context, end contract.NodeRoleRunEnd) (string, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ends = append(f.ends, end)
			if !end.OK {
				return contract.NodeRoleError, nil
			}
			return contract.NodeRoleActive, nil
		}).Maybe()
	return env
}

// TestNodeRoleRunWaitsForABusyNode: while the node stays busy past the
// activity's own wait, the workflow pauses and tries again; the wait is
// not the noderole's failure.
func TestNodeRoleRunWaitsForABusyNode(t *testing.T) {
	f := &noderoleFake{plan: contract.NodeRoleRunPlan{NodeRoleID: 4, Run: 1, RunID: 40, Node: "n1", Role: "db", Jig: "agent", HasScript: true, TimeoutSec: 60}, busy: 2}
	env := newNodeRoleEnv(t, f)
	env.ExecuteWorkflow(contract.NodeRoleWorkflow, contract.NodeRoleRunInput{NodeRoleID: 4, Run: 1, Node: "n1", Role: "db"})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, []string{"prepare", "agent", "agent", "agent"}, f.calls)
	require.Len(t, f.ends, 1)
	assert.True(t, f.ends[0].OK)
}

func TestNodeRoleRunJigs(t *testing.T) {
	plan := contract.NodeRoleRunPlan{NodeRoleID: 4, Run: 2, RunID: 40, Node: "n1", Role: "db", Jig: "agent", HasScript: true, TimeoutSec: 60}
	failed := temporal.NewApplicationError("task db failed on n1 with exit code 3", contract.ErrTypeTaskFailed, nil)
	lost := errors.New("activity heartbeat timeout")
	cases := []struct {
		name      string
		jig       string
		hasScript bool
		skip      string
		jigErr    error
		calls     []string
		ok        bool
		reason    string
	}{
		{"agent succeeds", "agent", true, "", nil, []string{"prepare", "agent"}, true, ""},
		{"agent reports a failure", "agent", true, "", failed, []string{"prepare", "agent"}, false, "exit code 3"},
		{"agent lost", "agent", true, "", lost, []string{"prepare", "agent"}, false, "no result from the node's agent"},
		{"local jig", "local", true, "", nil, []string{"prepare", "local"}, true, ""},
		{"ssh jig", "ssh", true, "", nil, []string{"prepare", "ssh"}, true, ""},
		{"ssh jig fails", "ssh", true, "", failed, []string{"prepare", "ssh"}, false, "exit code 3"},
		{"noop jig", "noop", true, "", nil, []string{"prepare", "noop"}, true, ""},
		{"nothing to run", "agent", false, "", nil, []string{"prepare", "noop"}, true, ""},
		{"not awaited any more", "agent", true, "noderole 4 is active", nil, []string{"prepare"}, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := plan
			p.Jig, p.HasScript, p.Skip = c.jig, c.hasScript, c.skip
			f := &noderoleFake{plan: p, jig: c.jigErr}
			env := newNodeRoleEnv(t, f)
			env.ExecuteWorkflow(contract.NodeRoleWorkflow, contract.NodeRoleRunInput{NodeRoleID: 4, Run: 2, Node: "n1", Role: "db"})
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var res contract.NodeRoleRunResult
			require.NoError(t, env.GetWorkflowResult(&res))
			assert.Equal(t, c.calls, f.calls)
			if c.skip != "" {
				assert.Empty(t, f.ends, "nothing finished")
				assert.Equal(t, c.skip, res.Skipped)
				return
			}
			require.Len(t, f.ends, 1)
			end := f.ends[0]
			assert.Equal(t, int64(4), end.NodeRoleID)
			assert.Equal(t, 2, end.Run)
			assert.Equal(t, c.ok, end.OK)
			if c.reason == "" {
				assert.Empty(t, end.Reason)
			} else {
				assert.Contains(t, end.Reason, c.reason)
			}
		})
	}
}

// annealerFake counts the annealer's activities.
type annealerFake struct {
	mu       sync.Mutex
	recovers int
	anneals  int
	// full is how many first rounds come back with a full batch.
	full int
}

func TestAnnealerRoundsAndKicks(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	workflows.Register(env)
	f := &annealerFake{full: 2}
	a := &activities.Activities{}
	env.OnActivity(a.RecoverTransitions, mock.Anything).Return(func(context.Context) ([]int64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.recovers++
		return []int64{9}, nil
	})
	env.OnActivity(a.Anneal, mock.Anything).Return(func(context.Context) (*contract.AnnealResult, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.anneals++
		return &contract.AnnealResult{More: f.anneals <= f.full}, nil
	})
	count := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.anneals
	}
	recovers := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.recovers
	}
	var afterStart, afterKicks, afterFallback int
	var recoversAtStart, recoversAfterKicks, recoversAfterFallback int
	env.RegisterDelayedCallback(func() {
		afterStart, recoversAtStart = count(), recovers()
		// Three kicks at once.
		for range 3 {
			env.SignalWorkflow(contract.SignalAnnealerKick, "snapshot committed")
		}
	}, time.Minute)
	env.RegisterDelayedCallback(func() { afterKicks, recoversAfterKicks = count(), recovers() }, 2*time.Minute)
	env.RegisterDelayedCallback(func() { afterFallback, recoversAfterFallback = count(), recovers() }, 7*time.Minute)

	env.ExecuteWorkflow(contract.AnnealerWorkflow, contract.AnnealerInput{})
	require.True(t, env.IsWorkflowCompleted())
	var cont *workflow.ContinueAsNewError
	require.ErrorAs(t, env.GetWorkflowError(), &cont, "a long run continues as new")
	assert.Equal(t, 1, recoversAtStart, "transitions checked at the start")
	assert.Equal(t, 1, recoversAfterKicks, "not at every kick")
	assert.Equal(t, 2, recoversAfterFallback, "and again when the fallback timer fired")
	assert.Equal(t, 3, afterStart, "two full batches, then one more round, then asleep")
	// The first kick wakes a round that takes the kicks already waiting; one
	// delivered while that round runs earns one more, never one each.
	assert.GreaterOrEqual(t, afterKicks, 4, "kicks wake the annealer")
	assert.LessOrEqual(t, afterKicks, 5, "three kicks at once do not cost three rounds")
	assert.Equal(t, afterKicks+1, afterFallback, "the fallback timer runs a round when no kick comes")
}

func TestNodeBootstrap(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	workflows.Register(env)
	a := &activities.Activities{}
	want := &contract.BootstrapResult{Node: "n1", Flag: models.FlagDiscovery, NodeRoles: []int64{1, 2}, Roles: []string{"os", "dns"}}
	env.OnActivity(a.BootstrapNode, mock.Anything, contract.NodeBootstrapInput{NodeID: 3, Node: "n1"}).Return(want, nil).Once()
	env.ExecuteWorkflow(contract.NodeBootstrapWorkflow, contract.NodeBootstrapInput{NodeID: 3, Node: "n1"})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got contract.BootstrapResult
	require.NoError(t, env.GetWorkflowResult(&got))
	assert.Equal(t, *want, got)
	env.AssertExpectations(t)
}

// However many kicks arrive, one run of the annealer stays bounded: when
// Temporal suggests it, or past annealerMaxEvents, it continues as new at
// the top of its next round instead of after 400 rounds.
func TestAnnealerContinuesAsNewWhenSuggested(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(env *testsuite.TestWorkflowEnvironment)
	}{
		{"suggested", func(env *testsuite.TestWorkflowEnvironment) { env.SetContinueAsNewSuggested(true) }},
		{"long history", func(env *testsuite.TestWorkflowEnvironment) { env.SetCurrentHistoryLength(4001) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts testsuite.WorkflowTestSuite
			env := loadedEnv(&ts)
			workflows.Register(env)
			var mu sync.Mutex
			anneals := 0
			a := &activities.Activities{}
			env.OnActivity(a.RecoverTransitions, mock.Anything).Return([]int64{}, nil)
			env.OnActivity(a.Anneal, mock.Anything).Return(func(context.Context) (*contract.AnnealResult, error) {
				mu.Lock()
				defer mu.Unlock()
				anneals++
				return &contract.AnnealResult{}, nil
			})
			// The first round runs; then the history is long (or Temporal
			// says so), and the next kick ends the run.
			env.RegisterDelayedCallback(func() {
				tc.setup(env)
				env.SignalWorkflow(contract.SignalAnnealerKick, "node n1 bootstrapped")
			}, time.Minute)
			env.ExecuteWorkflow(contract.AnnealerWorkflow, contract.AnnealerInput{})
			require.True(t, env.IsWorkflowCompleted())
			var cont *workflow.ContinueAsNewError
			require.ErrorAs(t, env.GetWorkflowError(), &cont)
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, 1, anneals, "it continued as new before a second round")
		})
	}
}
