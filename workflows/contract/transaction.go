package contract

import (
	"context"
	"fmt"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// Workflow type names of a transaction, as they appear in the Web UI.
const (
	// TransactionWorkflow runs a transaction's graphs one after another.
	TransactionWorkflow = "Transaction"
	// NodeWorkflow runs one node's tasks of one graph.
	NodeWorkflow = "NodeRun"
	// GraphWorkflow runs one graph of a transaction: a NodeRun per node.
	GraphWorkflow = "GraphRun"
)

// SignalRunsFinished carries RunsFinished from one node workflow to another.
const SignalRunsFinished = "runs-finished"

// TransactionWorkflowID is the workflow ID of a transaction: tx-<uuid>.
func TransactionWorkflowID(txID string) string { return "tx-" + txID }

// GraphWorkflowID is the workflow ID of one graph of a transaction:
// tx-<uuid>/graph-<index> (a node name is an FQDN, so never graph-<n>).
func GraphWorkflowID(txID string, graphIndex int) string {
	return fmt.Sprintf("tx-%s/graph-%d", txID, graphIndex)
}

// NodeWorkflowID is the workflow ID of a node's share of a transaction:
// tx-<uuid>/<node>.
func NodeWorkflowID(txID, node string) string { return fmt.Sprintf("tx-%s/%s", txID, node) }

// Task run states.
const (
	RunPlanned   = "planned" // recorded by a dry run; never dispatched
	RunPending   = "pending"
	RunRunning   = "running"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
	RunBlocked   = "blocked"
	RunSkipped   = "skipped"
	RunCancelled = "cancelled"
)

// RunFinal reports whether a run in this state will not change any more
// within its transaction.
func RunFinal(state string) bool {
	switch state {
	case RunSucceeded, RunFailed, RunBlocked, RunSkipped, RunCancelled, RunPlanned:
		return true
	}
	return false
}

// Node outcomes of a graph, naming the callback of the graph's metadata
// that applies: on_success, on_error or on_stop.
const (
	OutcomeSuccess = "success"
	OutcomeError   = "error"
	OutcomeStop    = "stop"
)

// DefaultMaxNodesInFlight caps the node workflows of a graph running at
// once when nobody sets it: Temporal allows 2,000 pending children.
const DefaultMaxNodesInFlight = 1000

// TransactionInput starts a transaction workflow. Everything else is read
// from Postgres by the activities.
type TransactionInput struct {
	TransactionID string `json:"transaction_id"`
	// Graphs is how many graphs the transaction runs, one after another.
	Graphs int `json:"graphs"`
	// HeartbeatTimeoutSec overrides DefaultHeartbeatTimeout.
	HeartbeatTimeoutSec int `json:"heartbeat_timeout_sec,omitempty"`
}

// TransactionOutcome is the transaction workflow's result.
type TransactionOutcome struct {
	Status string         `json:"status"`
	Error  string         `json:"error,omitempty"`
	Counts map[string]int `json:"counts"`
}

// GraphRef addresses one graph of a transaction.
type GraphRef struct {
	TransactionID string `json:"transaction_id"`
	GraphIndex    int    `json:"graph_index"`
}

// NodeRef addresses one node's share of a graph.
type NodeRef struct {
	GraphRef
	NodeID int64 `json:"node_id"`
}

// NodeInput starts a node workflow.
type NodeInput struct {
	GraphRef
	GraphType           string `json:"graph_type"`
	NodeID              int64  `json:"node_id"`
	NodeName            string `json:"node_name"`
	HeartbeatTimeoutSec int    `json:"heartbeat_timeout_sec,omitempty"`
}

// GraphInput starts a GraphRun workflow: the transaction, the graph's index
// and its plan (as PlanGraph returned it).
type GraphInput struct {
	TransactionInput
	GraphIndex int       `json:"graph_index"`
	Plan       GraphPlan `json:"plan"`
}

// GraphResult sums up the node workflows of one graph.
type GraphResult struct {
	NodeResult
	// Lost names the nodes whose workflow ended abnormally.
	Lost []string `json:"lost,omitempty"`
	// Aborted says why the failure threshold stopped the graph.
	Aborted string `json:"aborted,omitempty"`
}

// NodeResult counts how a node's runs ended.
type NodeResult struct {
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Blocked   int `json:"blocked"`
	Cancelled int `json:"cancelled"`
}

// Add adds another count to r.
func (r *NodeResult) Add(o NodeResult) {
	r.Succeeded += o.Succeeded
	r.Failed += o.Failed
	r.Blocked += o.Blocked
	r.Cancelled += o.Cancelled
}

// RunsFinished tells a node workflow that runs it waits for have ended
// (the payload of SignalRunsFinished).
type RunsFinished struct {
	States map[int64]string `json:"states"`
}

// WakeNodes is the input of WakeNodesActivity: the SignalRunsFinished
// wake-ups of one node workflow to many others, sent by an activity so
// that they do not queue up on the sender's own workflow.
type WakeNodes struct {
	TransactionID string     `json:"transaction_id"`
	Wakes         []NodeWake `json:"wakes"`
}

// NodeWake is one node's wake-up: the states of the runs it waits for.
type NodeWake struct {
	Node   string           `json:"node"`
	States map[int64]string `json:"states"`
}

// PlannedNode is one node of a planned graph, as the transaction workflow
// needs it: who to start a child workflow for.
type PlannedNode struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	Runs int    `json:"runs"`
}

// GraphPlan summarises a planned graph (the result of PlanGraph).
type GraphPlan struct {
	GraphType string        `json:"graph_type"`
	DryRun    bool          `json:"dry_run"`
	Nodes     []PlannedNode `json:"nodes"`
	Runs      int           `json:"runs"`
	Warnings  []string      `json:"warnings,omitempty"`
	// The graph's safety valves, defaults applied.
	MaxNodesInFlight int  `json:"max_nodes_in_flight"`
	FailureThreshold *int `json:"failure_threshold,omitempty"`
}

// NodeRun is one run as a node's workflow sees it: what to run and which
// runs it waits for.
type NodeRun struct {
	ID         int64   `json:"id"`
	Task       string  `json:"task"`
	State      string  `json:"state"`
	TimeoutSec int     `json:"timeout_sec"`
	Retries    int     `json:"retries"`
	Parents    []int64 `json:"parents,omitempty"`     // runs on this node
	Remote     []int64 `json:"remote,omitempty"`      // runs on other nodes
	RemoteKids []Peer  `json:"remote_kids,omitempty"` // runs on other nodes waiting for this one
	NoOp       bool    `json:"no_op,omitempty"`       // nothing to execute
	// OnOrchestrator runs in the worker, not on the node (master_shell,
	// move_to_bootstrap).
	OnOrchestrator bool `json:"on_orchestrator,omitempty"`
	// OverSSH is run by the worker on the node over SSH (the ssh jig).
	OverSSH bool `json:"over_ssh,omitempty"`
	// Reboot waits, after the agent's report, for a new boot id.
	Reboot bool `json:"reboot,omitempty"`
}

// Peer names a run on another node.
type Peer struct {
	RunID int64  `json:"run_id"`
	Node  string `json:"node"`
}

// NodePlan is a node's share of a planned graph (the result of
// LoadNodePlan).
type NodePlan struct {
	Runs []NodeRun `json:"runs"`
	// RemoteStates holds the current state of the remote parents, so a node
	// workflow started late still learns what finished before it.
	RemoteStates map[int64]string `json:"remote_states,omitempty"`
}

// RunTaskInput names the run to execute (RunTaskOnNode, RunOnOrchestrator,
// RunOverSSH).
type RunTaskInput struct {
	RunID int64  `json:"run_id"`
	Task  string `json:"task"`
	Node  string `json:"node"`
}

// RunChainInput names a chain of a node's runs to execute one after the
// other under one RunChainOnNode activity: each starts when the one before
// succeeded, none waits for another node, and only the last may have
// dependants on other nodes (so they are woken as soon as it ends).
type RunChainInput struct {
	Node string     `json:"node"`
	Runs []ChainRun `json:"runs"`
}

// ChainRun is one run of a chain.
type ChainRun struct {
	RunID int64  `json:"run_id"`
	Task  string `json:"task"`
}

// ChainOutcome is how a chain ended (the result of RunChainOnNode): the
// state of each of its runs. A chain ends at its last run, at the first
// that fails, or when its transaction is stopped; runs after the end stay
// pending.
type ChainOutcome struct {
	States map[int64]string `json:"states"`
}

// LostChain names a chain whose activity ended without a report (timed
// out, failed): EndLostChain ends it in Postgres.
type LostChain struct {
	Head   int64  `json:"head"`
	Reason string `json:"reason"`
}

// LostChainEnd is how EndLostChain left a lost chain's runs: their states,
// and which of them it took back to pending because no agent had
// acknowledged them (they are handed out again).
type LostChainEnd struct {
	States    map[int64]string `json:"states"`
	TakenBack []int64          `json:"taken_back,omitempty"`
}

// RunDelivery says how far a run got towards its node's agent (the result
// of RunDelivery): its state and attempt, and whether the agent
// acknowledged that attempt.
type RunDelivery struct {
	State   string `json:"state"`
	Attempt int    `json:"attempt"`
	Acked   bool   `json:"acked"`
}

// RunOutcome is what a finished run reports back to its workflow; the rest
// (outputs, logs) stays in Postgres.
type RunOutcome struct {
	ExitCode int `json:"exit_code"`
}

// RunFailure records a run that failed outside the agent's report (timeout,
// lost agent) and the runs that are blocked by a failure.
type RunFailure struct {
	RunID   int64   `json:"run_id,omitempty"`
	Reason  string  `json:"reason,omitempty"`
	Blocked []int64 `json:"blocked,omitempty"`
}

// RunsToCancel lists runs that will not start because the transaction stops.
type RunsToCancel struct {
	RunIDs []int64 `json:"run_ids"`
	Reason string  `json:"reason"`
}

// NodeAbandon fails what a node workflow left unfinished.
type NodeAbandon struct {
	NodeRef
	Reason string `json:"reason"`
}

// FinishInput says how a transaction ended as far as its workflow knows.
type FinishInput struct {
	TransactionID string `json:"transaction_id"`
	Stopped       bool   `json:"stopped,omitempty"`
	FailReason    string `json:"fail_reason,omitempty"`
}

// NodeGraphEnd says how a node's share of a graph ended.
type NodeGraphEnd struct {
	NodeRef
	Outcome string `json:"outcome"` // OutcomeSuccess, OutcomeError or OutcomeStop
}

// RebootWait asks AwaitReboot to wait for a node to come back with a boot
// id other than the one it had before the reboot.
type RebootWait struct {
	RunID      int64  `json:"run_id"`
	NodeID     int64  `json:"node_id"`
	Node       string `json:"node"`
	OldBootID  string `json:"old_boot_id"`
	TimeoutSec int    `json:"timeout_sec"`
}

// CompleteChainOnNode completes the RunChainOnNode activity identified by
// its task token with the states of the chain's runs: the one encoding of
// a chain's outcome for its workflow.
func CompleteChainOnNode(ctx context.Context, tc ActivityCompleter, taskToken []byte, states map[int64]string) error {
	return tc.CompleteActivity(ctx, taskToken, ChainOutcome{States: states}, nil)
}

// StartTransaction starts a transaction's workflow under its readable ID
// (opts.ID must be TransactionWorkflowID). It fails, rather than attaching
// to it, if a run with that ID is still open.
func StartTransaction(ctx context.Context, tc client.Client, opts client.StartWorkflowOptions, in TransactionInput) error {
	opts.WorkflowExecutionErrorWhenAlreadyStarted = true
	return executeWorkflow(ctx, tc, opts, TransactionWorkflow, in)
}

// ActivityCompleter completes an activity by its task token: a Temporal
// client (or, in tests, an adapter over the test environment).
type ActivityCompleter interface {
	CompleteActivity(ctx context.Context, taskToken []byte, result any, err error) error
}

// CompleteRunOnNode completes the RunTaskOnNode activity identified by its
// task token with the agent's report: a succeeded run completes it with a
// RunOutcome; a failed one fails it with ErrTypeTaskFailed (retryable per
// the task's retries), carrying the RunOutcome as details and reason as the
// message. It is the one encoding of a run's outcome for its workflow.
func CompleteRunOnNode(ctx context.Context, tc ActivityCompleter, taskToken []byte, succeeded bool, exitCode int, reason string) error {
	out := RunOutcome{ExitCode: exitCode}
	if succeeded {
		return tc.CompleteActivity(ctx, taskToken, out, nil)
	}
	return tc.CompleteActivity(ctx, taskToken, nil, temporal.NewApplicationError(reason, ErrTypeTaskFailed, out))
}
