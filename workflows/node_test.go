package workflows_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/suite"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/workflows/contract"
)

type NodeSuite struct{ suiteBase }

func TestNodeRun(t *testing.T) { suite.Run(t, new(NodeSuite)) }

func (s *NodeSuite) result(env interface {
	GetWorkflowResult(any) error
}) contract.NodeResult {
	var res contract.NodeResult
	s.Require().NoError(env.GetWorkflowResult(&res))
	return res
}

// Runs go one at a time, in plan order, each only once its local parents
// have succeeded; no-op runs are recorded without reaching the agent, and
// runs already finished in Postgres are not run again.
func (s *NodeSuite) TestRunsInPlanOrderAfterLocalParents() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 6, State: contract.RunSkipped},
		contract.NodeRun{ID: 1, Task: "hostname", TimeoutSec: 30},
		contract.NodeRun{ID: 2, Parents: []int64{1}, NoOp: true},
		contract.NodeRun{ID: 3, Parents: []int64{2}},
		contract.NodeRun{ID: 4, Parents: []int64{1, 3}},
		contract.NodeRun{ID: 5, Parents: []int64{6}},
		contract.NodeRun{ID: 7, State: contract.RunSucceeded},
	)
	var hb, stc time.Duration
	f.runTask = func(ctx context.Context, in contract.RunTaskInput) error {
		if in.RunID == 1 {
			info := activity.GetInfo(ctx)
			hb, stc = info.HeartbeatTimeout, info.StartToCloseTimeout
		}
		return nil
	}
	in := nodeInput("node-a", 1)
	// Long enough that the test environment, which times heartbeats in
	// wall time, never times out run 1 on a loaded machine.
	in.HeartbeatTimeoutSec = 50
	env.ExecuteWorkflow(contract.NodeWorkflow, in)

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]string{"load 0/1", "run 1", "noop 2", "run 3", "run 4", "run 5", "end node 1 success"}, f.calls())
	s.Equal([]contract.RunTaskInput{
		{RunID: 1, Task: "hostname", Node: "node-a"},
		{RunID: 3, Task: "task3", Node: "node-a"},
		{RunID: 4, Task: "task4", Node: "node-a"},
		{RunID: 5, Task: "task5", Node: "node-a"},
	}, f.runs)
	s.Equal(1, f.maxRuns, "runs of one node must not overlap")
	s.Equal(50*time.Second, hb, "heartbeat timeout comes from the input")
	s.Equal(30*time.Second+2*50*time.Second, stc, "start-to-close is the task timeout plus two heartbeats")
	s.Equal(contract.NodeResult{Succeeded: 7}, s.result(env))
}

// A task that failed on the node (TaskFailed: the agent's report already
// recorded it) is not recorded again; its descendants are blocked in one
// write and unrelated runs still run.
func (s *NodeSuite) TestTaskFailedBlocksDescendantsOnly() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 1},
		contract.NodeRun{ID: 2, Parents: []int64{1}},
		contract.NodeRun{ID: 3},
		contract.NodeRun{ID: 4, Parents: []int64{2}},
		contract.NodeRun{ID: 5, Parents: []int64{3}},
	)
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 1 {
			return temporal.NewApplicationError("task task1 failed on node-a with exit code 2", contract.ErrTypeTaskFailed)
		}
		return nil
	}
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{1, 3, 5}, f.runIDs())
	s.Equal([]contract.RunFailure{{Blocked: []int64{2, 4}}}, f.failures,
		"only the descendants are written; the failed run itself was recorded by the agent's report")
	s.Less(f.index("fail 0 blocked [2 4]"), f.index("run 3"), "descendants are blocked as soon as the failure is known")
	s.Equal(contract.NodeResult{Succeeded: 2, Failed: 1, Blocked: 2}, s.result(env))
}

// Task retries re-run a task that failed on the node, alone (RunTaskOnNode)
// or as one of a chain, where it is retried alone and the chain's runs
// after it go on once it succeeds.
func (s *NodeSuite) TestTaskRetries() {
	for name, tc := range map[string]struct {
		runs   []contract.NodeRun
		chains [][]int64
		ids    []int64
	}{
		"alone": {
			// Run 1 wakes another node when it ends, so it runs alone.
			runs: []contract.NodeRun{{ID: 1, Retries: 2, RemoteKids: []contract.Peer{{RunID: 30, Node: "node-c"}}}, {ID: 2, Parents: []int64{1}}},
			ids:  []int64{1, 1, 1, 2},
		},
		"in a chain": {
			runs:   []contract.NodeRun{{ID: 2}, {ID: 1, Parents: []int64{2}, Retries: 2}, {ID: 3, Parents: []int64{1}}, {ID: 4, Parents: []int64{3}}},
			chains: [][]int64{{2, 1, 3, 4}, {3, 4}},
			ids:    []int64{2, 1, 1, 1, 3, 4},
		},
	} {
		s.Run(name, func() {
			env, f := s.newEnv()
			f.nodePlans[planKey{0, 1}] = nodePlan(nil, tc.runs...)
			attempts := 0
			f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
				if in.RunID == 1 {
					attempts++
					if attempts < 3 {
						return temporal.NewApplicationError("exit 1", contract.ErrTypeTaskFailed)
					}
				}
				return nil
			}
			env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

			s.Require().True(env.IsWorkflowCompleted())
			s.Require().NoError(env.GetWorkflowError())
			s.Equal(tc.chains, f.chains)
			s.Equal(tc.ids, f.runIDs())
			s.Empty(f.failures)
			s.Equal(contract.NodeResult{Succeeded: len(tc.runs)}, s.result(env))
		})
	}
}

// A node busy with something else past the activity's own wait: the
// workflow pauses and tries again, spending none of the run's retries
// (retries 0 here) and recording no failure.
func (s *NodeSuite) TestBusyNodeIsWaitedFor() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 1}, contract.NodeRun{ID: 2, Parents: []int64{1}})
	calls := 0
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 1 {
			calls++
			if calls < 4 {
				return temporal.NewNonRetryableApplicationError("node node-a is busy: noderole 9 (db) is in transition", contract.ErrTypeNodeBusy, nil)
			}
		}
		return nil
	}
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{1, 1, 1, 1, 2}, f.runIDs())
	s.Empty(f.failures)
	s.Equal(contract.NodeResult{Succeeded: 2}, s.result(env))
}

// A run whose agent never reported (a heartbeat timeout, any error other
// than TaskFailed) still says running in Postgres: the workflow records the
// failure itself, then blocks the descendants.
func (s *NodeSuite) TestLostAgentRecordsFailure() {
	cases := map[string]error{
		"heartbeat timeout": temporal.NewTimeoutError(enums.TIMEOUT_TYPE_HEARTBEAT, nil),
		"other error":       temporal.NewApplicationError("agent connection reset", "AgentGone"),
		"plain error":       errors.New("agent connection reset"),
	}
	for name, runErr := range cases {
		s.Run(name, func() {
			env, f := s.newEnv()
			// Run 1 wakes another node when it ends, so it runs alone
			// (RunTaskOnNode), not in a chain (TestChainLostMidway).
			f.nodePlans[planKey{0, 1}] = nodePlan(nil,
				contract.NodeRun{ID: 1, RemoteKids: []contract.Peer{{RunID: 30, Node: "node-c"}}},
				contract.NodeRun{ID: 2, Parents: []int64{1}},
				contract.NodeRun{ID: 3},
			)
			f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
				if in.RunID == 1 {
					return runErr
				}
				return nil
			}
			env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

			s.Require().True(env.IsWorkflowCompleted())
			s.Require().NoError(env.GetWorkflowError())
			s.Equal([]int64{1, 3}, f.runIDs(), "no retry (Retries is 0), and the unrelated run still runs")
			s.Require().Len(f.failures, 2)
			s.Equal(int64(1), f.failures[0].RunID)
			s.Contains(f.failures[0].Reason, "no result from the node's agent")
			if name == "heartbeat timeout" {
				s.Contains(f.failures[0].Reason, "Heartbeat")
			} else {
				s.Contains(f.failures[0].Reason, "agent connection reset")
			}
			s.Empty(f.failures[0].Blocked)
			s.Equal(contract.RunFailure{Blocked: []int64{2}}, f.failures[1])
			s.Equal(contract.NodeResult{Succeeded: 1, Failed: 1, Blocked: 1}, s.result(env))
		})
	}
}

// A RunTaskOnNode that timed out before any agent acknowledged its run (the
// worker died holding the activity, before it dispatched) is delivered
// again without spending the task's retries (0 here); one the agent had
// is the run's failure (TestLostAgentRecordsFailure); and a run no agent
// ever takes fails after a few deliveries, saying so.
func (s *NodeSuite) TestUndeliveredRunIsDeliveredAgain() {
	s.Run("delivered on the third try", func() {
		env, f := s.newEnv()
		f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 1}, contract.NodeRun{ID: 2, Parents: []int64{1}})
		calls := 0
		f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
			if in.RunID == 1 {
				calls++
				if calls < 3 {
					return temporal.NewTimeoutError(enums.TIMEOUT_TYPE_HEARTBEAT, nil)
				}
			}
			return nil
		}
		f.delivery = func(int64) contract.RunDelivery { return contract.RunDelivery{State: contract.RunPending} }
		env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))
		s.Require().True(env.IsWorkflowCompleted())
		s.Require().NoError(env.GetWorkflowError())
		s.Equal([]int64{1, 1, 1, 2}, f.runIDs())
		s.Empty(f.failures)
		s.Equal(contract.NodeResult{Succeeded: 2}, s.result(env))
	})
	s.Run("never delivered", func() {
		env, f := s.newEnv()
		f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 1})
		f.runTask = func(context.Context, contract.RunTaskInput) error {
			return temporal.NewTimeoutError(enums.TIMEOUT_TYPE_HEARTBEAT, nil)
		}
		f.delivery = func(int64) contract.RunDelivery {
			return contract.RunDelivery{State: contract.RunRunning, Attempt: 3}
		}
		env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))
		s.Require().True(env.IsWorkflowCompleted())
		s.Require().NoError(env.GetWorkflowError())
		s.Len(f.runIDs(), 6, "the first delivery and five more")
		s.Require().NotEmpty(f.failures)
		s.Contains(f.failures[0].Reason, "never reached the agent of node-a after 6 deliveries")
	})
}

// A run with a remote parent is not dispatched until a RunsFinished signal
// says that parent succeeded; the node's other runs do not wait for it.
func (s *NodeSuite) TestRemoteParentSignalSuccess() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunPending},
		contract.NodeRun{ID: 10, Remote: []int64{5}},
		contract.NodeRun{ID: 11},
		contract.NodeRun{ID: 12, Parents: []int64{10}},
	)
	env.RegisterDelayedCallback(func() {
		// A state for a run this node does not wait for changes nothing.
		env.SignalWorkflow(contract.SignalRunsFinished, contract.RunsFinished{States: map[int64]string{99: contract.RunFailed}})
	}, 2*time.Second)
	env.RegisterDelayedCallback(func() {
		s.Equal([]int64{11}, f.runIDs(), "run 10 must wait for its remote parent")
		env.SignalWorkflow(contract.SignalRunsFinished, contract.RunsFinished{States: map[int64]string{5: contract.RunSucceeded}})
	}, 5*time.Second)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{11, 10, 12}, f.runIDs())
	s.Equal(5*time.Second, f.runAt[10], "dispatched when the signal came")
	s.Empty(f.checks, "the signal came before the fallback timer")
	s.Empty(f.failures)
	s.Equal(contract.NodeResult{Succeeded: 3}, s.result(env))
}

// A signal that the remote parent failed blocks the waiting run and its
// descendants, and the nodes waiting for those hear that they are blocked.
func (s *NodeSuite) TestRemoteParentSignalFailure() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunRunning},
		contract.NodeRun{ID: 10, Remote: []int64{5}},
		contract.NodeRun{ID: 11},
		contract.NodeRun{ID: 12, Parents: []int64{10}, RemoteKids: []contract.Peer{{RunID: 30, Node: "node-c"}}},
	)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalRunsFinished, contract.RunsFinished{States: map[int64]string{5: contract.RunFailed}})
	}, 5*time.Second)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{11}, f.runIDs())
	s.Equal([]contract.RunFailure{{Blocked: []int64{10, 12}}}, f.failures)
	s.Equal([]signal{{WorkflowID: "tx-T/node-c", Name: contract.SignalRunsFinished,
		States: map[int64]string{12: contract.RunBlocked}}}, f.signals)
	s.Equal(contract.NodeResult{Succeeded: 1, Blocked: 2}, s.result(env))
}

// Without a signal, the fallback timer reads the remote states from
// Postgres (CheckRunStates), backing off, and the run proceeds once they
// report success.
func (s *NodeSuite) TestRemoteParentTimerFallback() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunPending, 6: contract.RunSucceeded},
		contract.NodeRun{ID: 10, Remote: []int64{5, 6}},
	)
	f.checkStates = func(call int, ids []int64) map[int64]string {
		if call < 2 {
			return map[int64]string{5: contract.RunRunning}
		}
		return map[int64]string{5: contract.RunSucceeded}
	}
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([][]int64{{5}, {5}}, f.checks, "only the remote parent not yet known to have succeeded is read")
	s.Equal([]int64{10}, f.runIDs())
	s.Equal(90*time.Second, f.runAt[10], "polls after 30s, then 60s later")
	s.Equal(contract.NodeResult{Succeeded: 1}, s.result(env))
}

// A remote parent that already succeeded when the node plan was loaded
// does not make the run wait.
func (s *NodeSuite) TestRemoteParentAlreadySucceeded() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunSucceeded, 6: contract.RunSkipped},
		contract.NodeRun{ID: 10, Remote: []int64{5, 6}},
	)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([]int64{10}, f.runIDs())
	s.Equal(time.Duration(0), f.runAt[10])
	s.Empty(f.checks)
	s.Equal(contract.NodeResult{Succeeded: 1}, s.result(env))
}

// A remote parent that had already failed blocks at once.
func (s *NodeSuite) TestRemoteParentAlreadyFailed() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunCancelled},
		contract.NodeRun{ID: 10, Remote: []int64{5}},
	)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Empty(f.runs)
	s.Equal([]contract.RunFailure{{Blocked: []int64{10}}}, f.failures)
	s.Equal(contract.NodeResult{Blocked: 1}, s.result(env))
}

// A finished run wakes the nodes waiting for it: one signal per node, with
// the states of all its runs they wait for.
func (s *NodeSuite) TestWakesRemoteKids() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 1, RemoteKids: []contract.Peer{{RunID: 20, Node: "node-c"}, {RunID: 21, Node: "node-b"}, {RunID: 22, Node: "node-c"}}},
		contract.NodeRun{ID: 2, NoOp: true, RemoteKids: []contract.Peer{{RunID: 23, Node: "node-b"}}},
	)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	// The mock of SignalExternalWorkflow runs on its own goroutine, so the
	// order in which the signals reach it is not the order they were sent.
	s.ElementsMatch([]signal{
		{WorkflowID: "tx-T/node-b", Name: contract.SignalRunsFinished, States: map[int64]string{1: contract.RunSucceeded}},
		{WorkflowID: "tx-T/node-c", Name: contract.SignalRunsFinished, States: map[int64]string{1: contract.RunSucceeded}},
		{WorkflowID: "tx-T/node-b", Name: contract.SignalRunsFinished, States: map[int64]string{2: contract.RunSucceeded}},
	}, f.signals)
	s.Equal(contract.NodeResult{Succeeded: 2}, s.result(env))
}

// Cancelling a node workflow while it waits for another node cancels its
// pending runs and runs nothing.
func (s *NodeSuite) TestCancelWhileWaiting() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 2}] = nodePlan(map[int64]string{5: contract.RunPending},
		contract.NodeRun{ID: 9},
		contract.NodeRun{ID: 10, Remote: []int64{5}},
		contract.NodeRun{ID: 11, Parents: []int64{10}},
	)
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Second)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-b", 2))

	s.Require().True(env.IsWorkflowCompleted())
	err := env.GetWorkflowError()
	s.Require().Error(err)
	s.True(temporal.IsCanceledError(err), "got %v", err)
	s.Equal([]int64{9}, f.runIDs())
	s.Empty(f.failures)
	s.Require().Len(f.cancels, 1)
	s.Equal([]int64{10, 11}, f.cancels[0].RunIDs)
	s.Contains(f.cancels[0].Reason, "cancelled")
}

// A node plan that cannot be loaded fails the node workflow (the transaction
// then abandons the node).
func (s *NodeSuite) TestLoadPlanFails() {
	env, f := s.newEnv()
	f.loadErr[1] = temporal.NewNonRetryableApplicationError("bad transaction id", "BadInput", nil)
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	err := env.GetWorkflowError()
	s.Require().Error(err)
	s.Contains(err.Error(), "load plan of node node-a")
	s.Equal([]string{"load 0/1"}, f.calls(), "BadInput is not retried")
}

// A node's ready runs with no cross-node wait between them go to its agent
// as one RunChainOnNode activity: the chain stops before a run that does
// not go to the agent (a no-op here) and after a run with dependants
// on other nodes, which are woken as soon as it ends. Each run is still
// run once, in plan order.
func (s *NodeSuite) TestChainsOfReadyRuns() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 1},
		contract.NodeRun{ID: 2, Parents: []int64{1}},
		contract.NodeRun{ID: 3, Parents: []int64{2}, RemoteKids: []contract.Peer{{RunID: 30, Node: "node-c"}}},
		contract.NodeRun{ID: 4, Parents: []int64{3}},
		contract.NodeRun{ID: 5, Parents: []int64{4}},
		contract.NodeRun{ID: 6, Parents: []int64{5}, NoOp: true},
		contract.NodeRun{ID: 7, Parents: []int64{6}},
	)
	// The wake-up goes out in the same workflow task as the chain of run
	// 4, and the mock of SignalExternalWorkflow runs on a goroutine of its
	// own: run 4 waits for it rather than race it. Sent only at the end of
	// the node, it would never come while run 4 runs.
	wokenDuringRun4 := false
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 4 {
			wokenDuringRun4 = f.waitFor("signal tx-T/node-c", 10*time.Second)
		}
		return nil
	}
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([][]int64{{1, 2, 3}, {4, 5}}, f.chains)
	s.Equal([]int64{1, 2, 3, 4, 5, 7}, f.runIDs(), "6 has nothing to run, 7 is left alone")
	s.True(wokenDuringRun4, "node-c is woken when run 3 ends, not at the end of the node")
	s.Equal(contract.NodeResult{Succeeded: 7}, s.result(env))
}

// A chain whose agent is lost mid-way: the run that succeeded counts, the
// run that never reported fails saying so, its descendants are blocked,
// and the runs of the chain that no failure touches run after it.
func (s *NodeSuite) TestChainLostMidway() {
	env, f := s.newEnv()
	f.nodePlans[planKey{0, 1}] = nodePlan(nil,
		contract.NodeRun{ID: 1},
		contract.NodeRun{ID: 2, Parents: []int64{1}},
		contract.NodeRun{ID: 3, Parents: []int64{2}},
		contract.NodeRun{ID: 4, Parents: []int64{1}},
	)
	f.runTask = func(_ context.Context, in contract.RunTaskInput) error {
		if in.RunID == 2 {
			return temporal.NewTimeoutError(enums.TIMEOUT_TYPE_HEARTBEAT, nil)
		}
		return nil
	}
	env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	s.Equal([][]int64{{1, 2, 3, 4}}, f.chains)
	s.Equal([]int64{1, 2, 4}, f.runIDs())
	s.Equal([]contract.LostChain{{Head: 1, Reason: "no result from the node's agent: Test timeout (type: Heartbeat)"}}, f.lost,
		"the lost chain is ended in one step in Postgres, failing run 2 with the reason")
	s.Equal([]contract.RunFailure{{Blocked: []int64{3}}}, f.failures)
	s.Equal(contract.NodeResult{Succeeded: 2, Failed: 1, Blocked: 1}, s.result(env))
}

// A chain whose dispatch keeps failing (its first run never goes out) is
// not handed out again and again: the run goes alone, with its own retries
// (none here), and fails, saying why; a run no agent took is handed out
// again, and fails after maxRedeliveries.
func (s *NodeSuite) TestChainThatNeverGoesOut() {
	s.Run("dispatch fails", func() {
		env, f := s.newEnv()
		f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 1}, contract.NodeRun{ID: 2, Parents: []int64{1}})
		f.chainErr = temporal.NewApplicationError("lock the node of run 1: connection refused", "DBError")
		f.runTask = func(context.Context, contract.RunTaskInput) error {
			return temporal.NewApplicationError("lock the node of run 1: connection refused", "DBError")
		}
		env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))
		s.Require().True(env.IsWorkflowCompleted())
		s.Require().NoError(env.GetWorkflowError())
		s.Len(f.chains, 1, "the chain is not handed out again")
		s.Equal([]int64{1}, f.runIDs(), "run 1 went alone once (retries 0)")
		s.Require().Len(f.failures, 2)
		s.Contains(f.failures[0].Reason, "connection refused")
		s.Equal([]int64{2}, f.failures[1].Blocked)
	})
	s.Run("never taken", func() {
		env, f := s.newEnv()
		f.nodePlans[planKey{0, 1}] = nodePlan(nil, contract.NodeRun{ID: 1}, contract.NodeRun{ID: 2, Parents: []int64{1}})
		f.runTask = func(context.Context, contract.RunTaskInput) error {
			return temporal.NewTimeoutError(enums.TIMEOUT_TYPE_HEARTBEAT, nil)
		}
		f.delivery = func(int64) contract.RunDelivery { return contract.RunDelivery{State: contract.RunRunning} }
		env.ExecuteWorkflow(contract.NodeWorkflow, nodeInput("node-a", 1))
		s.Require().True(env.IsWorkflowCompleted())
		s.Require().NoError(env.GetWorkflowError())
		s.Len(f.chains, 6, "the first delivery and five more")
		s.Require().NotEmpty(f.failures)
		s.Contains(f.failures[0].Reason, "never reached the agent of node-a after 6 deliveries")
	})
}
