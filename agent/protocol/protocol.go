// Package protocol holds the wire types shared by the anneal API and the node
// agent. It imports nothing beyond the standard library so that the agent
// binary stays small and the two sides cannot drift apart.
package protocol

import "time"

// Paths of the agent endpoints, relative to the API base URL.
const (
	PathRegister     = "/api/v1/agent/register"
	PathHeartbeat    = "/api/v1/agent/heartbeat"
	PathWork         = "/api/v1/agent/work"
	PathRunHeartbeat = "/api/v1/agent/runs/%d/heartbeat"
	PathRunResult    = "/api/v1/agent/runs/%d/result"
)

// MaxTailBytes is how much of a command's stdout and stderr the agent reports.
const MaxTailBytes = 4096

// RegisterRequest is what an agent sends when it phones home for the first
// time. It authenticates with an enrollment token.
type RegisterRequest struct {
	// Name is the node's FQDN; it must lie inside the admin DNS domain.
	Name string `json:"name"`
	// Admin marks the node as an admin node.
	Admin bool `json:"admin,omitempty"`
	// BootID changes at every boot of the machine (or start of the agent).
	BootID string `json:"boot_id"`
	// Address is where peers can reach the agent (host:port), if anywhere.
	Address string `json:"address,omitempty"`
}

// RegisterResponse carries the node's own credential; the agent keeps it in
// its work directory and uses it for every later call.
type RegisterResponse struct {
	NodeID int64  `json:"node_id"`
	Name   string `json:"name"`
	Token  string `json:"token"`
}

// HeartbeatRequest tells the API that the agent is alive.
type HeartbeatRequest struct {
	BootID  string `json:"boot_id"`
	Address string `json:"address,omitempty"`
}

// HeartbeatResponse confirms which node the credential belongs to.
type HeartbeatResponse struct {
	NodeID int64  `json:"node_id"`
	Name   string `json:"name"`
}

// WorkResponse lists the runs handed to this agent by one fetch. Each run is
// handed out once per attempt: a second fetch does not return it again.
type WorkResponse struct {
	Runs []WorkItem `json:"runs"`
}

// WorkItem is one task run to execute on the node.
type WorkItem struct {
	RunID         int64             `json:"run_id"`
	Attempt       int               `json:"attempt"`
	TransactionID string            `json:"transaction_id"`
	Graph         string            `json:"graph"`
	Task          string            `json:"task"`
	Type          string            `json:"type"`
	Command       string            `json:"command"`
	TimeoutSec    int               `json:"timeout_sec"`
	Env           map[string]string `json:"env,omitempty"`
}

// Timeout returns the run's timeout as a duration.
func (w WorkItem) Timeout() time.Duration { return time.Duration(w.TimeoutSec) * time.Second }

// RunHeartbeatResponse tells the agent whether the run should be abandoned
// (the transaction was cancelled or the run is no longer awaited).
type RunHeartbeatResponse struct {
	Cancel bool `json:"cancel"`
}

// RunResult is what the agent reports when a run has finished.
type RunResult struct {
	Attempt    int               `json:"attempt"`
	ExitCode   int               `json:"exit_code"`
	StdoutTail string            `json:"stdout_tail"`
	StderrTail string            `json:"stderr_tail"`
	Outputs    map[string]string `json:"outputs,omitempty"`
	// Error explains a failure that is not an exit code: a timeout, a
	// command that could not be started.
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Succeeded reports whether the run counts as a success.
func (r RunResult) Succeeded() bool { return r.ExitCode == 0 && r.Error == "" }

// ErrorBody is the API's error envelope: {"error": {...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail names what was wrong and, for bad input, which field.
type ErrorDetail struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}
