// Package workflows holds anneal's Temporal workflows. A transaction
// workflow (ID tx-<uuid>) plans its graphs one after another and starts one
// child workflow per node (ID tx-<uuid>/<node>); each node workflow runs its
// tasks one at a time in plan order, and node workflows wake each other with
// signals for cross-node dependencies. Workflows hold IDs and decisions;
// Postgres holds the state.
package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// nodeBusyPause is how long a workflow waits before trying a run again
// whose node stayed busy (a noderole, another transaction's task) for as
// long as the activity waits: a node runs one thing at a time.
const nodeBusyPause = 10 * time.Second

// versionRedeliver makes runOnNode run a task again, without counting it
// against the task's retries, when its activity timed out before any agent
// acknowledged the run (version 1): the worker died holding the activity,
// before it dispatched, and the task never reached its node.
const versionRedeliver = "redeliver-undelivered"

// versionSSHJig lets a run (a NodeRun's task with OverSSH, a NodeRoleRun of
// a role with the ssh jig) go to the RunOverSSH activity (version 1).
// Histories from before never carry such a run, so the branch is never taken
// on their replay; the marker keeps it that way should one ever appear.
const versionSSHJig = "ssh-jig"

// sshJig reports whether a run the plan sends over SSH goes to RunOverSSH.
func sshJig(ctx workflow.Context, overSSH bool) bool {
	return overSSH && workflow.GetVersion(ctx, versionSSHJig, workflow.DefaultVersion, 1) >= 1
}

// maxRedeliveries bounds those: a node whose agent never takes its work
// fails the run, saying so, instead of holding the transaction for ever.
const maxRedeliveries = 5

// undelivered says why a run failed that never reached its node's agent
// after deliveries attempts, the last ending in err.
func undelivered(node string, deliveries int, err error) string {
	return fmt.Sprintf("the run never reached the agent of %s after %d deliveries, each ending in %s (is the agent running?)",
		node, deliveries, rootMessage(err))
}

// runOnNode executes a jig activity, again after a pause for as long as it
// answers that the node is busy (nothing was dispatched then), so that the
// wait counts against neither the run's time limit nor its retries; and
// again when the agent jig's activity timed out before any agent
// acknowledged the run (see versionRedeliver).
func runOnNode(ctx, actx workflow.Context, jig string, input contract.RunTaskInput) error {
	redelivered := 0
	for {
		err := workflow.ExecuteActivity(actx, jig, input).Get(ctx, nil)
		var appErr *temporal.ApplicationError
		var timeout *temporal.TimeoutError
		switch {
		case errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeNodeBusy:
			if err := workflow.Sleep(ctx, nodeBusyPause); err != nil {
				return err
			}
		case jig == contract.RunTaskOnNodeActivity && errors.As(err, &timeout) && ctx.Err() == nil &&
			workflow.GetVersion(ctx, versionRedeliver, workflow.DefaultVersion, 1) >= 1:
			var d contract.RunDelivery
			if derr := workflow.ExecuteLocalActivity(stateRead(ctx), contract.RunDeliveryActivity, input.RunID).Get(ctx, &d); derr != nil {
				return err
			}
			if d.Acked || (d.State != contract.RunPending && d.State != contract.RunRunning) {
				return err // the agent had it: the timeout is the run's failure
			}
			if redelivered >= maxRedeliveries {
				return temporal.NewNonRetryableApplicationError(undelivered(input.Node, redelivered+1, err),
					contract.ErrTypeUndelivered, nil)
			}
			redelivered++
			workflow.GetLogger(ctx).Warn("run never reached its agent; delivering it again",
				"run", input.RunID, "task", input.Task, "node", input.Node, "delivery", redelivered+1)
		default:
			return err
		}
	}
}

// Register registers the workflows on a worker under their readable names.
func Register(r worker.WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(Transaction, workflow.RegisterOptions{Name: contract.TransactionWorkflow})
	r.RegisterWorkflowWithOptions(GraphRun, workflow.RegisterOptions{Name: contract.GraphWorkflow})
	r.RegisterWorkflowWithOptions(NodeRun, workflow.RegisterOptions{Name: contract.NodeWorkflow})
	r.RegisterWorkflowWithOptions(SoftwareDeployment, workflow.RegisterOptions{Name: contract.SoftwareDeploymentWorkflow})
	r.RegisterWorkflowWithOptions(Annealer, workflow.RegisterOptions{Name: contract.AnnealerWorkflow})
	r.RegisterWorkflowWithOptions(NodeRoleRun, workflow.RegisterOptions{Name: contract.NodeRoleWorkflow})
	r.RegisterWorkflowWithOptions(NodeBootstrap, workflow.RegisterOptions{Name: contract.NodeBootstrapWorkflow})
}

// stateActivity is for the short activities that read and write Postgres:
// they retry without limit (a database restart must not lose a run), and the
// Web UI shows the last error while they do.
func stateActivity(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			BackoffCoefficient:     2,
			MaximumInterval:        30 * time.Second,
			NonRetryableErrorTypes: []string{contract.ErrTypePlan, contract.ErrTypeBadInput},
		},
	})
}

// stateRead is for local activities that read Postgres; like stateActivity
// they retry until the database answers.
func stateRead(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    time.Second,
			BackoffCoefficient: 2,
			MaximumInterval:    30 * time.Second,
		},
	})
}
