// Package workflows holds anneal's Temporal workflows. A transaction
// workflow (ID tx-<uuid>) plans its graphs one after another and starts one
// child workflow per node (ID tx-<uuid>/<node>); each node workflow runs its
// tasks one at a time in plan order, and node workflows wake each other with
// signals for cross-node dependencies. Workflows hold IDs and decisions;
// Postgres holds the state.
package workflows

import (
	"errors"
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

// runOnNode executes a jig activity, again after a pause for as long as it
// answers that the node is busy (nothing was dispatched then), so that the
// wait counts against neither the run's time limit nor its retries.
func runOnNode(ctx, actx workflow.Context, jig any, input any) error {
	for {
		err := workflow.ExecuteActivity(actx, jig, input).Get(ctx, nil)
		var appErr *temporal.ApplicationError
		if !errors.As(err, &appErr) || appErr.Type() != contract.ErrTypeNodeBusy {
			return err
		}
		if err := workflow.Sleep(ctx, nodeBusyPause); err != nil {
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
