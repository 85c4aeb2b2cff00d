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

// versionChain hands a node's ready runs that have no cross-node wait
// between them to its agent as one RunChainOnNode activity (version 1)
// instead of one RunTaskOnNode each: the Temporal actions per task, what
// a thousand-node transaction spends most on, shrink by the chain's
// length, while every run keeps its row, state, log and exit code.
// Histories from before never call it, so they replay through the
// one-run-at-a-time path. Version 2 cuts a chain in Postgres as soon as
// its transaction is stopped (awaitChain); version 3 ends a chain whose
// activity ended without a report in one step in Postgres (endLostChain).
const versionChain = "node-chain"

// maxChain bounds a chain's length, and so its payload and time limit.
const maxChain = 64

// chainGap is the time limit a chain allows per run beyond the runs' own
// timeouts: the report of one, the dispatch and delivery of the next.
const chainGap = 5 * time.Second

// retryPause is how long a failed run waits before its retry: a run of a
// chain in the workflow, a run alone in RunTaskOnNode's retry policy.
const retryPause = 2 * time.Second

// agentRun says whether a run goes to its node's agent (RunTaskOnNode), the
// only runs a chain holds.
func agentRun(r *contract.NodeRun) bool {
	return !r.NoOp && !r.OnOrchestrator && !r.OverSSH && !r.Reboot
}

// chainFrom returns the chain that starts with first, the run next()
// picked: the runs next() would pick after it if each succeeded, as long
// as they go to the agent; a run with dependants on other nodes ends the
// chain, so those are woken as soon as it ends. A chain of one (or none
// under the histories' old version) is run alone.
func (n *nodeState) chainFrom(ctx workflow.Context, first *contract.NodeRun) []*contract.NodeRun {
	if !agentRun(first) || len(first.RemoteKids) > 0 {
		return nil
	}
	chain := []*contract.NodeRun{first}
	in := map[int64]bool{first.ID: true}
	for len(chain) < maxChain {
		pick, _ := n.nextAssuming(in)
		if pick == nil || !agentRun(pick) {
			break
		}
		chain = append(chain, pick)
		in[pick.ID] = true
		if len(pick.RemoteKids) > 0 {
			break
		}
	}
	if len(chain) < 2 || n.chainVersionOf(ctx) < 1 {
		return nil
	}
	return chain
}

// chainVersionOf asks versionChain's version once, the first time a chain
// could be formed (histories that never form one carry no marker).
func (n *nodeState) chainVersionOf(ctx workflow.Context) workflow.Version {
	if n.chainVersion == nil {
		v := workflow.GetVersion(ctx, versionChain, workflow.DefaultVersion, 3)
		n.chainVersion = &v
	}
	return *n.chainVersion
}

// executeChain runs a chain through the agent and records how each of its
// runs ended. A run the agent reported failed is retried alone when its
// task allows retries; runs after a failure stay pending for the loop.
func (n *nodeState) executeChain(ctx workflow.Context, chain []*contract.NodeRun) error {
	heartbeat := contract.HeartbeatTimeout(n.in.HeartbeatTimeoutSec)
	in := contract.RunChainInput{Node: n.in.NodeName}
	limit := 2 * heartbeat
	ids := make([]int64, len(chain))
	for i, r := range chain {
		in.Runs = append(in.Runs, contract.ChainRun{RunID: r.ID, Task: r.Task})
		ids[i] = r.ID
		limit += time.Duration(r.TimeoutSec)*time.Second + chainGap
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: limit,
		HeartbeatTimeout:    heartbeat,
		WaitForCancellation: true,
		Summary:             fmt.Sprintf("%s … %s on %s (%d tasks)", chain[0].Task, chain[len(chain)-1].Task, n.in.NodeName, len(chain)),
		// A chain is not retried as a whole: each run's retries are its
		// own (below), and a lost chain is handed out again from its
		// first unfinished run by the node's loop.
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	for {
		var out contract.ChainOutcome
		err := n.awaitChain(ctx, workflow.ExecuteActivity(actx, contract.RunChainOnNodeActivity, in), ids[0], &out)
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeNodeBusy {
			if err := workflow.Sleep(ctx, nodeBusyPause); err != nil {
				return nil // stopped while waiting: the runs stay pending
			}
			continue
		}
		if err != nil && n.chainVersionOf(ctx) >= 3 {
			return n.endLostChain(ctx, chain, err)
		}
		if err != nil {
			// The chain did not report: read how far it got.
			rctx, cancel := workflow.NewDisconnectedContext(ctx)
			out.States = nil
			rerr := workflow.ExecuteLocalActivity(stateRead(rctx), contract.CheckRunStatesActivity, ids).Get(rctx, &out.States)
			cancel()
			if rerr != nil {
				return fmt.Errorf("read the runs of a chain on %s: %w", n.in.NodeName, rerr)
			}
		}
		return n.afterChain(ctx, chain, out.States, err)
	}
}

// awaitChain waits for a chain's activity. Under version 2, a stop of the
// transaction while it runs cuts the chain in Postgres (CutChain) at once:
// the API then hands out none of its runs not yet started, and completes
// the activity when the running one is reported; the wait goes on until
// then (the activity waits for cancellation).
func (n *nodeState) awaitChain(ctx workflow.Context, f workflow.Future, head int64, out *contract.ChainOutcome) error {
	if n.chainVersionOf(ctx) < 2 {
		return f.Get(ctx, out)
	}
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(f, func(workflow.Future) {})
	sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {})
	sel.Select(ctx)
	if !f.IsReady() {
		dctx, cancel := workflow.NewDisconnectedContext(ctx)
		defer cancel()
		if err := workflow.ExecuteLocalActivity(stateRead(dctx), contract.CutChainActivity, head).Get(dctx, nil); err != nil {
			workflow.GetLogger(ctx).Warn("chain not cut on stop; it ends at its next heartbeat", "node", n.in.NodeName, "error", err)
		}
	}
	return f.Get(ctx, out)
}

// afterChain takes in the states a chain's runs ended in (err: the
// activity's error when the chain did not report), fails the run the
// agent never reported, wakes the dependants on other nodes, and retries a
// reported failure whose task allows it.
func (n *nodeState) afterChain(ctx workflow.Context, chain []*contract.NodeRun, states map[int64]string, err error) error {
	var finished []int64
	var retry *contract.NodeRun
	for _, r := range chain {
		switch st := states[r.ID]; st {
		case contract.RunFailed:
			n.state[r.ID] = contract.RunFailed
			if err == nil && r.Retries > 0 {
				retry = r // reported by the agent: its retries apply
				continue
			}
			finished = append(finished, r.ID)
		case contract.RunRunning:
			if err == nil || n.lostRunWaits(ctx, r, err) {
				continue // stays pending: handed out again, or cancelled on stop
			}
			n.state[r.ID] = contract.RunFailed
			reason := "no result from the node's agent: " + rootMessage(err)
			if ferr := n.recordFailure(ctx, contract.RunFailure{RunID: r.ID, Reason: reason}); ferr != nil {
				return ferr
			}
			finished = append(finished, r.ID)
		default:
			if n.adopt(r, st) {
				finished = append(finished, r.ID)
			}
		}
	}
	n.tellRemoteKids(ctx, finished)
	if retry == nil || ctx.Err() != nil {
		return nil
	}
	if err := workflow.Sleep(ctx, retryPause); err != nil {
		return nil
	}
	again := *retry
	again.Retries--
	n.state[retry.ID] = contract.RunPending
	return n.execute(ctx, &again)
}

// endLostChain ends a chain whose activity ended without a report (a
// timeout, a failed dispatch) in one step in Postgres (EndLostChain), so
// that the API hands out no more of it and the workflow and Postgres agree
// on every run: what ended stays ended, a run an agent had fails, and one
// no agent took is handed out again (up to maxRedeliveries times). If the
// chain's first unfinished run never went out (its dispatch failed), it
// runs alone, with its own retries and a failure recorded at their end,
// rather than as the same chain again.
func (n *nodeState) endLostChain(ctx workflow.Context, chain []*contract.NodeRun, err error) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var end contract.LostChainEnd
	lost := contract.LostChain{Head: chain[0].ID, Reason: "no result from the node's agent: " + rootMessage(err)}
	if lerr := workflow.ExecuteLocalActivity(stateRead(dctx), contract.EndLostChainActivity, lost).Get(dctx, &end); lerr != nil {
		return fmt.Errorf("end a lost chain on %s: %w", n.in.NodeName, lerr)
	}
	var finished []int64
	for _, r := range chain {
		if n.adopt(r, end.States[r.ID]) {
			finished = append(finished, r.ID)
		}
		if !slices.Contains(end.TakenBack, r.ID) || ctx.Err() != nil || n.deliverAgain(ctx, r) {
			continue
		}
		n.state[r.ID] = contract.RunFailed
		reason := undelivered(n.in.NodeName, n.redelivered[r.ID]+1, err)
		if ferr := n.recordFailure(ctx, contract.RunFailure{RunID: r.ID, Reason: reason}); ferr != nil {
			return ferr
		}
		finished = append(finished, r.ID)
	}
	n.tellRemoteKids(ctx, finished)
	if ctx.Err() != nil {
		return nil
	}
	for _, r := range chain {
		if good(n.state[r.ID]) {
			continue
		}
		if n.state[r.ID] == contract.RunPending && !slices.Contains(end.TakenBack, r.ID) {
			return n.execute(ctx, r)
		}
		break
	}
	return nil
}

// lostRunWaits decides about a chain's run left running when the chain's
// activity ended without a report: true leaves it pending, either because
// the transaction was stopped (the stop cancels it) or because it timed
// out before any agent took it (the worker died holding the chain), so it
// is handed out again, up to maxRedeliveries times.
func (n *nodeState) lostRunWaits(ctx workflow.Context, r *contract.NodeRun, err error) bool {
	if temporal.IsCanceledError(err) && ctx.Err() != nil {
		return true
	}
	var timeout *temporal.TimeoutError
	if !errors.As(err, &timeout) || ctx.Err() != nil {
		return false
	}
	var d contract.RunDelivery
	if derr := workflow.ExecuteLocalActivity(stateRead(ctx), contract.RunDeliveryActivity, r.ID).Get(ctx, &d); derr != nil {
		return false
	}
	return !d.Acked && n.deliverAgain(ctx, r)
}

// deliverAgain counts another delivery of a chain's run that no agent
// took, and says whether it is within maxRedeliveries.
func (n *nodeState) deliverAgain(ctx workflow.Context, r *contract.NodeRun) bool {
	if n.redelivered[r.ID] >= maxRedeliveries {
		return false
	}
	if n.redelivered == nil {
		n.redelivered = map[int64]int{}
	}
	n.redelivered[r.ID]++
	workflow.GetLogger(ctx).Warn("run of a chain never reached its agent; delivering it again",
		"run", r.ID, "task", r.Task, "node", n.in.NodeName, "delivery", n.redelivered[r.ID]+1)
	return true
}

// adopt takes in the state a chain's run ended in, as Postgres says it;
// it reports whether the run finished (its dependants on other nodes are
// to be woken). Other states leave the run as it was.
func (n *nodeState) adopt(r *contract.NodeRun, state string) bool {
	switch state {
	case contract.RunSucceeded, contract.RunSkipped:
		n.state[r.ID] = contract.RunSucceeded
		return true
	case contract.RunFailed:
		n.state[r.ID] = contract.RunFailed
		return true
	case contract.RunBlocked, contract.RunCancelled:
		n.state[r.ID] = state
	}
	return false
}
