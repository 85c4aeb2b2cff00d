package contract

import (
	"context"
	"strconv"

	"go.temporal.io/sdk/client"
)

// SoftwareDeploymentWorkflow is the workflow type of one round of a Heat
// software deployment; its ID is SoftwareWorkflowID, and each round
// (DEPLOY, REDEPLOY, UNDEPLOY) is a new run of that ID.
const SoftwareDeploymentWorkflow = "SoftwareDeployment"

// SignalSoftware carries a SoftwareSignalSummary from the API (when the
// node's agent posts its signal) to the deployment's workflow.
const SignalSoftware = "software-signal"

// SoftwareWorkflowID is the workflow ID of a software deployment:
// swd-<deployment id>.
func SoftwareWorkflowID(id int64) string { return "swd-" + strconv.FormatInt(id, 10) }

// Software deployment actions and statuses (Heat software config).
const (
	ActionDeploy   = "DEPLOY"
	ActionRedeploy = "REDEPLOY"
	ActionUndeploy = "UNDEPLOY"

	SoftwareWaiting    = "WAITING"
	SoftwareInProgress = "IN_PROGRESS"
	SoftwareComplete   = "COMPLETE"
	SoftwareFailed     = "FAILED"
)

// SoftwareInput starts a round of a software deployment.
type SoftwareInput struct {
	DeploymentID int64  `json:"deployment_id"`
	Round        int    `json:"round"`
	Action       string `json:"action"`
	// Delete: the round is the UNDEPLOY of a deleted deployment; once the
	// agent signals success, or the round times out, the deployment is
	// removed (RemoveSoftwareDeployment). A failed UNDEPLOY keeps it, FAILED.
	Delete bool `json:"delete,omitempty"`
}

// SoftwareRemoval asks RemoveSoftwareDeployment to remove a deleted
// deployment at the end of its UNDEPLOY round; Reason says why (the
// agent's signal, or the timeout), for the log.
type SoftwareRemoval struct {
	SoftwareRound
	Reason string `json:"reason"`
	// TimedOut: the agent never signalled the UNDEPLOY round.
	TimedOut bool `json:"timed_out,omitempty"`
}

// SoftwareResult is how the round ended.
type SoftwareResult struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// SoftwareRound addresses one round of a software deployment.
type SoftwareRound struct {
	DeploymentID int64 `json:"deployment_id"`
	Round        int   `json:"round"`
}

// SoftwareEnd is how a round of a software deployment ended.
type SoftwareEnd struct {
	SoftwareRound
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// SoftwarePrepared is what starting a round found (the result of
// PrepareSoftwareRound).
type SoftwarePrepared struct {
	// Stale: the deployment has moved on to another round (or is gone).
	Stale bool `json:"stale,omitempty"`
	// Final: the round has already ended (Status says how).
	Final  bool   `json:"final,omitempty"`
	Status string `json:"status"`
	// Ready: the round is IN_PROGRESS, handed to the node's agent.
	Ready bool `json:"ready,omitempty"`
	// WaitingFor lists referenced deployments that are not COMPLETE yet.
	WaitingFor []int64 `json:"waiting_for,omitempty"`
	// Failed explains why the round cannot start (a reference failed).
	Failed       string   `json:"failed,omitempty"`
	TimeoutSec   int      `json:"timeout_sec"`
	ErrorOutputs []string `json:"error_outputs,omitempty"`
	Node         string   `json:"node"`
	Config       string   `json:"config"`
}

// SoftwareSignalSummary is what a deployment's workflow is told of the
// agent's signal: the round, the status code and reason, and which outputs
// were signalled non-empty. Present maps each such output to Redacted: the
// values stay in Postgres. (Summaries written before carried a short
// excerpt of each value there; they still decode.)
type SoftwareSignalSummary struct {
	Round        int               `json:"round"`
	StatusCode   int               `json:"status_code"`
	StatusReason string            `json:"status_reason,omitempty"`
	Present      map[string]string `json:"present,omitempty"`
}

// Redacted stands for a value anneal does not show or send: a secret, or
// an output value in a SoftwareSignalSummary.
const Redacted = "***"

// StartSoftwareRound starts a round of a software deployment under
// SoftwareWorkflowID (set in opts.ID by the caller along with its memo and
// summary).
func StartSoftwareRound(ctx context.Context, tc client.Client, opts client.StartWorkflowOptions, in SoftwareInput) error {
	return executeWorkflow(ctx, tc, opts, SoftwareDeploymentWorkflow, in)
}

// SignalSoftwareDeployment hands the agent's signal to the deployment's
// workflow.
func SignalSoftwareDeployment(ctx context.Context, tc client.Client, workflowID string, sig SoftwareSignalSummary) error {
	return tc.SignalWorkflow(ctx, workflowID, "", SignalSoftware, sig)
}
