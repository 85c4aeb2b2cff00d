package fuel

import (
	"time"

	"github.com/google/uuid"

	"github.com/anneal-dev/anneal/models/plan"
)

// Graph owners: graphs of one type merge release → plugin → deployment.
const (
	OwnerBuiltin    = "builtin" // shipped with anneal, below every release
	OwnerRelease    = "release"
	OwnerPlugin     = "plugin"
	OwnerDeployment = "deployment"
)

// Graph is a typed set of tasks owned by a release, a plugin or a deployment.
type Graph struct {
	ID        int64          `json:"id"`
	OwnerKind string         `json:"owner_kind"`
	OwnerID   int64          `json:"owner_id"`
	Type      string         `json:"type"`
	Name      string         `json:"name"`
	Metadata  map[string]any `json:"metadata" gorm:"serializer:json"`
	Tasks     []plan.Task    `json:"tasks" gorm:"serializer:json"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
}

// GraphRequest is one graph of a transaction: its type and optional filters.
type GraphRequest struct {
	Type  string   `json:"type"`
	Nodes []int64  `json:"nodes,omitempty"`
	Tasks []string `json:"tasks,omitempty"`
	// MaxNodesInFlight caps the nodes working on this graph at once
	// (0: the transaction's, else contract.DefaultMaxNodesInFlight).
	MaxNodesInFlight int `json:"max_nodes_in_flight,omitempty"`
	// FailureThreshold is the percentage of the graph's nodes that may fail
	// before the rest are stopped (nil: the transaction's, else
	// DefaultFailureThreshold). Like Fuel's fault tolerance.
	FailureThreshold *int `json:"failure_threshold,omitempty"`
}

// Safety valves of a transaction when nobody sets them.
const (
	DefaultFailureThreshold = 100 // never abort: a failure blocks only its descendants
)

// Transaction runs one or more graphs on a deployment, durably.
type Transaction struct {
	ID           uuid.UUID      `json:"uuid"`
	DeploymentID int64          `json:"deployment_id"`
	Graphs       []GraphRequest `json:"graphs" gorm:"serializer:json"`
	DryRun       bool           `json:"dry_run"`
	Force        bool           `json:"force"`
	Status       string         `json:"status"`
	Error        string         `json:"error"`
	Warnings     []string       `json:"warnings" gorm:"serializer:json"`
	WorkflowID   string         `json:"workflow_id"`
	CreatedAt    time.Time      `json:"created_at"`
	StartedAt    *time.Time     `json:"started_at"`
	FinishedAt   *time.Time     `json:"finished_at"`
}
