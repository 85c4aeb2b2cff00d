// Package contract is everything Temporal sees of anneal: workflow type
// names, activity names, signal names, workflow ID formats, error types,
// the payloads of workflows, activities and signals, and the state
// constants that workflows branch on. The API (web), the activities and the
// workflows meet only here, so that a change to any of it is one diff in one
// place, and it is a leaf: it imports nothing but the Temporal SDK.
//
// Everything in this package is a contract with histories already recorded
// and with executions in flight: names and JSON field names are extended,
// never renamed.
package contract

import "time"

// DefaultTaskQueue is the task queue of an anneal installation.
const DefaultTaskQueue = "anneal"

// scopedID prefixes a workflow ID with the task queue unless it is the
// default one, so that several installations (the test suite's stacks) can
// share a Temporal namespace.
func scopedID(taskQueue, id string) string {
	if taskQueue == "" || taskQueue == DefaultTaskQueue {
		return id
	}
	return taskQueue + "/" + id
}

// Error types carried by activity failures, for workflows to branch on and
// for retry policies to name.
const (
	// ErrTypeTaskFailed means the task ran and failed on the node; its run
	// row already says so.
	ErrTypeTaskFailed = "TaskFailed"
	// ErrTypePlan means the graph cannot be planned; retrying will not help.
	ErrTypePlan = "PlanError"
	// ErrTypeNodeBusy means the run's node ran something else for longer
	// than the activity waits; nothing was dispatched, and the workflow
	// tries again after a pause.
	ErrTypeNodeBusy = "NodeBusy"
	// ErrTypeBadInput means an activity's input cannot work (a malformed
	// id, a row whose creation was rolled back); retrying will not help.
	ErrTypeBadInput = "BadInput"
	// ErrTypeUndelivered means a run never reached its node's agent, after
	// several deliveries.
	ErrTypeUndelivered = "Undelivered"
	// ErrTypeNotDispatchable means a run is in a state that cannot be sent
	// to its node (it already ended otherwise).
	ErrTypeNotDispatchable = "NotDispatchable"
	// ErrTypeTransactionFailed is how a Transaction workflow fails when its
	// transaction ended in error (its end is recorded first), so that
	// `ExecutionStatus="Failed"` finds the transactions that failed. Its
	// details carry the TransactionOutcome.
	ErrTypeTransactionFailed = "TransactionFailed"
)

// DefaultHeartbeatTimeout is how long a run may go without a heartbeat from
// its agent before it counts as lost.
const DefaultHeartbeatTimeout = 60 * time.Second

// HeartbeatTimeout is the heartbeat timeout a workflow input asks for in
// seconds, DefaultHeartbeatTimeout when it says 0.
func HeartbeatTimeout(sec int) time.Duration {
	if sec > 0 {
		return time.Duration(sec) * time.Second
	}
	return DefaultHeartbeatTimeout
}

// Activity names, as registered by the worker (the method names of
// activities.Activities) and as the workflows call them.
const (
	PlanGraphActivity            = "PlanGraph"
	LoadNodePlanActivity         = "LoadNodePlan" // local activity
	RunTaskOnNodeActivity        = "RunTaskOnNode"
	RunChainOnNodeActivity       = "RunChainOnNode"
	CutChainActivity             = "CutChain"     // local activity
	EndLostChainActivity         = "EndLostChain" // local activity
	RunOnOrchestratorActivity    = "RunOnOrchestrator"
	RunOverSSHActivity           = "RunOverSSH"
	RecordRunFailureActivity     = "RecordRunFailure"
	CancelRunsActivity           = "CancelRuns"
	CheckRunStatesActivity       = "CheckRunStates" // local activity
	WakeNodesActivity            = "WakeNodes"
	AbandonNodeRunsActivity      = "AbandonNodeRuns"
	FinishTransactionActivity    = "FinishTransaction"
	RecordNoOpActivity           = "RecordNoOp"
	FinishNodeGraphActivity      = "FinishNodeGraph" // local activity
	NodeBootIDActivity           = "NodeBootID"      // local activity
	RunDeliveryActivity          = "RunDelivery"     // local activity
	AwaitRebootActivity          = "AwaitReboot"
	AnnealActivity               = "Anneal"
	RecoverTransitionsActivity   = "RecoverTransitions"
	PrepareNodeRoleRunActivity   = "PrepareNodeRoleRun"
	FinishNodeRoleRunActivity    = "FinishNodeRoleRun"
	BootstrapNodeActivity        = "BootstrapNode"
	PrepareSoftwareRoundActivity = "PrepareSoftwareRound"
	FinishSoftwareRoundActivity  = "FinishSoftwareRound"
	RemoveSoftwareActivity       = "RemoveSoftwareDeployment"
)

// ActivityNames lists every activity name above, for the test that checks
// the worker registers exactly these.
var ActivityNames = []string{
	PlanGraphActivity, LoadNodePlanActivity, RunTaskOnNodeActivity, RunChainOnNodeActivity, CutChainActivity, EndLostChainActivity, RunOnOrchestratorActivity,
	RecordRunFailureActivity, CancelRunsActivity, CheckRunStatesActivity, WakeNodesActivity, AbandonNodeRunsActivity,
	FinishTransactionActivity, RecordNoOpActivity, FinishNodeGraphActivity, NodeBootIDActivity, RunDeliveryActivity,
	AwaitRebootActivity, AnnealActivity, RecoverTransitionsActivity, PrepareNodeRoleRunActivity,
	FinishNodeRoleRunActivity, BootstrapNodeActivity, PrepareSoftwareRoundActivity, FinishSoftwareRoundActivity,
	RemoveSoftwareActivity,
	RunOverSSHActivity,
}

// WorkflowNames lists every workflow type name, for the test that checks
// the worker registers exactly these.
var WorkflowNames = []string{
	TransactionWorkflow, GraphWorkflow, NodeWorkflow, SoftwareDeploymentWorkflow, AnnealerWorkflow, NodeRoleWorkflow, NodeBootstrapWorkflow,
}
