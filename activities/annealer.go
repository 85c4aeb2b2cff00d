package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/models"
)

// DefaultTaskQueue is the task queue of an anneal installation.
const DefaultTaskQueue = "anneal"

// Names shared by the annealer's workflows and those who start or wake
// them; they live here because the workflows package imports this one.
const (
	// AnnealerWorkflow is the type of the one long-lived workflow that
	// starts the noderoles that can run.
	AnnealerWorkflow = "Annealer"
	// NodeRoleWorkflow is the type of the workflow that runs one noderole
	// once through its jig.
	NodeRoleWorkflow = "NodeRoleRun"
	// SignalAnnealerKick wakes the annealer: something changed (a commit, a
	// node, a finished or retried noderole). Its payload is the reason.
	SignalAnnealerKick = "kick"
	// AnnealBatch is how many noderoles one Anneal activity starts at most;
	// the annealer loops at once while batches come back full.
	AnnealBatch = 100
)

// scopedID prefixes a workflow ID with the task queue unless it is the
// default one, so that several installations (the test suite's stacks)
// can share a Temporal namespace.
func scopedID(taskQueue, id string) string {
	if taskQueue == "" || taskQueue == DefaultTaskQueue {
		return id
	}
	return taskQueue + "/" + id
}

// AnnealerWorkflowID is the ID of the installation's annealer workflow.
func AnnealerWorkflowID(taskQueue string) string { return scopedID(taskQueue, "annealer") }

// NodeRoleWorkflowID is the ID of run number run of a noderole.
func NodeRoleWorkflowID(taskQueue string, noderoleID int64, run int) string {
	return scopedID(taskQueue, fmt.Sprintf("noderole-%d/run-%d", noderoleID, run))
}

// AnnealerInput starts (or continues) the annealer workflow; it carries
// nothing yet, and is a struct so that fields can be added compatibly.
type AnnealerInput struct{}

// NodeRoleRunInput starts one run of a noderole.
type NodeRoleRunInput struct {
	NodeRoleID          int64  `json:"noderole_id"`
	Run                 int    `json:"run"`
	Node                string `json:"node"`
	Role                string `json:"role"`
	HeartbeatTimeoutSec int    `json:"heartbeat_timeout_sec,omitempty"`
}

// KickAnnealer wakes the annealer of the installation on taskQueue,
// starting it if it is not running. Callers kick after committing what
// changed, so a kick never arrives before the change is visible.
func KickAnnealer(ctx context.Context, tc client.Client, taskQueue, reason string) error {
	if taskQueue == "" {
		taskQueue = DefaultTaskQueue
	}
	_, err := tc.SignalWithStartWorkflow(ctx, AnnealerWorkflowID(taskQueue), SignalAnnealerKick, reason,
		client.StartWorkflowOptions{ID: AnnealerWorkflowID(taskQueue), TaskQueue: taskQueue},
		AnnealerWorkflow, AnnealerInput{})
	if err != nil {
		return fmt.Errorf("wake the annealer (%s): %w", reason, err)
	}
	return nil
}

// AnnealResult says what one Anneal activity started.
type AnnealResult struct {
	Started []int64 `json:"started"`
	// More is set when the batch was full: there may be more to start.
	More bool `json:"more,omitempty"`
}

// Anneal starts the noderoles that can run now (models.NextNodeRoles): each
// goes to transition and gets its run workflow in one database transaction.
// A noderole another caller started first is passed over.
func (a *Activities) Anneal(ctx context.Context) (*AnnealResult, error) {
	next, err := a.Store.NextNodeRoles(ctx, 0, AnnealBatch)
	if err != nil {
		return nil, err
	}
	res := &AnnealResult{More: len(next) == AnnealBatch}
	var failed error
	for _, nr := range next {
		_, err := a.Store.StartNodeRole(ctx, nr.ID, func(n *models.NodeRole) error {
			return a.startNodeRoleRun(ctx, n)
		})
		var conflict *models.ConflictError
		switch {
		case errors.As(err, &conflict):
			a.Log.Info("noderole not started", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "reason", conflict.Reason)
			continue
		case err != nil:
			// One noderole that cannot start (a failing on_transition hook,
			// Temporal refusing the start) must not hold up the others.
			a.Log.Warn("noderole could not start", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "error", err)
			if failed == nil {
				failed = fmt.Errorf("start noderole %d (%s on %s): %w", nr.ID, nr.RoleName, nr.NodeName, err)
			}
			continue
		}
		a.Log.Info("noderole started", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "run", nr.RunCount+1)
		res.Started = append(res.Started, nr.ID)
	}
	if failed != nil && len(res.Started) == 0 {
		// Nothing started: the activity fails and is retried, so the error
		// shows on the annealer in the Web UI until it clears.
		return nil, failed
	}
	return res, nil
}

// startNodeRoleRun starts the workflow of the noderole's next run. An
// earlier workflow with the same ID (a start whose database transaction
// then failed) does not stand in the way, ended or not.
func (a *Activities) startNodeRoleRun(ctx context.Context, nr *models.NodeRole) error {
	run := nr.RunCount + 1
	_, err := a.Temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                    NodeRoleWorkflowID(a.TaskQueue, nr.ID, run),
		TaskQueue:             a.TaskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		// One still running under this ID was started by an attempt whose
		// database transaction rolled back: it is stale (it would find the
		// noderole todo and skip), so it gives way.
		WorkflowIDConflictPolicy: enums.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
		StaticSummary:            fmt.Sprintf("%s on %s (run %d)", nr.RoleName, nr.NodeName, run),
	}, NodeRoleWorkflow, NodeRoleRunInput{
		NodeRoleID: nr.ID, Run: run, Node: nr.NodeName, Role: nr.RoleName, HeartbeatTimeoutSec: a.HeartbeatTimeoutSec,
	})
	if err != nil {
		return fmt.Errorf("start the run workflow: %w", err)
	}
	return nil
}

// RecoverTransitions ends, as errors, the noderoles in transition whose run
// workflow is gone (terminated by an operator, or lost with its history):
// otherwise they would hold their node forever. The annealer runs it when
// it starts and when it has been idle for its fallback period.
func (a *Activities) RecoverTransitions(ctx context.Context) ([]int64, error) {
	nrs, err := a.Store.NodeRolesInTransition(ctx)
	if err != nil {
		return nil, err
	}
	var ended []int64
	for _, nr := range nrs {
		run := nr.RunCount + 1
		id := NodeRoleWorkflowID(a.TaskQueue, nr.ID, run)
		desc, err := a.Temporal.DescribeWorkflowExecution(ctx, id, "")
		var notFound *serviceerror.NotFound
		status := "not found"
		switch {
		case errors.As(err, &notFound):
		case err != nil:
			return nil, fmt.Errorf("look up workflow %s: %w", id, err)
		case desc.GetWorkflowExecutionInfo().GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
			continue
		default:
			status = desc.GetWorkflowExecutionInfo().GetStatus().String()
		}
		reason := fmt.Sprintf("the workflow running it (%s) is %s; retry the noderole (POST /api/v1/noderoles/%d/retry)", id, status, nr.ID)
		if _, err := a.Store.FinishNodeRoleRun(ctx, nr.ID, run, false, reason); err != nil {
			return nil, err
		}
		a.Log.Warn("noderole in transition without a run", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "reason", reason)
		ended = append(ended, nr.ID)
	}
	return ended, nil
}

// PrepareNodeRoleRun creates the task run of a noderole's run with the
// attributes it sees (see models.PrepareNodeRoleRun).
func (a *Activities) PrepareNodeRoleRun(ctx context.Context, in NodeRoleRunInput) (*models.NodeRoleRunPlan, error) {
	return a.Store.PrepareNodeRoleRun(ctx, in.NodeRoleID, in.Run)
}

// NodeRoleRunEnd reports how a noderole's run ended.
type NodeRoleRunEnd struct {
	NodeRoleID int64  `json:"noderole_id"`
	Run        int    `json:"run"`
	OK         bool   `json:"ok"`
	Reason     string `json:"reason,omitempty"`
}

// FinishNodeRoleRun records the end of a noderole's run (its state, its
// wall, its children) and wakes the annealer: the node is free, and
// children may have become todo. It returns the noderole's state only: the
// history keeps summaries, Postgres the data.
func (a *Activities) FinishNodeRoleRun(ctx context.Context, end NodeRoleRunEnd) (string, error) {
	nr, err := a.Store.FinishNodeRoleRun(ctx, end.NodeRoleID, end.Run, end.OK, end.Reason)
	if err != nil {
		return "", err
	}
	a.Log.Info("noderole finished", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "state", nr.State, "reason", end.Reason)
	if err := KickAnnealer(ctx, a.Temporal, a.TaskQueue, fmt.Sprintf("noderole %d is %s", nr.ID, nr.State)); err != nil {
		return "", err
	}
	return nr.State, nil
}

// NodeBootstrapWorkflow is the type of the workflow that gives a new node
// its default roles.
const NodeBootstrapWorkflow = "NodeBootstrap"

// NodeBootstrapWorkflowID is the ID of a node's bootstrap workflow. The
// node's id is part of it: a registration whose transaction rolled back
// leaves a workflow for an id that never existed, which must not stand in
// for the node registered next under the same name.
func NodeBootstrapWorkflowID(taskQueue, node string, nodeID int64) string {
	return scopedID(taskQueue, fmt.Sprintf("bootstrap/%s/%d", node, nodeID))
}

// NodeBootstrapInput names the node to bootstrap.
type NodeBootstrapInput struct {
	NodeID int64  `json:"node_id"`
	Node   string `json:"node"`
}

// BootstrapNode binds a new node's default roles and recommits the system
// snapshot (models.BootstrapNode), then wakes the annealer. A binding the
// release makes impossible (a discovery role whose parent is nowhere) fails
// for good, naming the role; a node whose creation was rolled back too.
func (a *Activities) BootstrapNode(ctx context.Context, in NodeBootstrapInput) (*models.BootstrapResult, error) {
	res, err := a.Store.BootstrapNode(ctx, in.NodeID)
	var bad *models.InputError
	var conflict *models.ConflictError
	switch {
	case errors.As(err, &bad) || errors.As(err, &conflict):
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	case errors.Is(err, models.ErrNotFound) && activity.GetInfo(ctx).Attempt >= missingTransactionAttempts:
		return nil, temporal.NewNonRetryableApplicationError("the node's row does not exist (its creation was rolled back): "+err.Error(), "BadInput", err)
	case err != nil:
		return nil, err
	}
	a.Log.Info("node bootstrapped", "node", res.Node, "flag", res.Flag, "roles", res.Roles)
	if err := KickAnnealer(ctx, a.Temporal, a.TaskQueue, "node "+res.Node+" bootstrapped"); err != nil {
		return nil, err
	}
	return res, nil
}
