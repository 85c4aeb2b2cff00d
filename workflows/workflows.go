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

	"github.com/anneal-dev/anneal/activities"
)

// Workflow type names as they appear in the Temporal Web UI.
const (
	TransactionWorkflow = "Transaction"
	NodeWorkflow        = "NodeRun"
)

// SignalRunsFinished carries RunsFinished from one node workflow to another.
const SignalRunsFinished = "runs-finished"

// DefaultHeartbeatTimeout is how long a run may go without a heartbeat from
// its agent before it counts as lost.
const DefaultHeartbeatTimeout = 60 * time.Second

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
		if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeNodeBusy {
			return err
		}
		if err := workflow.Sleep(ctx, nodeBusyPause); err != nil {
			return err
		}
	}
}

// Register registers the workflows on a worker under their readable names.
func Register(r worker.WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(Transaction, workflow.RegisterOptions{Name: TransactionWorkflow})
	r.RegisterWorkflowWithOptions(NodeRun, workflow.RegisterOptions{Name: NodeWorkflow})
	r.RegisterWorkflowWithOptions(SoftwareDeployment, workflow.RegisterOptions{Name: SoftwareDeploymentWorkflow})
	r.RegisterWorkflowWithOptions(Annealer, workflow.RegisterOptions{Name: activities.AnnealerWorkflow})
	r.RegisterWorkflowWithOptions(NodeRoleRun, workflow.RegisterOptions{Name: activities.NodeRoleWorkflow})
	r.RegisterWorkflowWithOptions(NodeBootstrap, workflow.RegisterOptions{Name: activities.NodeBootstrapWorkflow})
}

// NodeWorkflowID is the workflow ID of a node's share of a transaction.
func NodeWorkflowID(txID, node string) string { return fmt.Sprintf("tx-%s/%s", txID, node) }

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
			NonRetryableErrorTypes: []string{"PlanError", "BadInput"},
		},
	})
}

// Reads from Postgres run as local activities, by their registered names:
// they are short, and running them in the worker spares the Temporal server
// a round of scheduling per node (it records only their result).
const (
	LoadNodePlanActivity    = "LoadNodePlan"
	CheckRunStatesActivity  = "CheckRunStates"
	FinishNodeGraphActivity = "FinishNodeGraph"
	NodeBootIDActivity      = "NodeBootID"
)

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
