package workflows

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// Remote-wait fallback: if a wake-up from another node is lost, the node
// workflow reads the states from Postgres, backing off to the maximum.
const (
	remotePollFirst = 30 * time.Second
	remotePollMax   = 10 * time.Minute
)

// NodeRun runs one node's tasks of a graph, one at a time, in plan order; a
// task starts only when all its parents (on this node and on others) have
// succeeded, and a failure blocks its descendants.
func NodeRun(ctx workflow.Context, in contract.NodeInput) (*contract.NodeResult, error) {
	log := workflow.GetLogger(ctx)
	var np contract.NodePlan
	ref := contract.NodeRef{GraphRef: in.GraphRef, NodeID: in.NodeID}
	if err := workflow.ExecuteLocalActivity(stateRead(ctx), contract.LoadNodePlanActivity, ref).Get(ctx, &np); err != nil {
		return nil, fmt.Errorf("load plan of node %s: %w", in.NodeName, err)
	}
	n := &nodeState{in: in, plan: &np, state: map[int64]string{}, remote: np.RemoteStates}
	if n.remote == nil {
		n.remote = map[int64]string{}
	}
	for _, r := range np.Runs {
		n.state[r.ID] = r.State
	}
	signals := workflow.GetSignalChannel(ctx, contract.SignalRunsFinished)
	poll := remotePollFirst
	for {
		for {
			var msg contract.RunsFinished
			if !signals.ReceiveAsync(&msg) {
				break
			}
			n.learn(msg.States)
		}
		if blocked := n.blockDescendants(); len(blocked) > 0 {
			if err := n.recordFailure(ctx, contract.RunFailure{Blocked: blocked}); err != nil {
				return nil, err
			}
			n.tellRemoteKids(ctx, blocked)
		}
		if ctx.Err() != nil {
			break
		}
		run, waiting := n.next()
		if run != nil {
			if chain := n.chainFrom(ctx, run); chain != nil {
				if err := n.executeChain(ctx, chain); err != nil {
					return nil, err
				}
			} else if err := n.execute(ctx, run); err != nil {
				return nil, err
			}
			poll = remotePollFirst
			continue
		}
		if !waiting {
			break
		}
		// Nothing can run until another node finishes something.
		sel := workflow.NewSelector(ctx)
		timerCtx, cancelTimer := workflow.WithCancel(ctx)
		sel.AddReceive(signals, func(c workflow.ReceiveChannel, _ bool) {
			var msg contract.RunsFinished
			c.Receive(ctx, &msg)
			n.learn(msg.States)
		})
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {})
		sel.AddFuture(workflow.NewTimer(timerCtx, poll), func(f workflow.Future) {
			if f.Get(ctx, nil) != nil {
				return // cancelled below after a signal won
			}
			var states map[int64]string
			ids := n.awaitedRemote()
			if err := workflow.ExecuteLocalActivity(stateRead(ctx), contract.CheckRunStatesActivity, ids).Get(ctx, &states); err == nil {
				n.learn(states)
			}
			poll = min(poll*2, remotePollMax)
		})
		sel.Select(ctx)
		// A timer left running would still fire later and cost history.
		cancelTimer()
	}
	if ctx.Err() == nil {
		n.flush(ctx)
	}
	if ctx.Err() != nil {
		pending := n.idsIn(contract.RunPending)
		if len(pending) > 0 {
			dctx, cancel := workflow.NewDisconnectedContext(ctx)
			defer cancel()
			cancelled := contract.RunsToCancel{RunIDs: pending, Reason: "cancelled: the transaction was stopped before this run started"}
			if err := workflow.ExecuteActivity(withSummary(stateActivity(dctx), "cancel %d run(s) on %s", len(pending), in.NodeName), contract.CancelRunsActivity, cancelled).Get(dctx, nil); err != nil {
				return nil, fmt.Errorf("record cancelled runs of %s: %w", in.NodeName, err)
			}
			for _, id := range pending {
				n.state[id] = contract.RunCancelled
			}
		}
		if err := n.finish(ctx, contract.OutcomeStop); err != nil {
			return nil, err
		}
		log.Info("node workflow stopped", "node", in.NodeName)
		return n.result(), temporal.NewCanceledError("transaction stopped")
	}
	res := n.result()
	outcome := contract.OutcomeSuccess
	if res.Failed > 0 || res.Blocked > 0 {
		outcome = contract.OutcomeError
	}
	if err := n.finish(ctx, outcome); err != nil {
		return nil, err
	}
	return res, nil
}

// finish applies the graph's callback for the outcome to the node (its
// status, error type, attributes) and resets its progress; it runs even
// when the transaction was stopped.
func (n *nodeState) finish(ctx workflow.Context, outcome string) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	end := contract.NodeGraphEnd{NodeRef: contract.NodeRef{GraphRef: n.in.GraphRef, NodeID: n.in.NodeID}, Outcome: outcome}
	if err := workflow.ExecuteLocalActivity(stateRead(dctx), contract.FinishNodeGraphActivity, end).Get(dctx, nil); err != nil {
		return fmt.Errorf("record the end of the graph on %s: %w", n.in.NodeName, err)
	}
	return nil
}

// nodeState is a node workflow's view of its runs.
type nodeState struct {
	in     contract.NodeInput
	plan   *contract.NodePlan
	state  map[int64]string // this node's runs
	remote map[int64]string // runs on other nodes this node waits for
	// sent are the wake-ups sent to other nodes; the workflow must not
	// close before they are delivered, or the server drops them.
	sent []workflow.Future
	// chainVersion is versionChain's version, asked once, the first time
	// a chain could be formed.
	chainVersion *workflow.Version
	// redelivered counts how often each run of a chain was handed out
	// again because no agent took it.
	redelivered map[int64]int
}

// flush waits until every wake-up sent to another node has been delivered
// or has failed (that node's workflow gone, or the WakeNodes activity out
// of attempts): harmless, as a node that misses one reads the states in
// Postgres.
func (n *nodeState) flush(ctx workflow.Context) {
	for _, f := range n.sent {
		_ = f.Get(ctx, nil)
	}
	n.sent = nil
}

// learn takes in states of remote runs; the order of the map does not
// matter because each entry is set independently.
//
//workflowcheck:ignore
func (n *nodeState) learn(states map[int64]string) {
	for id, st := range states {
		if _, ok := n.remote[id]; ok {
			n.remote[id] = st
		}
	}
}

func bad(state string) bool {
	return state == contract.RunFailed || state == contract.RunBlocked || state == contract.RunCancelled
}

func good(state string) bool { return state == contract.RunSucceeded || state == contract.RunSkipped }

// blockDescendants marks pending runs whose parents failed; plan order is
// topological, so one pass reaches every descendant on this node.
func (n *nodeState) blockDescendants() []int64 {
	var blocked []int64
	for _, r := range n.plan.Runs {
		if n.state[r.ID] != contract.RunPending {
			continue
		}
		hit := slices.ContainsFunc(r.Parents, func(p int64) bool { return bad(n.state[p]) }) ||
			slices.ContainsFunc(r.Remote, func(p int64) bool { return bad(n.remote[p]) })
		if hit {
			n.state[r.ID] = contract.RunBlocked
			blocked = append(blocked, r.ID)
		}
	}
	return blocked
}

// next returns the first pending run whose parents all succeeded, and
// whether some pending run still waits on another node.
func (n *nodeState) next() (*contract.NodeRun, bool) {
	return n.nextAssuming(nil)
}

// nextAssuming is next with the runs of done taken as succeeded already
// (a chain being built picks what would follow them) and not picked again.
func (n *nodeState) nextAssuming(done map[int64]bool) (*contract.NodeRun, bool) {
	waiting := false
	for i := range n.plan.Runs {
		r := &n.plan.Runs[i]
		if n.state[r.ID] != contract.RunPending || done[r.ID] {
			continue
		}
		localOK := !slices.ContainsFunc(r.Parents, func(p int64) bool { return !good(n.state[p]) && !done[p] })
		remoteOK := !slices.ContainsFunc(r.Remote, func(p int64) bool { return !good(n.remote[p]) })
		if localOK && remoteOK {
			return r, false
		}
		if !remoteOK {
			waiting = true
		}
	}
	return nil, waiting
}

func (n *nodeState) awaitedRemote() []int64 {
	var ids []int64
	for _, r := range n.plan.Runs {
		if n.state[r.ID] != contract.RunPending {
			continue
		}
		for _, p := range r.Remote {
			if !good(n.remote[p]) && !bad(n.remote[p]) && !slices.Contains(ids, p) {
				ids = append(ids, p)
			}
		}
	}
	return ids
}

// execute runs one task through the agent jig and records how it ended.
func (n *nodeState) execute(ctx workflow.Context, r *contract.NodeRun) error {
	if r.NoOp {
		if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "%s on %s (nothing to run)", r.Task, n.in.NodeName), contract.RecordNoOpActivity, r.ID).Get(ctx, nil); err != nil {
			return fmt.Errorf("record no-op %s: %w", r.Task, err)
		}
		n.state[r.ID] = contract.RunSucceeded
		n.tellRemoteKids(ctx, []int64{r.ID})
		return nil
	}
	heartbeat := contract.HeartbeatTimeout(n.in.HeartbeatTimeoutSec)
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// The agent enforces the task's timeout; this one catches an agent
		// that keeps heartbeating but never reports.
		StartToCloseTimeout: time.Duration(r.TimeoutSec)*time.Second + 2*heartbeat,
		HeartbeatTimeout:    heartbeat,
		WaitForCancellation: true,
		Summary:             fmt.Sprintf("%s on %s", r.Task, n.in.NodeName),
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    retryPause,
			BackoffCoefficient: 2,
			MaximumAttempts:    int32(1 + r.Retries),
		},
	})
	input := contract.RunTaskInput{RunID: r.ID, Task: r.Task, Node: n.in.NodeName}
	jig := contract.RunTaskOnNodeActivity
	if r.OnOrchestrator {
		jig = contract.RunOnOrchestratorActivity
	} else if sshJig(ctx, r.OverSSH) {
		jig = contract.RunOverSSHActivity
	}
	var oldBoot string
	if r.Reboot {
		if err := workflow.ExecuteLocalActivity(stateRead(ctx), contract.NodeBootIDActivity, n.in.NodeID).Get(ctx, &oldBoot); err != nil {
			return fmt.Errorf("read the boot id of %s: %w", n.in.NodeName, err)
		}
	}
	err := runOnNode(ctx, actx, jig, input)
	if err == nil && r.Reboot {
		// The agent reported the reboot under way: wait for the node to come
		// back with a new boot id, within the task's timeout.
		wctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Duration(r.TimeoutSec)*time.Second + time.Minute,
			HeartbeatTimeout:    30 * time.Second,
			Summary:             fmt.Sprintf("wait for %s to come back", n.in.NodeName),
		})
		wait := contract.RebootWait{RunID: r.ID, NodeID: n.in.NodeID, Node: n.in.NodeName, OldBootID: oldBoot, TimeoutSec: r.TimeoutSec}
		err = workflow.ExecuteActivity(wctx, contract.AwaitRebootActivity, wait).Get(ctx, nil)
	}
	if err == nil {
		n.state[r.ID] = contract.RunSucceeded
		n.tellRemoteKids(ctx, []int64{r.ID})
		return nil
	}
	if temporal.IsCanceledError(err) && ctx.Err() != nil {
		// Stopped before an agent took the run: it stays pending, and the
		// stop marks it cancelled with the others that never started.
		return nil
	}
	n.state[r.ID] = contract.RunFailed
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != contract.ErrTypeTaskFailed {
		// The agent never reported (lost, hung, or the run was cancelled):
		// the run's row still says running.
		reason := "no result from the node's agent: " + rootMessage(err)
		if err := n.recordFailure(ctx, contract.RunFailure{RunID: r.ID, Reason: reason}); err != nil {
			return err
		}
	}
	n.tellRemoteKids(ctx, []int64{r.ID})
	return nil
}

func (n *nodeState) recordFailure(ctx workflow.Context, f contract.RunFailure) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if err := workflow.ExecuteActivity(withSummary(stateActivity(dctx), "record the failure of run %d on %s", f.RunID, n.in.NodeName), contract.RecordRunFailureActivity, f).Get(dctx, nil); err != nil {
		return fmt.Errorf("record failure on %s: %w", n.in.NodeName, err)
	}
	return nil
}

// versionWakeActivity sends the wake-ups of a run with dependants on more
// than wakeBySignalsMax nodes from the WakeNodes activity instead of one
// SignalExternalWorkflow per node. The server processes a workflow's
// outgoing signals one at a time under its lock; a thousand of them from
// one node workflow queued there for tens of seconds, each failing as
// "busy workflow" and backing off, and held up the whole transfer queue.
// Histories from before never ask for it and replay with the signals.
const versionWakeActivity = "wake-nodes-activity"

// wakeBySignalsMax is how many nodes a node workflow still wakes with its
// own signals: cheaper than an activity for a few.
const wakeBySignalsMax = 8

// tellRemoteKids wakes the node workflows waiting for these runs, one signal
// per node, or one WakeNodes activity for many. Postgres already holds the
// states, so a node workflow that has not started yet reads them from there
// instead.
func (n *nodeState) tellRemoteKids(ctx workflow.Context, ids []int64) {
	byNode := map[string]map[int64]string{}
	var nodes []string
	for _, r := range n.plan.Runs {
		if !slices.Contains(ids, r.ID) {
			continue
		}
		for _, kid := range r.RemoteKids {
			if byNode[kid.Node] == nil {
				byNode[kid.Node] = map[int64]string{}
				nodes = append(nodes, kid.Node)
			}
			byNode[kid.Node][r.ID] = n.state[r.ID]
		}
	}
	slices.Sort(nodes)
	if len(nodes) > wakeBySignalsMax && workflow.GetVersion(ctx, versionWakeActivity, workflow.DefaultVersion, 1) >= 1 {
		in := contract.WakeNodes{TransactionID: n.in.TransactionID}
		for _, node := range nodes {
			in.Wakes = append(in.Wakes, contract.NodeWake{Node: node, States: byNode[node]})
		}
		// A few attempts only: the wake-ups are a shortcut (the nodes poll
		// Postgres if they miss one), and the workflow does not end before
		// the activity has.
		wctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: 2 * time.Minute,
			Summary:             fmt.Sprintf("wake %d node(s) waiting for runs of %s", len(nodes), n.in.NodeName),
			RetryPolicy: &temporal.RetryPolicy{
				InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second, MaximumAttempts: 5,
			},
		})
		f := workflow.ExecuteActivity(wctx, contract.WakeNodesActivity, in)
		n.sent = append(n.sent, f)
		return
	}
	for _, node := range nodes {
		// A failed signal (the other node's workflow not started or already
		// done) is harmless for the reason above.
		f := workflow.SignalExternalWorkflow(ctx, contract.NodeWorkflowID(n.in.TransactionID, node), "", contract.SignalRunsFinished,
			contract.RunsFinished{States: byNode[node]})
		n.sent = append(n.sent, f)
	}
}

func (n *nodeState) idsIn(state string) []int64 {
	var ids []int64
	for _, r := range n.plan.Runs {
		if n.state[r.ID] == state {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func (n *nodeState) result() *contract.NodeResult {
	var out contract.NodeResult
	for _, r := range n.plan.Runs {
		switch n.state[r.ID] {
		case contract.RunSucceeded, contract.RunSkipped:
			out.Succeeded++
		case contract.RunFailed:
			out.Failed++
		case contract.RunBlocked:
			out.Blocked++
		case contract.RunCancelled, contract.RunPending:
			out.Cancelled++
		}
	}
	return &out
}
