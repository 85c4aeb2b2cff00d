package activities

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// Reboots is what a reboot task's wait needs: the node's boot id, and
// failing the run when the node does not come back (the kernel store).
type Reboots interface {
	NodeBootID(ctx context.Context, nodeID int64) (string, error)
	RejectRebootRun(ctx context.Context, runID int64, reason string) error
}

// NodeBootID reads a node's boot id before a reboot task.
func (a *Activities) NodeBootID(ctx context.Context, nodeID int64) (string, error) {
	return a.Reboots.NodeBootID(ctx, nodeID)
}

// rebootPoll is how often AwaitReboot looks at the node's boot id.
const rebootPoll = time.Second

// AwaitReboot waits until the node reports a boot id other than the one it
// had before the reboot task. If it does not come back in time, the run is
// failed with the reason and the error says so.
func (a *Activities) AwaitReboot(ctx context.Context, w contract.RebootWait) error {
	deadline := time.Now().Add(time.Duration(w.TimeoutSec) * time.Second)
	for {
		boot, err := a.Reboots.NodeBootID(ctx, w.NodeID)
		if err != nil {
			return err
		}
		if boot != w.OldBootID {
			a.Log.Info("node came back after reboot", "node", w.Node, "boot_id", boot)
			return nil
		}
		if time.Now().After(deadline) {
			reason := fmt.Sprintf("node %s did not come back with a new boot id within %ds after the reboot", w.Node, w.TimeoutSec)
			if err := a.Reboots.RejectRebootRun(ctx, w.RunID, reason); err != nil {
				return err
			}
			return temporal.NewNonRetryableApplicationError(reason, contract.ErrTypeTaskFailed, nil)
		}
		activity.RecordHeartbeat(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(rebootPoll):
		}
	}
}
