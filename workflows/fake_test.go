package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/suite"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// txID is the transaction every test runs; node workflows are tx-T/<node>.
const txID = "T"

// planKey addresses a node's plan of one graph.
type planKey struct {
	graph int
	node  int64
}

// signal is one SignalExternalWorkflow that reached the mock (its target was
// not a workflow running in the test environment).
type signal struct {
	WorkflowID string
	Name       string
	States     map[int64]string
}

// fake stands in for the activities (and so for Postgres and the agents): it
// answers from the plans the test gives it and records every call, in order.
type fake struct {
	env *testsuite.TestWorkflowEnvironment

	// Inputs, set by the test before the workflow runs.
	graphPlans map[int]*contract.GraphPlan
	planErr    error
	nodePlans  map[planKey]*contract.NodePlan
	loadErr    map[int64]error // LoadNodePlan failure by node id
	// runTask decides how RunTaskOnNode ends; nil means success.
	runTask func(ctx context.Context, in contract.RunTaskInput) error
	// delivery answers RunDelivery; nil means the agent acknowledged the
	// run (a timeout is then the run's failure).
	delivery func(runID int64) contract.RunDelivery
	// checkStates answers CheckRunStates; call counts from 1.
	checkStates func(call int, ids []int64) map[int64]string

	mu       sync.Mutex
	log      []string // every call, in the order the activities ran
	planned  []int
	loads    []contract.NodeRef
	runs     []contract.RunTaskInput
	runAt    map[int64]time.Duration // workflow time (since start) a run was dispatched
	loadAt   time.Time
	noops    []int64
	failures []contract.RunFailure
	cancels  []contract.RunsToCancel
	checks   [][]int64
	abandons []contract.NodeAbandon
	finishes []contract.FinishInput
	ends     []contract.NodeGraphEnd
	signals  []signal
	chains   [][]int64            // the runs of each RunChainOnNode call
	cuts     []int64              // the chains cut (by their head) on a stop
	lost     []contract.LostChain // the chains ended by EndLostChain
	chainErr error                // RunChainOnNode fails with it before dispatching, if set
	states   map[int64]string     // runs a chain left running when it did not report
	inFlight int                  // RunTaskOnNode calls running at once
	maxRuns  int
}

func newFake(env *testsuite.TestWorkflowEnvironment) *fake {
	f := &fake{
		env:        env,
		graphPlans: map[int]*contract.GraphPlan{},
		nodePlans:  map[planKey]*contract.NodePlan{},
		loadErr:    map[int64]error{},
		runAt:      map[int64]time.Duration{},
		states:     map[int64]string{},
	}
	a := &activities.Activities{}
	env.OnActivity(a.PlanGraph, mock.Anything, mock.Anything).Return(
		func(_ context.Context, ref contract.GraphRef) (*contract.GraphPlan, error) {
			f.record(fmt.Sprintf("plan %d", ref.GraphIndex), func() { f.planned = append(f.planned, ref.GraphIndex) })
			if ref.TransactionID != txID {
				return nil, fmt.Errorf("PlanGraph: unexpected transaction %q", ref.TransactionID)
			}
			if f.planErr != nil {
				return nil, f.planErr
			}
			gp, ok := f.graphPlans[ref.GraphIndex]
			if !ok {
				return nil, fmt.Errorf("PlanGraph: no plan for graph %d", ref.GraphIndex)
			}
			return gp, nil
		})
	env.OnActivity(a.LoadNodePlan, mock.Anything, mock.Anything).Return(
		func(_ context.Context, ref contract.NodeRef) (*contract.NodePlan, error) {
			f.record(fmt.Sprintf("load %d/%d", ref.GraphIndex, ref.NodeID), func() {
				f.loads = append(f.loads, ref)
				if f.loadAt.IsZero() {
					f.loadAt = env.Now()
				}
			})
			if err := f.loadErr[ref.NodeID]; err != nil {
				return nil, err
			}
			np, ok := f.nodePlans[planKey{ref.GraphIndex, ref.NodeID}]
			if !ok {
				return nil, fmt.Errorf("LoadNodePlan: no plan for node %d of graph %d", ref.NodeID, ref.GraphIndex)
			}
			return np, nil
		})
	env.OnActivity(a.RunTaskOnNode, mock.Anything, mock.Anything).Return(
		func(ctx context.Context, in contract.RunTaskInput) (*contract.RunOutcome, error) {
			if err := f.runOne(ctx, in); err != nil {
				return nil, err
			}
			return &contract.RunOutcome{}, nil
		})
	// A chain runs its runs one after the other through runTask, as the
	// API dispatches them, and ends at the first failure: a TaskFailed
	// (the agent's report) completes it with the states; any other error
	// is the chain activity's own, its run left running.
	env.OnActivity(a.RunChainOnNode, mock.Anything, mock.Anything).Return(
		func(ctx context.Context, in contract.RunChainInput) (*contract.ChainOutcome, error) {
			ids := make([]int64, len(in.Runs))
			for i, r := range in.Runs {
				ids[i] = r.RunID
			}
			f.mu.Lock()
			f.chains = append(f.chains, ids)
			chainErr := f.chainErr
			f.mu.Unlock()
			if chainErr != nil {
				return nil, chainErr
			}
			out := &contract.ChainOutcome{States: map[int64]string{}}
			for i, r := range in.Runs {
				f.mu.Lock()
				cut := slices.Contains(f.cuts, ids[0])
				f.mu.Unlock()
				if cut {
					return out, nil // cut on a stop: the API hands out no more
				}
				err := f.runOne(ctx, contract.RunTaskInput{RunID: r.RunID, Task: r.Task, Node: in.Node})
				var appErr *temporal.ApplicationError
				switch {
				case err == nil:
					out.States[r.RunID] = contract.RunSucceeded
					continue
				case errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeNodeBusy && i == 0:
					return nil, err
				case errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeTaskFailed:
					out.States[r.RunID] = contract.RunFailed
					return out, nil
				default:
					f.mu.Lock()
					for id, st := range out.States {
						f.states[id] = st
					}
					f.states[r.RunID] = contract.RunRunning
					f.mu.Unlock()
					return nil, err
				}
			}
			return out, nil
		})
	env.OnActivity(a.CutChain, mock.Anything, mock.Anything).Return(
		func(_ context.Context, head int64) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.cuts = append(f.cuts, head)
			return nil
		}).Maybe()
	// EndLostChain leaves the chain as the store does: what ended stays,
	// a running run fails if its agent acknowledged it (delivery) or is
	// taken back to pending if not.
	env.OnActivity(a.EndLostChain, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.LostChain) (*contract.LostChainEnd, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.lost = append(f.lost, in)
			out := &contract.LostChainEnd{States: map[int64]string{}}
			var ids []int64
			for _, c := range f.chains {
				if c[0] == in.Head {
					ids = c
				}
			}
			for _, id := range ids {
				st, ok := f.states[id]
				switch {
				case !ok:
					st = contract.RunPending
				case st == contract.RunRunning:
					d := contract.RunDelivery{State: contract.RunRunning, Acked: true}
					if f.delivery != nil {
						d = f.delivery(id)
					}
					if d.Acked {
						st = contract.RunFailed
					} else {
						st = contract.RunPending
						out.TakenBack = append(out.TakenBack, id)
					}
					delete(f.states, id)
				}
				out.States[id] = st
			}
			return out, nil
		}).Maybe()
	env.OnActivity(a.FinishNodeGraph, mock.Anything, mock.Anything).Return(
		func(_ context.Context, end contract.NodeGraphEnd) error {
			f.record(fmt.Sprintf("end node %d %s", end.NodeID, end.Outcome), func() { f.ends = append(f.ends, end) })
			return nil
		})
	env.OnActivity(a.RecordNoOp, mock.Anything, mock.Anything).Return(
		func(_ context.Context, id int64) error {
			f.record(fmt.Sprintf("noop %d", id), func() { f.noops = append(f.noops, id) })
			return nil
		})
	env.OnActivity(a.RecordRunFailure, mock.Anything, mock.Anything).Return(
		func(_ context.Context, rf contract.RunFailure) error {
			f.record(fmt.Sprintf("fail %d blocked %v", rf.RunID, rf.Blocked), func() { f.failures = append(f.failures, rf) })
			return nil
		})
	env.OnActivity(a.CancelRuns, mock.Anything, mock.Anything).Return(
		func(_ context.Context, rc contract.RunsToCancel) error {
			f.record(fmt.Sprintf("cancel %v", rc.RunIDs), func() { f.cancels = append(f.cancels, rc) })
			return nil
		})
	env.OnActivity(a.RunDelivery, mock.Anything, mock.Anything).Return(
		func(_ context.Context, runID int64) (*contract.RunDelivery, error) {
			if f.delivery == nil {
				return &contract.RunDelivery{State: contract.RunRunning, Attempt: 1, Acked: true}, nil
			}
			d := f.delivery(runID)
			return &d, nil
		}).Maybe()
	env.OnActivity(a.CheckRunStates, mock.Anything, mock.Anything).Return(
		func(_ context.Context, ids []int64) (map[int64]string, error) {
			var call int
			f.record(fmt.Sprintf("check %v", ids), func() {
				f.checks = append(f.checks, ids)
				call = len(f.checks)
			})
			if f.checkStates == nil {
				// What Postgres holds of the runs of a chain that did not
				// report.
				f.mu.Lock()
				defer f.mu.Unlock()
				out := map[int64]string{}
				for _, id := range ids {
					if st, ok := f.states[id]; ok {
						out[id] = st
					}
				}
				return out, nil
			}
			return f.checkStates(call, ids), nil
		})
	env.OnActivity(a.AbandonNodeRuns, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.NodeAbandon) error {
			f.record(fmt.Sprintf("abandon %d", in.NodeID), func() { f.abandons = append(f.abandons, in) })
			return nil
		})
	env.OnActivity(a.FinishTransaction, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.FinishInput) (*contract.TransactionOutcome, error) {
			f.record("finish", func() { f.finishes = append(f.finishes, in) })
			out := &contract.TransactionOutcome{Status: "succeeded", Counts: map[string]int{}}
			switch {
			case in.Stopped:
				out.Status, out.Error = "stopped", "stopped by the operator"
			case in.FailReason != "":
				out.Status, out.Error = "failed", in.FailReason
			}
			return out, nil
		})
	// Signals to node workflows that run in this environment are delivered
	// by it; the others (a node that is not running) land here.
	env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, mock.Anything, mock.Anything, mock.Anything).Return(
		func(_, workflowID, _, name string, arg any) error {
			var states map[int64]string
			if rf, ok := arg.(contract.RunsFinished); ok {
				states = rf.States
			}
			f.record("signal "+workflowID, func() {
				f.signals = append(f.signals, signal{WorkflowID: workflowID, Name: name, States: states})
			})
			return nil
		})
	return f
}

func (f *fake) record(event string, also func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, event)
	also()
}

// calls returns a copy of the call log.
func (f *fake) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *fake) runIDs() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []int64
	for _, r := range f.runs {
		ids = append(ids, r.RunID)
	}
	return ids
}

func (f *fake) cancelled() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []int64
	for _, c := range f.cancels {
		ids = append(ids, c.RunIDs...)
	}
	slices.Sort(ids)
	return ids
}

func (f *fake) blocked() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []int64
	for _, rf := range f.failures {
		ids = append(ids, rf.Blocked...)
	}
	slices.Sort(ids)
	return ids
}

// index returns where event sits in the call log, or -1.
func (f *fake) index(event string) int { return slices.Index(f.calls(), event) }

// waitFor waits, up to limit in wall time, for event to reach the call log:
// for a call made on a goroutine of its own (a signal), whose order against
// the activities is not the order the workflow made it in.
func (f *fake) waitFor(event string, limit time.Duration) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if f.index(event) >= 0 {
			return true
		}
	}
	return false
}

// suiteBase gives every test a fresh environment with the workflows and
// the activities registered and the activities faked.
type suiteBase struct {
	suite.Suite
	testsuite.WorkflowTestSuite
}

// quietLogger keeps warnings and errors only: the test environment logs
// every activity and timer at debug level, and a package's failing test
// printed thousands of such lines around its assertion.
var quietLogger = sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

func (s *suiteBase) newEnv() (*testsuite.TestWorkflowEnvironment, *fake) {
	env := loadedEnv(&s.WorkflowTestSuite)
	env.SetTestTimeout(30 * time.Second)
	// A workflow that never ends (waiting for ever, auto-skipping its
	// timers) fails the test at once instead of spinning.
	env.SetWorkflowRunTimeout(24 * time.Hour)
	workflows.Register(env)
	env.RegisterActivity(&activities.Activities{})
	return env, newFake(env)
}

func nodeInput(name string, id int64) contract.NodeInput {
	return contract.NodeInput{
		GraphRef:  contract.GraphRef{TransactionID: txID, GraphIndex: 0},
		GraphType: "deployment", NodeID: id, NodeName: name,
	}
}

func pending(r contract.NodeRun) contract.NodeRun {
	if r.State == "" {
		r.State = contract.RunPending
	}
	if r.Task == "" {
		r.Task = fmt.Sprintf("task%d", r.ID)
	}
	return r
}

func nodePlan(remote map[int64]string, runs ...contract.NodeRun) *contract.NodePlan {
	np := &contract.NodePlan{RemoteStates: remote}
	for _, r := range runs {
		np.Runs = append(np.Runs, pending(r))
	}
	return np
}

// loadedEnv is a workflow test environment whose deadlock detector allows
// for a loaded machine: the suite runs beside Temporal, Postgres and agents
// on two cores, where a workflow goroutine may wait past the default 1 s
// for the CPU without being stuck. It logs warnings and errors only.
func loadedEnv(ts *testsuite.WorkflowTestSuite) *testsuite.TestWorkflowEnvironment {
	ts.SetLogger(quietLogger)
	env := ts.NewTestWorkflowEnvironment()
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	return env
}

// runOne is one run reaching the agent, alone or in a chain: recorded,
// then ended by runTask.
func (f *fake) runOne(ctx context.Context, in contract.RunTaskInput) error {
	f.record(fmt.Sprintf("run %d", in.RunID), func() {
		f.runs = append(f.runs, in)
		f.runAt[in.RunID] = f.env.Now().Sub(f.loadAt)
		f.inFlight++
		f.maxRuns = max(f.maxRuns, f.inFlight)
	})
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	// Give an overlapping second run the chance to show up.
	time.Sleep(2 * time.Millisecond)
	if f.runTask != nil {
		return f.runTask(ctx, in)
	}
	return nil
}
