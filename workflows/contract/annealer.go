package contract

import (
	"context"
	"fmt"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// Workflow types of the Crowbar model.
const (
	// AnnealerWorkflow is the type of the one long-lived workflow that
	// starts the noderoles that can run.
	AnnealerWorkflow = "Annealer"
	// NodeRoleWorkflow is the type of the workflow that runs one noderole
	// once through its jig.
	NodeRoleWorkflow = "NodeRoleRun"
	// NodeBootstrapWorkflow is the type of the workflow that gives a new
	// node its default roles.
	NodeBootstrapWorkflow = "NodeBootstrap"
)

// SignalAnnealerKick wakes the annealer: something changed (a commit, a
// node, a finished or retried noderole). Its payload is the reason.
const SignalAnnealerKick = "kick"

// NodeRole states the workflows see (the Crowbar noderole state machine).
const (
	NodeRoleProposed   = "proposed"
	NodeRoleTodo       = "todo"
	NodeRoleBlocked    = "blocked"
	NodeRoleTransition = "transition"
	NodeRoleActive     = "active"
	NodeRoleError      = "error"
)

// Role jigs: how a noderole's run reaches its node.
const (
	RoleJigAgent = "agent" // the node's agent, through the task-run queue
	RoleJigLocal = "local" // the worker itself
	RoleJigNoop  = "noop"  // nothing to run
	RoleJigSSH   = "ssh"   // the worker, on the node over SSH
)

// AnnealerWorkflowID is the ID of the installation's annealer workflow.
func AnnealerWorkflowID(taskQueue string) string { return scopedID(taskQueue, "annealer") }

// NodeRoleWorkflowID is the ID of run number run of a noderole:
// noderole-<id>/run-<n>.
func NodeRoleWorkflowID(taskQueue string, noderoleID int64, run int) string {
	return scopedID(taskQueue, fmt.Sprintf("noderole-%d/run-%d", noderoleID, run))
}

// NodeBootstrapWorkflowID is the ID of a node's bootstrap workflow. The
// node's id is part of it: a registration whose transaction rolled back
// leaves a workflow for an id that never existed, which must not stand in
// for the node registered next under the same name.
func NodeBootstrapWorkflowID(taskQueue, node string, nodeID int64) string {
	return scopedID(taskQueue, fmt.Sprintf("bootstrap/%s/%d", node, nodeID))
}

// AnnealerInput starts (or continues) the annealer workflow; it carries
// nothing yet, and is a struct so that fields can be added compatibly.
type AnnealerInput struct{}

// AnnealResult says what one Anneal activity started.
type AnnealResult struct {
	Started []int64 `json:"started"`
	// More is set when the batch was full: there may be more to start.
	More bool `json:"more,omitempty"`
}

// NodeRoleRunInput starts one run of a noderole.
type NodeRoleRunInput struct {
	NodeRoleID          int64  `json:"noderole_id"`
	Run                 int    `json:"run"`
	Node                string `json:"node"`
	Role                string `json:"role"`
	HeartbeatTimeoutSec int    `json:"heartbeat_timeout_sec,omitempty"`
}

// NodeRoleRunPlan is what one run of a noderole needs: the task run that
// carries it to the node and the jig that runs it (the result of
// PrepareNodeRoleRun).
type NodeRoleRunPlan struct {
	NodeRoleID int64  `json:"noderole_id"`
	Run        int    `json:"run"`
	RunID      int64  `json:"run_id"`
	NodeID     int64  `json:"node_id"`
	Node       string `json:"node"`
	Role       string `json:"role"`
	Jig        string `json:"jig"`
	// Script is empty when the role has nothing to run on the node: the
	// run then hands the attributes back unchanged.
	HasScript  bool `json:"has_script"`
	TimeoutSec int  `json:"timeout_sec"`
	// Skip says why there is nothing to do: the noderole is no longer in
	// transition for this run (a retried activity, a run already finished).
	Skip string `json:"skip,omitempty"`
}

// NodeRoleRunEnd reports how a noderole's run ended.
type NodeRoleRunEnd struct {
	NodeRoleID int64  `json:"noderole_id"`
	Run        int    `json:"run"`
	OK         bool   `json:"ok"`
	Reason     string `json:"reason,omitempty"`
}

// NodeRoleRunResult says how a noderole's run ended.
type NodeRoleRunResult struct {
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Skipped says why nothing ran (the noderole had left transition).
	Skipped string `json:"skipped,omitempty"`
}

// NodeBootstrapInput names the node to bootstrap.
type NodeBootstrapInput struct {
	NodeID int64  `json:"node_id"`
	Node   string `json:"node"`
}

// BootstrapResult says what BootstrapNode bound.
type BootstrapResult struct {
	Node string `json:"node"`
	// Flag is the role flag that chose the roles: bootstrap for an admin
	// node, discovery for the others.
	Flag string `json:"flag"`
	// NodeRoles are the node's default noderoles in the system deployment's
	// committed snapshot, in the order they were bound.
	NodeRoles []int64 `json:"noderoles"`
	// Roles names them, in the same order.
	Roles []string `json:"roles"`
}

// KickAnnealer wakes the annealer of the installation on taskQueue,
// starting it if it is not running. Callers kick after committing what
// changed, so a kick never arrives before the change is visible.
func KickAnnealer(ctx context.Context, tc client.Client, taskQueue, reason string) error {
	if taskQueue == "" {
		taskQueue = DefaultTaskQueue
	}
	_, err := tc.SignalWithStartWorkflow(ctx, AnnealerWorkflowID(taskQueue), SignalAnnealerKick, reason,
		client.StartWorkflowOptions{ID: AnnealerWorkflowID(taskQueue), TaskQueue: taskQueue,
			StaticSummary: "the annealer: starts each bound noderole once its parents are active, one at a time per node"},
		AnnealerWorkflow, AnnealerInput{})
	if err != nil {
		return fmt.Errorf("wake the annealer (%s): %w", reason, err)
	}
	return nil
}

// StartNodeRoleRun starts the workflow of run number in.Run of a noderole.
// An earlier workflow with the same ID (a start whose database transaction
// then failed) does not stand in the way, ended or not: one still running
// was started by an attempt that rolled back, is stale (it would find the
// noderole todo and skip), and gives way.
func StartNodeRoleRun(ctx context.Context, tc client.Client, taskQueue string, in NodeRoleRunInput) error {
	err := executeWorkflow(ctx, tc, client.StartWorkflowOptions{
		ID:                       NodeRoleWorkflowID(taskQueue, in.NodeRoleID, in.Run),
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enums.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
		StaticSummary:            fmt.Sprintf("%s on %s (run %d)", in.Role, in.Node, in.Run),
		TypedSearchAttributes:    SearchAttributesOf("", "", in.Node, "", ""),
	}, NodeRoleWorkflow, in)
	if err != nil {
		return fmt.Errorf("start the run workflow: %w", err)
	}
	return nil
}

// StartNodeBootstrap starts a new node's bootstrap workflow. A node deleted
// and created again under its name starts anew (its id differs).
func StartNodeBootstrap(ctx context.Context, tc client.Client, taskQueue string, in NodeBootstrapInput) error {
	return executeWorkflow(ctx, tc, client.StartWorkflowOptions{
		ID: NodeBootstrapWorkflowID(taskQueue, in.Node, in.NodeID), TaskQueue: taskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		StaticSummary:         "default roles for " + in.Node,
		// A new node's default roles live in the system deployment.
		TypedSearchAttributes: SearchAttributesOf("system", "", in.Node, "", ""),
	}, NodeBootstrapWorkflow, in)
}
