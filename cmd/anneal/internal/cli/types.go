package cli

import "time"

// The API's JSON, as far as the CLI reads it. The CLI keeps its own types
// (not the server's models) so that it depends on the wire format only.

type node struct {
	ID             int64          `json:"id"`
	Name           string         `json:"name"`
	Admin          bool           `json:"admin"`
	Alive          bool           `json:"alive"`
	Available      bool           `json:"available"`
	Allocated      bool           `json:"allocated"`
	Status         string         `json:"status"`
	ComputedStatus string         `json:"computed_status"`
	Progress       int            `json:"progress"`
	ErrorType      *string        `json:"error_type"`
	Roles          []string       `json:"roles"`
	Tags           []string       `json:"tags"`
	DeploymentID   int64          `json:"deployment_id"`
	Address        string         `json:"address"`
	Attributes     map[string]any `json:"attributes"`
}

type deployment struct {
	ID        int64          `json:"id"`
	Name      string         `json:"name"`
	NodeRoles map[string]int `json:"noderoles"`
}

type graphRequest struct {
	Type  string   `json:"type"`
	Nodes []int64  `json:"nodes,omitempty"`
	Tasks []string `json:"tasks,omitempty"`
}

type transaction struct {
	UUID       string         `json:"uuid"`
	Deployment string         `json:"deployment"`
	Graphs     []graphRequest `json:"graphs"`
	DryRun     bool           `json:"dry_run"`
	Force      bool           `json:"force"`
	Status     string         `json:"status"`
	Error      string         `json:"error"`
	Warnings   []string       `json:"warnings"`
	WorkflowID string         `json:"workflow_id"`
	CreatedAt  time.Time      `json:"created_at"`
	StartedAt  *time.Time     `json:"started_at"`
	FinishedAt *time.Time     `json:"finished_at"`
	Progress   int            `json:"progress"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	FailedRuns []string       `json:"failed_runs"`
}

// finished reports whether a transaction will not change any more.
func (t *transaction) finished() bool { return t.Status != "pending" && t.Status != "running" }

type run struct {
	ID         int64             `json:"id"`
	GraphIndex int               `json:"graph_index"`
	GraphType  string            `json:"graph_type"`
	NodeName   string            `json:"node_name"`
	TaskName   string            `json:"task_name"`
	TaskType   string            `json:"task_type"`
	Position   int               `json:"position"`
	State      string            `json:"state"`
	Attempt    int               `json:"attempt"`
	StartedAt  *time.Time        `json:"started_at"`
	FinishedAt *time.Time        `json:"finished_at"`
	ExitCode   *int              `json:"exit_code"`
	StdoutTail string            `json:"stdout_tail"`
	StderrTail string            `json:"stderr_tail"`
	Outputs    map[string]string `json:"outputs"`
	Error      string            `json:"error"`
}

// runFinal reports whether a run's state will not change any more within
// its transaction.
func runFinal(state string) bool {
	switch state {
	case "succeeded", "failed", "blocked", "skipped", "cancelled", "planned":
		return true
	}
	return false
}

type nodeRole struct {
	ID         int64   `json:"id"`
	SnapshotID int64   `json:"snapshot_id"`
	State      string  `json:"state"`
	Node       string  `json:"node"`
	Role       string  `json:"role"`
	RunCount   int     `json:"run_count"`
	Parents    []int64 `json:"parents"`
}

type snapshot struct {
	ID            int64          `json:"id"`
	DeploymentID  int64          `json:"deployment_id"`
	State         string         `json:"state"`
	CreatedAt     time.Time      `json:"created_at"`
	CommittedAt   *time.Time     `json:"committed_at"`
	NodeRoles     []nodeRole     `json:"noderoles"`
	MovedNodes    []string       `json:"moved_nodes"`
	Annealer      map[string]any `json:"annealer"`
	DeployChanges map[string]any `json:"deploy_changes"`
}

type accepted struct {
	TaskUUID   string `json:"task_uuid"`
	WorkflowID string `json:"workflow_id"`
	Status     string `json:"status"`
	Scenario   string `json:"scenario"`
	Acts       []struct {
		Position  int     `json:"position"`
		GraphType string  `json:"graph_type"`
		AllNodes  bool    `json:"all_nodes"`
		Nodes     []int64 `json:"nodes"`
		Skipped   bool    `json:"skipped"`
	} `json:"acts"`
}

type task struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Tags         []string         `json:"tags"`
	Requires     []string         `json:"requires"`
	RequiredFor  []string         `json:"required_for"`
	CrossDepends []map[string]any `json:"cross_depends"`
}

type resolvedGraph struct {
	Type    string `json:"type"`
	Tasks   []task `json:"tasks"`
	Sources []struct {
		OwnerKind string `json:"owner_kind"`
		Name      string `json:"name"`
	} `json:"sources"`
}

type txPage struct {
	Items      []transaction `json:"items"`
	NextCursor string        `json:"next_cursor"`
}

type apiToken struct {
	ID         any        `json:"id"`
	Name       string     `json:"name"`
	Scope      string     `json:"scope"`
	Token      string     `json:"token,omitempty"`
	CreatedAt  *time.Time `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}
