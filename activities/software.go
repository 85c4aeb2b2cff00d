package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/activity"

	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// SoftwareRounds is what a software deployment's activities need: starting
// and ending a round (the Heat store).
type SoftwareRounds interface {
	PrepareSoftwareRound(ctx context.Context, id int64, round int) (*contract.SoftwarePrepared, error)
	FinishSoftwareRound(ctx context.Context, id int64, round int, status, reason string) (bool, error)
	RemoveDeletedSoftware(ctx context.Context, id int64, round int) (bool, error)
}

// PrepareSoftwareRound starts a round: it resolves the get_attr references
// of the deployment's inputs and, when they are all COMPLETE, marks the
// deployment IN_PROGRESS and wakes the node's agent. Idempotent.
func (a *Activities) PrepareSoftwareRound(ctx context.Context, in contract.SoftwareRound) (*contract.SoftwarePrepared, error) {
	p, err := a.Software.PrepareSoftwareRound(ctx, in.DeploymentID, in.Round)
	if errors.Is(err, heat.ErrRoundNotYetVisible) && activity.GetInfo(ctx).Attempt > 8 {
		// Retried for minutes: the request that started the round rolled
		// back (or the deployment was deleted).
		return &contract.SoftwarePrepared{Stale: true}, nil
	}
	if err != nil {
		return nil, err
	}
	if p.Ready {
		a.Log.Info("software deployment handed to its agent", "software_deployment", in.DeploymentID, "round", in.Round,
			"node", p.Node, "config", p.Config)
	}
	return p, nil
}

// FinishSoftwareRound records how a round ended (COMPLETE or FAILED with a
// reason), with the outputs its agent signalled. Idempotent: it reports
// false when the round had already ended or is no longer current.
func (a *Activities) FinishSoftwareRound(ctx context.Context, in contract.SoftwareEnd) (bool, error) {
	changed, err := a.Software.FinishSoftwareRound(ctx, in.DeploymentID, in.Round, in.Status, in.Reason)
	if err != nil {
		return false, err
	}
	a.Log.Info("software deployment round ended", "software_deployment", in.DeploymentID, "round", in.Round,
		"status", in.Status, "reason", in.Reason, "changed", changed)
	return changed, nil
}

// RemoveSoftwareDeployment removes a deleted deployment at the end of its
// UNDEPLOY round: after the agent signalled success, or after the round's
// timeout (logged as a warning: nothing confirmed the UNDEPLOY on the node).
// Idempotent: a deployment already gone, or in another round, is left alone.
func (a *Activities) RemoveSoftwareDeployment(ctx context.Context, in contract.SoftwareRemoval) error {
	removed, err := a.Software.RemoveDeletedSoftware(ctx, in.DeploymentID, in.Round)
	if err != nil {
		return err
	}
	log := a.Log.Info
	if in.TimedOut {
		log = a.Log.Warn
	}
	log("software deployment removed after its UNDEPLOY round", "software_deployment", in.DeploymentID, "round", in.Round,
		"reason", in.Reason, "timed_out", in.TimedOut, "removed", removed)
	return nil
}
