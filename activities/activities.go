// Package activities holds anneal's Temporal activities: planning a graph,
// running a task on a node through its jig, and writing run state. They are
// methods on a struct that carries the store, and every one is idempotent:
// Temporal may run an activity again after a crash.
package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"golang.org/x/sync/errgroup"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// Activities carries what the activities need: the stores, each through
// the small interface its activities use (declared beside them), the
// Temporal client and the logger.
type Activities struct {
	Runs      Runs
	Plans     Plans
	LocalRuns LocalRuns
	SSH       SSHRuns
	Reboots   Reboots
	NodeRoles NodeRoles
	Software  SoftwareRounds
	Log       *slog.Logger
	// OrchestratorDir is where master_shell tasks run (a directory per
	// node); default <tmp>/anneal-orchestrator.
	OrchestratorDir string
	// SSHKeepalive is the ssh jig's keepalive interval: a connection
	// silent for three of them is dead and its run fails (0: 10 s).
	SSHKeepalive time.Duration
	// Temporal and TaskQueue let the annealer's activities start noderole
	// runs and wake the annealer.
	Temporal  client.Client
	TaskQueue string
	// HeartbeatTimeoutSec is how long a noderole's run may go without its
	// agent's heartbeat (0: the workflows' default).
	HeartbeatTimeoutSec int
	// NodeBusyWait is how long a run waits inside its activity for a busy
	// node before it fails with contract.ErrTypeNodeBusy (0: 30 s).
	NodeBusyWait time.Duration
}

// Runs is what the transaction activities need of task runs: dispatch and
// state writes (the kernel store).
type Runs interface {
	DispatchRun(ctx context.Context, runID int64, token []byte) (*models.TaskRun, error)
	DispatchChain(ctx context.Context, runIDs []int64, token []byte) (*models.TaskRun, error)
	CutChain(ctx context.Context, head int64) error
	EndLostChain(ctx context.Context, head int64, reason string) (*contract.LostChainEnd, error)
	FailRun(ctx context.Context, runID int64, reason string, blocked []int64) error
	CancelRuns(ctx context.Context, ids []int64, reason string) error
	RunStates(ctx context.Context, ids []int64) (map[int64]string, error)
	AbandonNodeRuns(ctx context.Context, id uuid.UUID, gi int, nodeID int64, reason string) error
	SucceedNoOp(ctx context.Context, runID int64) error
	RunDelivery(ctx context.Context, runID int64) (*contract.RunDelivery, error)
}

// Plans is what they need of Fuel's transactions: planning a graph, a
// node's share of it, the node's end of a graph and the transaction's end
// (the Fuel store).
type Plans interface {
	PlanGraph(ctx context.Context, id uuid.UUID, gi int) (*contract.GraphPlan, error)
	StartNodePlan(ctx context.Context, id uuid.UUID, gi int, nodeID int64) (*contract.NodePlan, error)
	FinishNodeGraph(ctx context.Context, id uuid.UUID, gi int, nodeID int64, outcome string) error
	FinishTransaction(ctx context.Context, id uuid.UUID, stopped bool, failReason string) (*fuel.TransactionStatus, error)
}

// transactionID parses a transaction id from a payload; a malformed one
// fails for good.
func transactionID(txID string) (uuid.UUID, error) {
	id, err := uuid.Parse(txID)
	if err != nil {
		return id, temporal.NewNonRetryableApplicationError(fmt.Sprintf("bad transaction id %q", txID), contract.ErrTypeBadInput, err)
	}
	return id, nil
}

// PlanGraph resolves a graph's tasks to nodes, builds the DAG and persists
// the runs. A graph that cannot be planned fails without retry.
func (a *Activities) PlanGraph(ctx context.Context, ref contract.GraphRef) (*contract.GraphPlan, error) {
	id, err := transactionID(ref.TransactionID)
	if err != nil {
		return nil, err
	}
	p, err := a.Plans.PlanGraph(ctx, id, ref.GraphIndex)
	var perr *fuel.PlanError
	if errors.As(err, &perr) {
		return nil, temporal.NewNonRetryableApplicationError(perr.Reason, contract.ErrTypePlan, nil)
	}
	if err != nil {
		return nil, missingTransaction(ctx, err)
	}
	for _, w := range p.Warnings {
		a.Log.Warn("plan warning", "transaction", ref.TransactionID, "graph", p.GraphType, "warning", w)
	}
	return p, nil
}

// LoadNodePlan returns a node's runs of a graph with their edges and, when
// some are still to run, marks the node busy with the graph (progress 0).
func (a *Activities) LoadNodePlan(ctx context.Context, ref contract.NodeRef) (*contract.NodePlan, error) {
	id, err := transactionID(ref.TransactionID)
	if err != nil {
		return nil, err
	}
	return a.Plans.StartNodePlan(ctx, id, ref.GraphIndex, ref.NodeID)
}

// RunTaskOnNode hands a run to its node's agent (the agent jig: the agent
// pulls its work) and completes asynchronously: the API completes this
// activity when the agent reports, and the agent's run heartbeats keep it
// alive, so a dead agent turns into a heartbeat timeout.
func (a *Activities) RunTaskOnNode(ctx context.Context, in contract.RunTaskInput) (*contract.RunOutcome, error) {
	info := activity.GetInfo(ctx)
	run, err := a.dispatchWhenFree(ctx, in, info.TaskToken)
	if err != nil {
		return nil, err
	}
	switch run.State {
	case contract.RunRunning:
		a.Log.Info("run dispatched to agent", "transaction", run.TransactionID, "node", in.Node, "task", in.Task,
			"run", in.RunID, "attempt", run.Attempt, "activity_attempt", info.Attempt)
		return nil, activity.ErrResultPending
	case contract.RunSkipped:
		// Its inputs turned out to be those of its last successful run on
		// the node (LCM): nothing to do, and its children go on.
		a.Log.Info("run skipped: inputs unchanged", "transaction", run.TransactionID, "node", in.Node, "task", in.Task, "run", in.RunID)
		return &contract.RunOutcome{}, nil
	case contract.RunSucceeded:
		// A retry after the agent already reported success: do not run twice.
		exit := 0
		if run.ExitCode != nil {
			exit = *run.ExitCode
		}
		return &contract.RunOutcome{ExitCode: exit}, nil
	default:
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("run %d (%s on %s) is %s and cannot be dispatched", in.RunID, in.Task, in.Node, run.State), contract.ErrTypeNotDispatchable, nil)
	}
}

// RunChainOnNode hands a chain of a node's runs to its agent under one
// activity: the first is dispatched here, and the API dispatches each next
// one when the agent reports the one before succeeded, then completes this
// activity with the states of the chain's runs when the chain ends (its
// last run, a failure, or a stop). Every run keeps its own row, attempt,
// log and exit code; only the Temporal actions are shared. An attempt
// after an earlier one got some way resumes at the chain's first run that
// has not ended well, so no run is executed twice.
func (a *Activities) RunChainOnNode(ctx context.Context, in contract.RunChainInput) (*contract.ChainOutcome, error) {
	if len(in.Runs) == 0 {
		return nil, temporal.NewNonRetryableApplicationError("a chain needs at least one run", contract.ErrTypeBadInput, nil)
	}
	info := activity.GetInfo(ctx)
	ids := make([]int64, len(in.Runs))
	for i, r := range in.Runs {
		ids[i] = r.RunID
	}
	var run *models.TaskRun
	first := contract.RunTaskInput{RunID: ids[0], Task: in.Runs[0].Task, Node: in.Node}
	err := a.whenNodeFree(ctx, first, func() error {
		var err error
		run, err = a.Runs.DispatchChain(ctx, ids, info.TaskToken)
		return err
	})
	if err != nil {
		return nil, err
	}
	if run != nil {
		a.Log.Info("chain dispatched to agent", "transaction", run.TransactionID, "node", in.Node, "runs", len(ids),
			"task", run.TaskName, "run", run.ID, "attempt", run.Attempt, "activity_attempt", info.Attempt)
		return nil, activity.ErrResultPending
	}
	// Nothing left to run: every run ended well already (an earlier
	// attempt, LCM), or the chain stops at a blocked or cancelled one.
	states, err := a.Runs.RunStates(ctx, ids)
	if err != nil {
		return nil, err
	}
	return &contract.ChainOutcome{States: states}, nil
}

// CutChain ends a chain after its running run: the transaction was
// stopped while the chain ran, and the runs not yet handed out must not be.
func (a *Activities) CutChain(ctx context.Context, head int64) error {
	return a.Runs.CutChain(ctx, head)
}

// EndLostChain ends a chain whose activity ended without a report, and
// answers how that left its runs (see models.(*Store).EndLostChain).
func (a *Activities) EndLostChain(ctx context.Context, in contract.LostChain) (*contract.LostChainEnd, error) {
	return a.Runs.EndLostChain(ctx, in.Head, in.Reason)
}

// A run whose node is busy waits inside its activity, heartbeating, for
// up to NodeBusyWait, looking again every nodeBusyPoll; after that it
// fails with contract.ErrTypeNodeBusy and the workflow waits with a timer and tries
// again, so a long wait neither counts against the run's time limit nor
// costs history while it is short.
const (
	nodeBusyPoll        = time.Second
	defaultNodeBusyWait = 30 * time.Second
)

// dispatchWhenFree dispatches a run, waiting while its node runs something
// else (another transaction's task, a noderole): a node runs one thing at a
// time.
func (a *Activities) dispatchWhenFree(ctx context.Context, in contract.RunTaskInput, token []byte) (*models.TaskRun, error) {
	var run *models.TaskRun
	err := a.whenNodeFree(ctx, in, func() error {
		var err error
		run, err = a.Runs.DispatchRun(ctx, in.RunID, token)
		return err
	})
	return run, err
}

// whenNodeFree calls try until it does not answer that the node is busy,
// heartbeating why it waits, for up to NodeBusyWait; then it fails with
// contract.ErrTypeNodeBusy (not retried by the activity: the workflow waits).
func (a *Activities) whenNodeFree(ctx context.Context, in contract.RunTaskInput, try func() error) error {
	logged := false
	wait := a.NodeBusyWait
	if wait == 0 {
		wait = defaultNodeBusyWait
	}
	deadline := time.Now().Add(wait)
	dbLogged := false
	for {
		err := try()
		if models.Unavailable(err) {
			// Postgres is restarting or out of reach: nothing was
			// dispatched, and spending the run's attempts on it would fail
			// a task that never ran. Wait, heartbeating why, until it is
			// back or the activity times out (then the workflow finds the
			// run undelivered and delivers it again).
			if !dbLogged {
				a.Log.Warn("run waits for the database", "node", in.Node, "task", in.Task, "run", in.RunID, "error", err)
				dbLogged = true
			}
			activity.RecordHeartbeat(ctx, "database unavailable: "+err.Error())
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(nodeBusyPoll):
			}
			continue
		}
		var busy *models.NodeBusyError
		if !errors.As(err, &busy) {
			return err
		}
		if !logged {
			a.Log.Info("run waits for its node", "node", in.Node, "task", in.Task, "run", in.RunID, "reason", busy.Reason)
			logged = true
		}
		if time.Now().After(deadline) {
			return temporal.NewNonRetryableApplicationError(busy.Error(), contract.ErrTypeNodeBusy, nil)
		}
		activity.RecordHeartbeat(ctx, busy.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(nodeBusyPoll):
		}
	}
}

// RecordRunFailure writes a failure and the runs it blocks.
func (a *Activities) RecordRunFailure(ctx context.Context, f contract.RunFailure) error {
	return a.Runs.FailRun(ctx, f.RunID, f.Reason, f.Blocked)
}

// CancelRuns marks runs that never started as cancelled.
func (a *Activities) CancelRuns(ctx context.Context, in contract.RunsToCancel) error {
	return a.Runs.CancelRuns(ctx, in.RunIDs, in.Reason)
}

// RunDelivery reads how far a run got towards its agent: a workflow whose
// RunTaskOnNode timed out asks it whether the agent ever had the run.
func (a *Activities) RunDelivery(ctx context.Context, runID int64) (*contract.RunDelivery, error) {
	return a.Runs.RunDelivery(ctx, runID)
}

// wakeParallel bounds the wake-ups WakeNodes has in flight at once.
const wakeParallel = 16

// WakeNodes sends SignalRunsFinished to each node workflow named, a few at
// a time. A wake-up is a shortcut: Postgres already holds the states, and
// a node workflow reads them there when it starts and when its fallback
// poll fires. So a node workflow not started yet or already ended is
// skipped, and so is one whose signal the server refuses for good (it is
// logged); only failures that may pass (the server unavailable or busy)
// fail the activity, for a retry that sends every wake-up again (harmless:
// a node takes the same states twice).
func (a *Activities) WakeNodes(ctx context.Context, in contract.WakeNodes) error {
	var g errgroup.Group
	g.SetLimit(wakeParallel)
	for _, w := range in.Wakes {
		g.Go(func() error {
			id := contract.NodeWorkflowID(in.TransactionID, w.Node)
			err := a.Temporal.SignalWorkflow(ctx, id, "", contract.SignalRunsFinished, contract.RunsFinished{States: w.States})
			var notFound *serviceerror.NotFound
			switch {
			case err == nil, errors.As(err, &notFound):
				return nil
			case transientTemporal(err):
				return fmt.Errorf("wake the workflow of node %s (%s): %w", w.Node, id, err)
			default:
				a.Log.Warn("a node workflow's wake-up was refused; it reads the states at its next poll", "workflow", id, "error", err)
				return nil
			}
		})
	}
	return g.Wait()
}

// transientTemporal says whether a Temporal call's error may pass if the
// call is made again.
func transientTemporal(err error) bool {
	var unavailable *serviceerror.Unavailable
	var exhausted *serviceerror.ResourceExhausted
	var deadline *serviceerror.DeadlineExceeded
	return errors.As(err, &unavailable) || errors.As(err, &exhausted) || errors.As(err, &deadline) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// CheckRunStates reads runs' states: the fallback when a wake-up from
// another node's workflow may have been missed.
func (a *Activities) CheckRunStates(ctx context.Context, ids []int64) (map[int64]string, error) {
	return a.Runs.RunStates(ctx, ids)
}

// AbandonNodeRuns fails the unfinished runs of a node whose workflow ended
// abnormally (terminated, failed), so its dependants stop waiting.
func (a *Activities) AbandonNodeRuns(ctx context.Context, in contract.NodeAbandon) error {
	id, err := transactionID(in.TransactionID)
	if err != nil {
		return err
	}
	return a.Runs.AbandonNodeRuns(ctx, id, in.GraphIndex, in.NodeID, in.Reason)
}

// FinishTransaction records the transaction's final status from its runs.
func (a *Activities) FinishTransaction(ctx context.Context, in contract.FinishInput) (*contract.TransactionOutcome, error) {
	id, err := transactionID(in.TransactionID)
	if err != nil {
		return nil, err
	}
	st, err := a.Plans.FinishTransaction(ctx, id, in.Stopped, in.FailReason)
	if err != nil {
		return nil, missingTransaction(ctx, err)
	}
	a.Log.Info("transaction finished", "transaction", in.TransactionID, "status", st.Status, "error", st.Error)
	// Its nodes are free for the annealer again.
	if err := contract.KickAnnealer(ctx, a.Temporal, a.TaskQueue, "transaction "+in.TransactionID+" finished"); err != nil {
		a.Log.Warn("annealer not woken", "error", err)
	}
	return &contract.TransactionOutcome{Status: st.Status, Error: st.Error, Counts: st.Counts}, nil
}

// RecordNoOp marks a run with nothing to execute as succeeded.
func (a *Activities) RecordNoOp(ctx context.Context, runID int64) error {
	return a.Runs.SucceedNoOp(ctx, runID)
}

// FinishNodeGraph applies the graph's on_success/on_error/on_stop callback
// to the node's attributes and resets its progress.
func (a *Activities) FinishNodeGraph(ctx context.Context, end contract.NodeGraphEnd) error {
	id, err := transactionID(end.TransactionID)
	if err != nil {
		return err
	}
	return a.Plans.FinishNodeGraph(ctx, id, end.GraphIndex, end.NodeID, end.Outcome)
}

// missingTransactionAttempts bounds how long an activity waits for its
// transaction's row: the workflow starts inside the database transaction
// that writes it, so the first attempts may run before the commit; if the
// commit failed, the row never comes and the workflow must fail visibly.
const missingTransactionAttempts = 6

// missingTransaction makes "transaction not found" final after a few
// attempts; other errors pass through to be retried.
func missingTransaction(ctx context.Context, err error) error {
	if errors.Is(err, models.ErrNotFound) && activity.GetInfo(ctx).Attempt >= missingTransactionAttempts {
		return temporal.NewNonRetryableApplicationError(
			"the transaction's row does not exist (its creation was rolled back): "+err.Error(), contract.ErrTypeBadInput, err)
	}
	return err
}
