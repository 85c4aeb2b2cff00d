package workflows

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// Workflow changes guarded by workflow.GetVersion, so that executions
// started by an older worker replay on this one (see README, Upgrading).
const (
	// versionGraphChild runs each graph of a transaction as a GraphRun child
	// workflow (version 1) rather than inline (DefaultVersion), so that the
	// Transaction's history grows with its graphs, not with nodes × graphs.
	versionGraphChild = "graph-run-child"
	// versionSearchAttrs sets anneal's search attributes on the GraphRun
	// and NodeRun children (copied from the transaction's), upserts
	// AnnealStatus when the transaction ends, and fails the workflow
	// (ErrTypeTransactionFailed) when the transaction ended in error
	// (version 1).
	versionSearchAttrs = "search-attributes"
	// versionStartWindow has a graph ask for at most nodeStartWindow node
	// workflows whose start the server has not confirmed yet (version 1),
	// instead of all of them in one workflow task: the server starts a
	// parent's children one at a time under the parent's lock, and a
	// thousand start requests at once queued there, failed as "busy
	// workflow" and backed off, so that the last node started minutes
	// after the first.
	versionStartWindow = "node-start-window"
)

// nodeStartWindow is how many node workflows a graph has asked for and not
// yet seen started (versionStartWindow).
const nodeStartWindow = 32

// Transaction runs a transaction's graphs one after another: each graph is
// planned by an activity, then executed by one child workflow per node. A
// graph with failures stops the transaction; cancelling the workflow stops
// dispatching, lets running tasks finish, and records what never ran.
func Transaction(ctx workflow.Context, in contract.TransactionInput) (*contract.TransactionOutcome, error) {
	log := workflow.GetLogger(ctx)
	graphChild := workflow.GetVersion(ctx, versionGraphChild, workflow.DefaultVersion, 1) >= 1
	withAttrs := workflow.GetVersion(ctx, versionSearchAttrs, workflow.DefaultVersion, 1) >= 1
	stopped, failReason := false, ""
	for gi := 0; gi < in.Graphs; gi++ {
		ref := contract.GraphRef{TransactionID: in.TransactionID, GraphIndex: gi}
		var gp contract.GraphPlan
		err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "plan graph %d of transaction %s", gi, in.TransactionID),
			contract.PlanGraphActivity, ref).Get(ctx, &gp)
		if err != nil {
			if temporal.IsCanceledError(err) || ctx.Err() != nil {
				stopped = true
				break
			}
			failReason = fmt.Sprintf("graph %d could not be planned: %s", gi, rootMessage(err))
			break
		}
		log.Info("graph planned", "transaction", in.TransactionID, "graph", gp.GraphType, "nodes", len(gp.Nodes), "runs", gp.Runs)
		if gp.DryRun {
			continue
		}
		var res contract.GraphResult
		if graphChild {
			res, err = runGraphChild(ctx, contract.GraphInput{TransactionInput: in, GraphIndex: gi, Plan: gp}, withAttrs)
			if err != nil && ctx.Err() == nil {
				failReason = fmt.Sprintf("graph %q: its workflow ended abnormally: %s", gp.GraphType, rootMessage(err))
				break
			}
		} else {
			res = runGraph(ctx, in, gi, &gp)
		}
		if ctx.Err() != nil {
			stopped = true
			break
		}
		if len(res.Lost) > 0 {
			failReason = fmt.Sprintf("graph %q: the workflows of node(s) %v ended abnormally", gp.GraphType, res.Lost)
			break
		}
		if res.Aborted != "" {
			failReason = fmt.Sprintf("graph %q: %s", gp.GraphType, res.Aborted)
			break
		}
		if res.Failed > 0 || res.Blocked > 0 {
			break // later graphs build on this one; do not run them
		}
	}
	// Recording the end must happen even when the workflow was cancelled.
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var out contract.TransactionOutcome
	finish := contract.FinishInput{TransactionID: in.TransactionID, Stopped: stopped, FailReason: failReason}
	if err := workflow.ExecuteActivity(withSummary(stateActivity(dctx), "record the end of transaction %s", in.TransactionID),
		contract.FinishTransactionActivity, finish).Get(dctx, &out); err != nil {
		return nil, fmt.Errorf("record end of transaction %s: %w", in.TransactionID, err)
	}
	if withAttrs && hasAnnealAttributes(ctx) {
		// AnnealStatus="error" finds the transactions that failed, even
		// those whose workflow completed.
		if err := workflow.UpsertTypedSearchAttributes(dctx, contract.SearchAttrStatus.ValueSet(out.Status)); err != nil {
			workflow.GetLogger(ctx).Warn("could not set the AnnealStatus search attribute", "error", err)
		}
	}
	if stopped {
		return &out, temporal.NewCanceledError(out.Error)
	}
	if withAttrs && out.Status == contract.OutcomeError {
		// The end is recorded: the workflow fails too, so that
		// ExecutionStatus="Failed" finds the transactions that failed.
		msg := out.Error
		if msg == "" {
			msg = "the transaction ended in error"
		}
		return &out, temporal.NewNonRetryableApplicationError(msg, contract.ErrTypeTransactionFailed, nil, out)
	}
	return &out, nil
}

// runGraphChild runs one graph as a GraphRun child workflow and waits for
// it; cancelling the transaction cancels it, and it stops its nodes.
func runGraphChild(ctx workflow.Context, in contract.GraphInput, withAttrs bool) (contract.GraphResult, error) {
	opts := workflow.ChildWorkflowOptions{
		WorkflowID:          contract.GraphWorkflowID(in.TransactionID, in.GraphIndex),
		WaitForCancellation: true,
		StaticSummary: fmt.Sprintf("graph %d (%s) of transaction %s: %d node(s), %d run(s)",
			in.GraphIndex, in.Plan.GraphType, in.TransactionID, len(in.Plan.Nodes), in.Plan.Runs),
	}
	if withAttrs {
		opts.TypedSearchAttributes = childSearchAttributes(ctx, in.Plan.GraphType, "")
	}
	cctx := workflow.WithChildOptions(ctx, opts)
	var res contract.GraphResult
	err := workflow.ExecuteChildWorkflow(cctx, contract.GraphWorkflow, in).Get(ctx, &res)
	return res, err
}

// GraphRun runs one graph of a transaction: a NodeRun child per planned
// node (see runGraph). Its history grows with the graph's nodes only.
func GraphRun(ctx workflow.Context, in contract.GraphInput) (*contract.GraphResult, error) {
	res := runGraph(ctx, in.TransactionInput, in.GraphIndex, &in.Plan)
	return &res, nil
}

// runGraph starts a node workflow per planned node, at most
// MaxNodesInFlight at a time (and, in a graph of more than
// nodeStartWindow nodes, at most that many asked for and not yet
// started), and waits for all of them.
func runGraph(ctx workflow.Context, in contract.TransactionInput, gi int, gp *contract.GraphPlan) contract.GraphResult {
	limit := gp.MaxNodesInFlight
	if limit <= 0 {
		limit = contract.DefaultMaxNodesInFlight
	}
	threshold := 100
	if gp.FailureThreshold != nil {
		threshold = *gp.FailureThreshold
	}
	// Exceeding the failure threshold cancels the graph's node workflows
	// (not the transaction): they finish what runs and cancel the rest.
	gctx, abort := workflow.WithCancel(ctx)
	defer abort()
	failedNodes := 0
	withAttrs := workflow.GetVersion(ctx, versionSearchAttrs, workflow.DefaultVersion, 1) >= 1
	window := 0
	if len(gp.Nodes) > nodeStartWindow && workflow.GetVersion(ctx, versionStartWindow, workflow.DefaultVersion, 1) >= 1 {
		window = nodeStartWindow
	}
	var res contract.GraphResult
	sel := workflow.NewSelector(ctx)
	inFlight := 0
	// started is ready once each of the `starting` node workflows asked for
	// has started (or failed to).
	started := workflow.NewSelector(ctx)
	starting := 0
	for _, node := range gp.Nodes {
		for inFlight >= limit {
			sel.Select(ctx)
			inFlight--
		}
		for window > 0 && starting >= window {
			started.Select(ctx)
			starting--
		}
		if gctx.Err() != nil {
			break // stopped or aborted: start no more nodes; their runs are cancelled at the end
		}
		node := node
		opts := workflow.ChildWorkflowOptions{
			WorkflowID:          contract.NodeWorkflowID(in.TransactionID, node.Name),
			WaitForCancellation: true,
			StaticSummary:       fmt.Sprintf("%s graph on %s: %d task(s)", gp.GraphType, node.Name, node.Runs),
		}
		if withAttrs {
			opts.TypedSearchAttributes = childSearchAttributes(ctx, gp.GraphType, node.Name)
		}
		cctx := workflow.WithChildOptions(gctx, opts)
		nin := contract.NodeInput{
			GraphRef:  contract.GraphRef{TransactionID: in.TransactionID, GraphIndex: gi},
			GraphType: gp.GraphType, NodeID: node.ID, NodeName: node.Name,
			HeartbeatTimeoutSec: in.HeartbeatTimeoutSec,
		}
		f := workflow.ExecuteChildWorkflow(cctx, contract.NodeWorkflow, nin)
		inFlight++
		if window > 0 {
			starting++
			started.AddFuture(f.GetChildWorkflowExecution(), func(workflow.Future) {})
		}
		sel.AddFuture(f, func(f workflow.Future) {
			var r contract.NodeResult
			err := f.Get(ctx, &r)
			defer func() {
				if res.Aborted == "" && failedNodes*100 > threshold*len(gp.Nodes) {
					res.Aborted = fmt.Sprintf("%d of %d nodes failed, over the failure threshold of %d%%: the other nodes were stopped",
						failedNodes, len(gp.Nodes), threshold)
					abort()
				}
			}()
			if err == nil {
				res.Add(r)
				if r.Failed > 0 {
					failedNodes++
				}
				return
			}
			var canceled *temporal.CanceledError
			if errors.As(err, &canceled) {
				return
			}
			failedNodes++
			// The node's workflow died (terminated, timed out, a bug): fail
			// what it left so that nothing waits for it forever.
			res.Lost = append(res.Lost, node.Name)
			dctx, cancel := workflow.NewDisconnectedContext(ctx)
			defer cancel()
			abandon := contract.NodeAbandon{
				NodeRef: contract.NodeRef{GraphRef: nin.GraphRef, NodeID: node.ID},
				Reason:  "node workflow ended abnormally: " + rootMessage(err),
			}
			_ = workflow.ExecuteActivity(withSummary(stateActivity(dctx), "fail what the workflow of %s left", node.Name),
				contract.AbandonNodeRunsActivity, abandon).Get(dctx, nil)
			res.Failed++
		})
	}
	for ; inFlight > 0; inFlight-- {
		sel.Select(ctx)
	}
	return res
}

// hasAnnealAttributes reports whether the workflow was started with anneal's
// search attributes (its starter found them registered on the namespace).
func hasAnnealAttributes(ctx workflow.Context) bool {
	_, ok := workflow.GetTypedSearchAttributes(ctx).GetKeyword(contract.SearchAttrTransaction)
	return ok
}

// childSearchAttributes are a child's search attributes: the transaction
// and deployment of the running workflow, with the child's graph type and
// node. None when the running workflow has none: the namespace may not
// have them registered, and a child refused for that would never start.
func childSearchAttributes(ctx workflow.Context, graphType, node string) temporal.SearchAttributes {
	sa := workflow.GetTypedSearchAttributes(ctx)
	tx, ok := sa.GetKeyword(contract.SearchAttrTransaction)
	if !ok {
		return temporal.SearchAttributes{}
	}
	dep, _ := sa.GetKeyword(contract.SearchAttrDeployment)
	return contract.SearchAttributesOf(dep, graphType, node, tx, "")
}

// withSummary sets the summary of the activities scheduled with ctx, as
// the Web UI shows them. It is metadata only: replay does not compare it.
func withSummary(ctx workflow.Context, format string, args ...any) workflow.Context {
	ao := workflow.GetActivityOptions(ctx)
	ao.Summary = fmt.Sprintf(format, args...)
	return workflow.WithActivityOptions(ctx, ao)
}

// rootMessage is the innermost message of a Temporal error chain, without
// the SDK's decorations, which is what an operator needs to read.
func rootMessage(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			var appErr *temporal.ApplicationError
			if errors.As(err, &appErr) {
				return appErr.Message()
			}
			return err.Error()
		}
		err = next
	}
}
