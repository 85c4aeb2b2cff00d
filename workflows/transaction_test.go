package workflows_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

type TransactionSuite struct{ suiteBase }

func TestTransaction(t *testing.T) { suite.Run(t, new(TransactionSuite)) }

func txInput(graphs int) contract.TransactionInput {
	return contract.TransactionInput{TransactionID: txID, Graphs: graphs}
}

func graphPlan(nodes ...contract.PlannedNode) *contract.GraphPlan {
	gp := &contract.GraphPlan{GraphType: "deployment", Nodes: nodes}
	for _, n := range nodes {
		gp.Runs += n.Runs
	}
	return gp
}

func (s *TransactionSuite) outcome(env interface {
	GetWorkflowResult(any) error
}) contract.TransactionOutcome {
	var out contract.TransactionOutcome
	s.Require().NoError(env.GetWorkflowResult(&out))
	return out
}

// A graph that cannot be planned ends the transaction with the planner's
// message; it is not retried and no node workflow starts.
func (s *TransactionSuite) TestPlanError() {
	for name, planErr := range map[string]error{
		"non-retryable": temporal.NewNonRetryableApplicationError("cycle: a -> b -> a", contract.ErrTypePlan, nil),
		// The retry policy itself must not retry a PlanError either.
		"retryable type PlanError": temporal.NewApplicationError("cycle: a -> b -> a", contract.ErrTypePlan),
	} {
		s.Run(name, func() {
			env, f := s.newEnv()
			f.planErr = planErr
			env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

			s.Require().True(env.IsWorkflowCompleted())
			s.Require().NoError(env.GetWorkflowError())
			s.Equal([]string{"plan 0", "finish"}, f.calls())
			s.Require().Len(f.finishes, 1)
			s.Equal(txID, f.finishes[0].TransactionID)
			s.False(f.finishes[0].Stopped)
			s.Contains(f.finishes[0].FailReason, "graph 0 could not be planned")
			s.Contains(f.finishes[0].FailReason, "cycle: a -> b -> a")
			s.Equal("failed", s.outcome(env).Status)
		})
	}
}

// A dry run plans (and records) but starts no node workflow; later graphs
// are still planned.
func (s *TransactionSuite) TestDryRun() {
	env, f := s.newEnv()
	for gi := range 2 {
		gp := graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 2})
		gp.DryRun = true
		f.graphPlans[gi] = gp
	}
	env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]string{"plan 0", "plan 1", "finish"}, f.calls())
	s.Equal([]contract.FinishInput{{TransactionID: txID}}, f.finishes)
	s.Equal("succeeded", s.outcome(env).Status)
}

// Graphs run one after another: graph 1 is planned only once every node of
// graph 0 is done. Within a graph, node workflows run side by side and wake
// each other: node-b's run waits for node-a's and starts on node-a's signal,
// not on the fallback timer.
func (s *TransactionSuite) TestGraphsInOrderWithCrossNodeWakeUp() {
	env, f := s.newEnv()
	f.graphPlans[0] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1}, contract.PlannedNode{ID: 2, Name: "node-b", Runs: 2})
	f.graphPlans[1] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1})
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 101, RemoteKids: []contract.Peer{{RunID: 201, Node: "node-b"}}})
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{101: contract.RunPending},
		contract.NodeRun{ID: 201, Remote: []int64{101}},
		contract.NodeRun{ID: 202, Parents: []int64{201}})
	f.nodePlans[planKey{1, 1}] = nodePlan(nil, contract.NodeRun{ID: 111})
	f.checkStates = func(int, []int64) map[int64]string {
		return map[int64]string{101: contract.RunPending} // only the signal can release node-b
	}
	f.runTask = func(context.Context, contract.RunTaskInput) error {
		time.Sleep(5 * time.Millisecond) // node-b is waiting by now
		return nil
	}
	env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{101, 201, 202, 111}, f.runIDs())
	s.Less(f.runAt[201], 30*time.Second, "node-b was woken by node-a's signal, not by the fallback")
	calls := f.calls()
	plan1 := slices.Index(calls, "plan 1")
	s.Greater(plan1, slices.Index(calls, "run 202"), "graph 1 is planned after graph 0 finished: %v", calls)
	s.Equal("finish", calls[len(calls)-1])
	s.ElementsMatch([]contract.NodeRef{
		{GraphRef: contract.GraphRef{TransactionID: txID, GraphIndex: 0}, NodeID: 1},
		{GraphRef: contract.GraphRef{TransactionID: txID, GraphIndex: 0}, NodeID: 2},
		{GraphRef: contract.GraphRef{TransactionID: txID, GraphIndex: 1}, NodeID: 1},
	}, f.loads)
	s.Equal([]contract.FinishInput{{TransactionID: txID}}, f.finishes)
	s.Equal("succeeded", s.outcome(env).Status)
}

// A graph with failures stops the transaction: the failure reaches the
// other node (its dependent run is blocked), and the next graph is never
// planned. The transaction's status comes from the runs, so no FailReason.
func (s *TransactionSuite) TestFailedGraphStopsLaterGraphs() {
	env, f := s.newEnv()
	f.graphPlans[0] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1}, contract.PlannedNode{ID: 2, Name: "node-b", Runs: 2})
	f.graphPlans[1] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1})
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 101, RemoteKids: []contract.Peer{{RunID: 201, Node: "node-b"}}})
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{101: contract.RunPending},
		contract.NodeRun{ID: 201, Remote: []int64{101}},
		contract.NodeRun{ID: 202})
	f.nodePlans[planKey{1, 1}] = nodePlan(nil, contract.NodeRun{ID: 111})
	f.checkStates = func(int, []int64) map[int64]string {
		return map[int64]string{101: contract.RunPending}
	}
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 101 {
			return temporal.NewApplicationError("exit 1", contract.ErrTypeTaskFailed)
		}
		return nil
	}
	env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int{0}, f.planned, "graph 1 must not be planned")
	s.ElementsMatch([]int64{101, 202}, f.runIDs())
	s.Equal([]contract.RunFailure{{Blocked: []int64{201}}}, f.failures)
	s.Empty(f.checks, "node-b learnt of the failure from node-a's signal")
	s.Equal([]contract.FinishInput{{TransactionID: txID}}, f.finishes)
}

// A node workflow that dies (here: its plan cannot be loaded) has its runs
// abandoned so nothing waits for them, and the transaction fails naming it.
func (s *TransactionSuite) TestLostNodeWorkflow() {
	env, f := s.newEnv()
	f.graphPlans[0] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1}, contract.PlannedNode{ID: 2, Name: "node-b", Runs: 1})
	f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 101})
	f.loadErr[2] = temporal.NewNonRetryableApplicationError("no such node", "BadInput", nil)
	env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int{0}, f.planned)
	s.Equal([]int64{101}, f.runIDs())
	s.Require().Len(f.abandons, 1)
	s.Equal(contract.NodeRef{GraphRef: contract.GraphRef{TransactionID: txID}, NodeID: 2}, f.abandons[0].NodeRef)
	s.Contains(f.abandons[0].Reason, "node workflow ended abnormally")
	s.Contains(f.abandons[0].Reason, "no such node")
	s.Require().Len(f.finishes, 1)
	s.Contains(f.finishes[0].FailReason, "node-b")
	s.Contains(f.finishes[0].FailReason, "ended abnormally")
	s.NotContains(f.finishes[0].FailReason, "node-a")
}

// At most MaxNodesInFlight node workflows run at once; each gets its
// readable ID and its input. The node workflow is mocked here.
func (s *TransactionSuite) TestMaxNodesInFlight() {
	env, f := s.newEnv()
	var nodes []contract.PlannedNode
	for i := range 5 {
		nodes = append(nodes, contract.PlannedNode{ID: int64(i + 1), Name: fmt.Sprintf("node-%d", i+1), Runs: 1})
	}
	f.graphPlans[0] = graphPlan(nodes...)
	f.graphPlans[0].MaxNodesInFlight = 2
	var (
		mu               sync.Mutex
		running, maxRuns int
		ids              []string
		inputs           []contract.NodeInput
	)
	env.OnWorkflow(contract.NodeWorkflow, mock.Anything, mock.Anything).Return(
		func(ctx workflow.Context, in contract.NodeInput) (*contract.NodeResult, error) {
			mu.Lock()
			running++
			maxRuns = max(maxRuns, running)
			ids = append(ids, workflow.GetInfo(ctx).WorkflowExecution.ID)
			inputs = append(inputs, in)
			mu.Unlock()
			if err := workflow.Sleep(ctx, time.Minute); err != nil {
				return nil, err
			}
			mu.Lock()
			running--
			mu.Unlock()
			return &contract.NodeResult{Succeeded: 1}, nil
		})
	in := txInput(1)
	in.HeartbeatTimeoutSec = 7
	env.ExecuteWorkflow(contract.TransactionWorkflow, in)

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal(2, maxRuns)
	s.ElementsMatch([]string{"tx-T/node-1", "tx-T/node-2", "tx-T/node-3", "tx-T/node-4", "tx-T/node-5"}, ids)
	s.Require().Len(inputs, 5)
	s.Contains(inputs, contract.NodeInput{
		GraphRef:  contract.GraphRef{TransactionID: txID, GraphIndex: 0},
		GraphType: "deployment", NodeID: 3, NodeName: "node-3", HeartbeatTimeoutSec: 7,
	})
	s.Equal([]contract.FinishInput{{TransactionID: txID}}, f.finishes)
}

// cancelDuringRun sets up a transaction whose node-a is running run 1 when
// the transaction is cancelled; run 2 depends on run 1, run 3 does not.
func (s *TransactionSuite) cancelDuringRun() *fake {
	env, f := s.newEnv()
	f.graphPlans[0] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 3})
	f.graphPlans[1] = graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1})
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 1},
		contract.NodeRun{ID: 2, Parents: []int64{1}},
		contract.NodeRun{ID: 3},
	)
	cancelled := make(chan struct{})
	var once sync.Once
	env.SetOnActivityCanceledListener(func(info *activity.Info) {
		if info.ActivityType.Name == "RunTaskOnNode" || info.ActivityType.Name == "RunChainOnNode" {
			once.Do(func() { close(cancelled) })
		}
	})
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 1 {
			env.CancelWorkflow()
			select {
			case <-cancelled:
			case <-time.After(3 * time.Second):
			}
			// The run ends once the stop has cut its chain, as when the
			// agent reports after the stop.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
				f.mu.Lock()
				cut := len(f.cuts) > 0
				f.mu.Unlock()
				if cut {
					break
				}
			}
		}
		return nil
	}
	env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(2))

	s.Require().True(env.IsWorkflowCompleted())
	err := env.GetWorkflowError()
	s.Require().Error(err)
	s.True(temporal.IsCanceledError(err), "got %v", err)
	return f
}

// Cancelling the transaction while a run is in flight dispatches nothing
// more, cancels the runs that never started, plans no further graph, and
// records the end with Stopped.
func (s *TransactionSuite) TestCancelWhileRunInFlight() {
	f := s.cancelDuringRun()
	s.Equal([]int64{1}, f.runIDs())
	s.Equal([]int{0}, f.planned)
	s.Contains(f.cancelled(), int64(3))
	s.True(slices.Contains(f.cancelled(), 2) || slices.Contains(f.blocked(), 2),
		"run 2 must end cancelled or blocked, not stay pending: cancelled %v, blocked %v", f.cancelled(), f.blocked())
	s.Equal([]contract.FinishInput{{TransactionID: txID, Stopped: true}}, f.finishes)
	calls := f.calls()
	s.Equal("finish", calls[len(calls)-1])
	s.Equal([]int64{1}, f.cuts, "runs 1 to 3 went as a chain, cut in Postgres as soon as the stop came")
}

// Known bug (see the report): when RunTaskOnNode ends as cancelled (the
// transaction stopped before an agent took the run; the test environment
// cancels an in-flight activity at once), node.go records the run as FAILED
// ("no result from the node's agent: canceled") and BLOCKS its descendants,
// instead of counting them as cancelled.
func (s *TransactionSuite) TestCancelledRunIsNotRecordedAsFailed() {
	f := s.cancelDuringRun()
	for _, rf := range f.failures {
		s.Zero(rf.RunID, "a cancelled run must not be recorded as failed: %+v", rf)
		s.Empty(rf.Blocked, "a stop must not block runs: %+v", rf)
	}
	s.Equal([]int64{1, 2, 3}, f.cancelled())
}

// Over the failure threshold, the graph's other node workflows are
// stopped (their pending runs cancelled) and the transaction says why;
// under it, a failed node does not stop the others.
func (s *TransactionSuite) TestFailureThreshold() {
	for name, tc := range map[string]struct {
		threshold   int
		wantAborted bool
	}{
		"0% aborts on the first failed node": {0, true},
		"50% of 2 nodes tolerates one":       {50, false},
	} {
		s.Run(name, func() {
			env, f := s.newEnv()
			gp := graphPlan(contract.PlannedNode{ID: 1, Name: "node-a", Runs: 1}, contract.PlannedNode{ID: 2, Name: "node-b", Runs: 2})
			threshold := tc.threshold
			gp.FailureThreshold = &threshold
			f.graphPlans[0] = gp
			f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 101})
			f.nodePlans[planKey{0, 2}] = nodePlan(nil, contract.NodeRun{ID: 201}, contract.NodeRun{ID: 202, Parents: []int64{201}})
			f.runTask = func(ctx context.Context, in contract.RunTaskInput) error {
				switch in.RunID {
				case 101:
					return temporal.NewApplicationError("exit 1", contract.ErrTypeTaskFailed)
				case 201:
					// node-b is busy while node-a fails.
					time.Sleep(50 * time.Millisecond)
				}
				return nil
			}
			env.ExecuteWorkflow(contract.TransactionWorkflow, txInput(1))

			s.Require().True(env.IsWorkflowCompleted())
			s.Require().NoError(env.GetWorkflowError())
			s.Require().Len(f.finishes, 1)
			if tc.wantAborted {
				s.Contains(f.finishes[0].FailReason, "over the failure threshold of 0%")
				s.NotContains(f.runIDs(), int64(202), "node-b was stopped before its next run")
			} else {
				s.Empty(f.finishes[0].FailReason)
				s.Contains(f.runIDs(), int64(202), "node-b finished its runs")
			}
		})
	}
}
