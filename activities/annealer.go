package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// Names shared by the annealer's workflows and those who start or wake
// them; they live here because the workflows package imports this one.
const (
	// AnnealBatch is how many noderoles one Anneal activity starts at most;
	// the annealer loops at once while batches come back full.
	AnnealBatch = 100
)

// NodeRoles is what the annealer's activities need of Crowbar's model:
// choosing and starting noderoles, preparing and finishing their runs,
// finding transitions without a run, and a new node's bootstrap (the
// Crowbar store).
type NodeRoles interface {
	NextNodeRoles(ctx context.Context, deploymentID int64, limit int) ([]crowbar.NodeRole, error)
	StartNodeRole(ctx context.Context, id int64, start func(nr *crowbar.NodeRole) error) (*crowbar.NodeRole, error)
	NodeRolesInTransition(ctx context.Context) ([]crowbar.NodeRole, error)
	PrepareNodeRoleRun(ctx context.Context, id int64, run int) (*contract.NodeRoleRunPlan, error)
	FinishNodeRoleRun(ctx context.Context, id int64, run int, ok bool, reason string) (*crowbar.NodeRole, error)
	BootstrapNode(ctx context.Context, nodeID int64) (*contract.BootstrapResult, error)
}

// Anneal starts the noderoles that can run now (models.NextNodeRoles): each
// goes to transition and gets its run workflow in one database transaction.
// A noderole another caller started first is passed over.
func (a *Activities) Anneal(ctx context.Context) (*contract.AnnealResult, error) {
	next, err := a.NodeRoles.NextNodeRoles(ctx, 0, AnnealBatch)
	if err != nil {
		return nil, err
	}
	res := &contract.AnnealResult{More: len(next) == AnnealBatch}
	var failed error
	for _, nr := range next {
		_, err := a.NodeRoles.StartNodeRole(ctx, nr.ID, func(n *crowbar.NodeRole) error {
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

// startNodeRoleRun starts the workflow of the noderole's next run.
func (a *Activities) startNodeRoleRun(ctx context.Context, nr *crowbar.NodeRole) error {
	return contract.StartNodeRoleRun(ctx, a.Temporal, a.TaskQueue, contract.NodeRoleRunInput{
		NodeRoleID: nr.ID, Run: nr.RunCount + 1, Node: nr.NodeName, Role: nr.RoleName, HeartbeatTimeoutSec: a.HeartbeatTimeoutSec,
	})
}

// RecoverTransitions ends, as errors, the noderoles in transition whose run
// workflow is gone (terminated by an operator, or lost with its history):
// otherwise they would hold their node forever. The annealer runs it when
// it starts and when it has been idle for its fallback period.
func (a *Activities) RecoverTransitions(ctx context.Context) ([]int64, error) {
	nrs, err := a.NodeRoles.NodeRolesInTransition(ctx)
	if err != nil {
		return nil, err
	}
	var ended []int64
	for _, nr := range nrs {
		run := nr.RunCount + 1
		id := contract.NodeRoleWorkflowID(a.TaskQueue, nr.ID, run)
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
		if _, err := a.NodeRoles.FinishNodeRoleRun(ctx, nr.ID, run, false, reason); err != nil {
			return nil, err
		}
		a.Log.Warn("noderole in transition without a run", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "reason", reason)
		ended = append(ended, nr.ID)
	}
	return ended, nil
}

// PrepareNodeRoleRun creates the task run of a noderole's run with the
// attributes it sees (see models.PrepareNodeRoleRun).
func (a *Activities) PrepareNodeRoleRun(ctx context.Context, in contract.NodeRoleRunInput) (*contract.NodeRoleRunPlan, error) {
	return a.NodeRoles.PrepareNodeRoleRun(ctx, in.NodeRoleID, in.Run)
}

// FinishNodeRoleRun records the end of a noderole's run (its state, its
// wall, its children) and wakes the annealer: the node is free, and
// children may have become todo. It returns the noderole's state only: the
// history keeps summaries, Postgres the data.
func (a *Activities) FinishNodeRoleRun(ctx context.Context, end contract.NodeRoleRunEnd) (string, error) {
	nr, err := a.NodeRoles.FinishNodeRoleRun(ctx, end.NodeRoleID, end.Run, end.OK, end.Reason)
	if err != nil {
		return "", err
	}
	a.Log.Info("noderole finished", "noderole", nr.ID, "node", nr.NodeName, "role", nr.RoleName, "state", nr.State, "reason", end.Reason)
	if err := contract.KickAnnealer(ctx, a.Temporal, a.TaskQueue, fmt.Sprintf("noderole %d is %s", nr.ID, nr.State)); err != nil {
		return "", err
	}
	return nr.State, nil
}

// BootstrapNode binds a new node's default roles and recommits the system
// snapshot (models.BootstrapNode), then wakes the annealer. A binding the
// release makes impossible (a discovery role whose parent is nowhere) fails
// for good, naming the role; a node whose creation was rolled back too.
func (a *Activities) BootstrapNode(ctx context.Context, in contract.NodeBootstrapInput) (*contract.BootstrapResult, error) {
	res, err := a.NodeRoles.BootstrapNode(ctx, in.NodeID)
	var bad *models.InputError
	var conflict *models.ConflictError
	switch {
	case errors.As(err, &bad) || errors.As(err, &conflict):
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypeBadInput, err)
	case errors.Is(err, models.ErrNotFound) && activity.GetInfo(ctx).Attempt >= missingTransactionAttempts:
		return nil, temporal.NewNonRetryableApplicationError("the node's row does not exist (its creation was rolled back): "+err.Error(), contract.ErrTypeBadInput, err)
	case err != nil:
		return nil, err
	}
	a.Log.Info("node bootstrapped", "node", res.Node, "flag", res.Flag, "roles", res.Roles)
	if err := contract.KickAnnealer(ctx, a.Temporal, a.TaskQueue, "node "+res.Node+" bootstrapped"); err != nil {
		return nil, err
	}
	return res, nil
}
