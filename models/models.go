// Package models is anneal's persistent domain model: the GORM types, the
// versioned schema migrations and the queries the API and the activities use.
// Postgres is the source of truth; workflows only carry IDs.
package models

import (
	"time"

	"github.com/google/uuid"
)

// Token scopes: an admin token drives the whole API; an operator token
// runs what exists (execute, stop, retry, bind, commit, tag) but manages no
// tokens and imports nothing; a viewer token only reads; an enroll token may
// only register agents.
const (
	ScopeAdmin    = "admin"
	ScopeOperator = "operator"
	ScopeViewer   = "viewer"
	ScopeEnroll   = "enroll"
)

// Scopes lists the token scopes, most powerful first.
var Scopes = []string{ScopeAdmin, ScopeOperator, ScopeViewer, ScopeEnroll}

// APIToken is an operator credential; only its SHA-256 hash is stored.
type APIToken struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	Scope      string     `json:"scope"`
	TokenHash  string     `json:"-"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

// Release is a bundle of roles, tags metadata and graphs.
type Release struct {
	ID           int64                  `json:"id"`
	Name         string                 `json:"name"`
	Version      string                 `json:"version"`
	TagsMetadata map[string]TagMetadata `json:"tags_metadata" gorm:"serializer:json"`
	Roles        []Role                 `json:"roles,omitempty"`
	CreatedAt    time.Time              `json:"created_at"`
	UpdatedAt    time.Time              `json:"updated_at"`
}

// TagMetadata describes a tag declared by a release.
type TagMetadata struct {
	Name       string `json:"name,omitempty" yaml:"name,omitempty"`
	HasPrimary bool   `json:"has_primary,omitempty" yaml:"has_primary,omitempty"`
}

// Role is a unit of functionality bound to nodes; assigning it to a node adds
// its tags (and its own name) to the node's tags.
type Role struct {
	ID        int64          `json:"id"`
	ReleaseID int64          `json:"release_id"`
	Name      string         `json:"name"`
	Title     string         `json:"title"`
	Jig       string         `json:"jig"`
	Requires  []string       `json:"requires" gorm:"serializer:json"`
	Tags      []string       `json:"tags" gorm:"serializer:json"`
	Flags     []string       `json:"flags" gorm:"serializer:json"`
	Template  map[string]any `json:"template" gorm:"serializer:json"`
	// Script is what the role's jig runs when the release has no task of
	// its own for the role (a Crowbar-style role).
	Script    string    `json:"script,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SystemDeployment is the deployment every discovered node lands in.
const SystemDeployment = "system"

// Deployment groups nodes (Fuel calls it a cluster).
type Deployment struct {
	ID        int64  `json:"id"`
	Name      string `json:"name"`
	ParentID  *int64 `json:"parent_id"`
	ReleaseID *int64 `json:"release_id"`
	// Attributes are part of the merged data every graph task of the
	// deployment sees (models.NodeInputs).
	Attributes map[string]any `json:"attributes" gorm:"serializer:json"`
	CreatedAt  time.Time      `json:"created_at"`
	UpdatedAt  time.Time      `json:"updated_at"`
}

// Node statuses that are stored; the transient ones are computed.
const (
	NodeDiscover    = "discover"
	NodeProvisioned = "provisioned"
	NodeDeployed    = "deployed"
)

// Node is a machine anneal manages, named by its FQDN. Its JSON carries the
// stored status and the computed one (see ComputedStatus).
type Node struct {
	ID             int64          `json:"id"`
	Name           string         `json:"name"`
	Admin          bool           `json:"admin"`
	Allocated      bool           `json:"allocated"`
	Alive          bool           `json:"alive"`
	Available      bool           `json:"available"`
	Status         string         `json:"status"`
	Progress       int            `json:"progress"`
	ErrorType      *string        `json:"error_type"`
	Roles          []string       `json:"roles" gorm:"serializer:json"`
	Tags           []string       `json:"tags" gorm:"serializer:json"`
	Attributes     map[string]any `json:"attributes" gorm:"serializer:json"`
	DeploymentID   int64          `json:"deployment_id"`
	AgentTokenHash *string        `json:"-"`
	BootID         string         `json:"boot_id"`
	Address        string         `json:"address"`
	LastSeenAt     *time.Time     `json:"last_seen_at"`
	CreatedAt      time.Time      `json:"created_at"`
	UpdatedAt      time.Time      `json:"updated_at"`
}

// RunSpec is what a run executes: the task's parameters as planned.
type RunSpec struct {
	// Jig is how the run reaches its node: JigAgent, JigOrchestrator or
	// JigNone (nothing to execute).
	Jig        string `json:"jig,omitempty"`
	Cmd        string `json:"cmd,omitempty"`
	TimeoutSec int    `json:"timeout_sec"`
	Retries    int    `json:"retries"`
	// Secrets maps environment variables of the run to the names of the
	// deployment secrets they hold (never the values).
	Secrets map[string]string `json:"secrets,omitempty"`
}

// TaskRun is one (graph, node, task) of a transaction, or one run of a
// noderole.
type TaskRun struct {
	ID            int64      `json:"id"`
	TransactionID uuid.UUID  `json:"transaction_id,omitzero"` // zero on a noderole run
	GraphIndex    int        `json:"graph_index"`
	GraphType     string     `json:"graph_type"`
	NodeID        int64      `json:"node_id,omitzero"` // zero once the node was deleted
	NodeName      string     `json:"node_name"`
	TaskName      string     `json:"task_name"`
	TaskType      string     `json:"task_type"`
	Position      int        `json:"position"`
	Spec          RunSpec    `json:"spec" gorm:"serializer:json"`
	State         string     `json:"state"`
	Attempt       int        `json:"attempt"`
	TaskToken     []byte     `json:"-"`
	ClaimedAt     *time.Time `json:"claimed_at"`
	// AckedAt is when the node's agent took delivery of the run (its ack,
	// or the hand-back of a chain's run: see chainLink).
	AckedAt    *time.Time        `json:"-"`
	StartedAt  *time.Time        `json:"started_at"`
	FinishedAt *time.Time        `json:"finished_at"`
	ExitCode   *int              `json:"exit_code"`
	StdoutTail string            `json:"stdout_tail"`
	StderrTail string            `json:"stderr_tail"`
	Outputs    map[string]string `json:"outputs" gorm:"serializer:json"`
	Error      string            `json:"error"`
	// InputsHash digests everything the run saw (see InputsHash); final
	// once the run is dispatched or skipped.
	InputsHash string `json:"inputs_hash"`
	// InputsBase is the part of it known at plan time (see InputsBaseJSON);
	// empty on a noderole's run.
	InputsBase string `json:"-"`
	// LCM says the run may be skipped when its inputs are those of the
	// last finished run of its task on its node, which succeeded.
	LCM bool `json:"-" gorm:"column:lcm"`
	// NodeRoleID is set instead of TransactionID on a noderole's run (the
	// annealer's); Position is then the noderole's run number.
	NodeRoleID *int64 `json:"noderole_id,omitempty" gorm:"column:noderole_id"`
	// AttrsIn are the attributes a noderole run was sent; AttrsOut what its
	// jig handed back (nil until then).
	AttrsIn  map[string]any `json:"attrs_in,omitempty" gorm:"serializer:json"`
	AttrsOut map[string]any `json:"attrs_out,omitempty" gorm:"serializer:json"`
	// ChainHead is the first run of the chain this run was dispatched in
	// (RunChainOnNode), ChainNext the run the API dispatches once this
	// one succeeds; both nil on a run dispatched alone.
	ChainHead *int64    `json:"chain_head,omitempty"`
	ChainNext *int64    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Context is what the run sees (its peers aside), set by a dispatch
	// that claimed it for its agent: its work item is built right after,
	// from the same reading. Not a column.
	Context *RunContext `json:"-" gorm:"-"`
	// noOutputsSeen is set by lockRunAndNode when no run of the run's
	// transaction has left outputs yet: the run sees none, and its
	// dispatch need not read them (loadSeenOutputs).
	noOutputsSeen bool
}

// RunEdge orders two runs: the parent must succeed before the child starts.
type RunEdge struct {
	ParentID int64
	ChildID  int64
}

// Transaction statuses.
const (
	TxPending = "pending"
	TxRunning = "running"
	TxReady   = "ready"
	TxError   = "error"
	TxStopped = "stopped"
)
