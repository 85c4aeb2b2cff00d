// Package plan resolves the tasks of a graph to nodes by tags and builds the
// node-task DAG that a transaction executes.
//
// It is pure logic: it imports only the standard library, so planning 1,000
// nodes × 20 tasks is unit tested (and benchmarked) in-process, without
// Temporal or a database. The model follows the Fuel role-decomposition spec
// (seed 001): a task selects nodes by tags (or by the legacy role/groups
// fields), "/regex/" selectors are allowed, instance tags such as "mysql:1"
// are matched only exactly, requires/required_for order tasks on the same
// node and cross_depends/cross_depended_by order them across nodes.
//
// The YAML hooks below use the yaml "obsolete" Unmarshaler signature
// (UnmarshalYAML(func(any) error) error), which go.yaml.in/yaml/v3 still
// honours; that keeps this package free of any non-standard import.
package plan

import (
	"encoding/json"
	"fmt"
)

// Task types the planner treats specially: groups and stages are markers
// that order other tasks but never run on a node, and "" means shell.
const (
	// TypeGroup is a Fuel group task: a named set of tasks, no run of its own.
	TypeGroup = "group"
	// TypeStage is a Fuel stage task (e.g. "deploy_start"), a sync marker
	// without a run of its own.
	TypeStage = "stage"
	// TypeShell is the type of a task that leaves Type empty.
	TypeShell = "shell"
)

// Special selector and filter entries.
const (
	// Any is the legacy Fuel wildcard role ("*"): it selects every node,
	// even one without tags.
	Any = "*"
	// Self in a cross dependency filter selects the nodes sharing a tag that
	// selected the declaring task (see CrossDep).
	Self = "self"
)

// StringList is a list of strings that also decodes from a single string,
// because Fuel graphs write both `role: controller` and `role: [controller]`.
type StringList []string

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *StringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = fromOne(one)
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("string list: want a string or an array of strings: %w", err)
	}
	*s = many
	return nil
}

// UnmarshalYAML accepts a scalar or a sequence of scalars (yaml v3 calls this
// obsolete-style hook, so the package needs no yaml import).
func (s *StringList) UnmarshalYAML(unmarshal func(any) error) error {
	var one string
	if err := unmarshal(&one); err == nil {
		*s = fromOne(one)
		return nil
	}
	var many []string
	if err := unmarshal(&many); err != nil {
		return fmt.Errorf("string list: want a string or a list of strings: %w", err)
	}
	*s = many
	return nil
}

// fromOne turns a single decoded string into a list; an empty string is an
// empty list so that `role: ""` does not select nodes tagged "".
func fromOne(one string) StringList {
	if one == "" {
		return nil
	}
	return StringList{one}
}

// Parameters are the run parameters of a task that the planner carries along
// for the executor.
type Parameters struct {
	// Cmd is the command a shell-like task runs.
	Cmd string `json:"cmd,omitempty" yaml:"cmd,omitempty"`
	// Timeout is the run timeout in seconds; 0 means the executor default.
	Timeout int `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// Retries is how many times a failed run is retried.
	Retries int `json:"retries,omitempty" yaml:"retries,omitempty"`
	// Path, Data and Permissions describe an upload_file task: Data is
	// written to Path on the node (Permissions in octal, e.g. "0644").
	Path        string `json:"path,omitempty" yaml:"path,omitempty"`
	Data        string `json:"data,omitempty" yaml:"data,omitempty"`
	Permissions string `json:"permissions,omitempty" yaml:"permissions,omitempty"`
	// Src and Dst describe a sync task: Src's contents are copied to Dst.
	Src string `json:"src,omitempty" yaml:"src,omitempty"`
	Dst string `json:"dst,omitempty" yaml:"dst,omitempty"`
	// Secrets puts named secrets of the deployment in the run's
	// environment: {"DB_PASSWORD": {"secret": "db-password"}}. Only the
	// names are stored with the graph; the value is decrypted when the
	// node's agent claims the run, for that run only, and redacted from
	// what comes back.
	Secrets map[string]SecretRef `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	// Jig says how a task that runs on its node reaches it: "agent" (the
	// default, the node's agent) or "ssh" (the worker, over SSH with the
	// node's SSH settings).
	Jig string `json:"jig,omitempty" yaml:"jig,omitempty"`
}

// SecretRef names a secret of the deployment.
type SecretRef struct {
	Secret string `json:"secret" yaml:"secret"`
}

// CrossDep is one cross-node dependency of a task.
//
// Name is a task id or a "/regex/" over task ids. The node filter is Tags,
// or Role when Tags is empty (mirroring Task); its entries are matched
// against node tags like a task selector ("/regex/" allowed, instance tags
// only exactly), "*" matches any node, and "self" matches the nodes that
// share a tag through which the declaring task's selector picked the node at
// hand — so a task tagged [mysql:1, mysql:2] with `role: self` waits only for
// the peers of its own mysql instance. (Fuel's nailgun resolves "self" to the
// node itself; the peers reading is anneal's and includes that node.) An
// empty filter matches every node.
type CrossDep struct {
	// Name is the task id, or "/regex/" over task ids, depended upon.
	Name string `json:"name" yaml:"name"`
	// Role is the legacy node filter, used when Tags is empty.
	Role StringList `json:"role,omitempty" yaml:"role,omitempty"`
	// Tags is the node filter.
	Tags StringList `json:"tags,omitempty" yaml:"tags,omitempty"`
}

// Filter returns the node filter entries in effect: Tags, else Role.
func (d CrossDep) Filter() []string {
	if len(d.Tags) > 0 {
		return d.Tags
	}
	return d.Role
}

// Task is one task of a graph, in the Fuel task format.
type Task struct {
	// ID names the task; unique within a graph.
	ID string `json:"id" yaml:"id"`
	// Type is the task type (shell, noop, group, stage, ...); "" means shell.
	Type string `json:"type,omitempty" yaml:"type,omitempty"`
	// Tags select the nodes the task runs on.
	Tags []string `json:"tags,omitempty" yaml:"tags,omitempty"`
	// Role is the legacy selector, used when Tags is empty.
	Role StringList `json:"role,omitempty" yaml:"role,omitempty"`
	// Groups is the legacy selector, used when Tags and Role are empty.
	Groups StringList `json:"groups,omitempty" yaml:"groups,omitempty"`
	// Requires lists tasks (ids or "/regex/") that must finish first on the
	// same node.
	Requires []string `json:"requires,omitempty" yaml:"requires,omitempty"`
	// RequiredFor lists tasks (ids or "/regex/") that must wait for this one
	// on the same node.
	RequiredFor []string `json:"required_for,omitempty" yaml:"required_for,omitempty"`
	// CrossDepends lists runs on any node that must finish before this one.
	CrossDepends []CrossDep `json:"cross_depends,omitempty" yaml:"cross_depends,omitempty"`
	// CrossDependedBy lists runs on any node that must wait for this one.
	CrossDependedBy []CrossDep `json:"cross_depended_by,omitempty" yaml:"cross_depended_by,omitempty"`
	// Parameters are carried to the executor unchanged.
	Parameters Parameters `json:"parameters" yaml:"parameters"`
}

// Kind returns the task type, defaulting to shell.
func (t Task) Kind() string {
	if t.Type == "" {
		return TypeShell
	}
	return t.Type
}

// IsMarker reports whether the task is a group or stage, which orders other
// tasks but has no run.
func (t Task) IsMarker() bool {
	return t.Type == TypeGroup || t.Type == TypeStage
}

// Selector returns the node selector in effect: Tags, else Role, else Groups,
// as the Fuel TagsResolver falls back from tags to the legacy fields.
func (t Task) Selector() []string {
	switch {
	case len(t.Tags) > 0:
		return t.Tags
	case len(t.Role) > 0:
		return t.Role
	default:
		return t.Groups
	}
}

// Node is a node as the planner sees it: its tags must already include the
// names of its roles (see NodeTags).
type Node struct {
	// ID is the node's database id.
	ID int64 `json:"id" yaml:"id"`
	// Name is the node's unique name (FQDN); it orders the plan and labels runs.
	Name string `json:"name" yaml:"name"`
	// Tags are the node's tags, role names included.
	Tags []string `json:"tags,omitempty" yaml:"tags,omitempty"`
}

// NodeTags returns the tags a node is resolved with: its role names followed
// by its tags, without duplicates, because assigning a role makes the role
// name a tag of the node (seed 001).
func NodeTags(roles, tags []string) []string {
	out := make([]string, 0, len(roles)+len(tags))
	seen := make(map[string]struct{}, len(roles)+len(tags))
	for _, list := range [][]string{roles, tags} {
		for _, tag := range list {
			if _, dup := seen[tag]; dup {
				continue
			}
			seen[tag] = struct{}{}
			out = append(out, tag)
		}
	}
	return out
}

// Options restrict a plan to some nodes and tasks.
type Options struct {
	// Nodes limits the plan to these node ids; empty means all nodes.
	Nodes []int64 `json:"nodes,omitempty" yaml:"nodes,omitempty"`
	// Tasks limits the plan to these task ids; empty means all tasks. Edges
	// are kept only between selected runs.
	Tasks []string `json:"tasks,omitempty" yaml:"tasks,omitempty"`
}

// Run is one task on one node.
type Run struct {
	// Index is the run's position in Plan.Runs.
	Index int `json:"index"`
	// NodeID is the id of the node the task runs on.
	NodeID int64 `json:"node_id"`
	// NodeName is the name of the node the task runs on.
	NodeName string `json:"node_name"`
	// Task is the task definition; runs of one task share the pointer.
	Task *Task `json:"task"`
}

// Label names a run as "task@node", the form used in cycle paths and logs.
func (r Run) Label() string {
	return r.Task.ID + "@" + r.NodeName
}

// Edge orders two runs: the run at From must succeed before the run at To.
type Edge struct {
	// From indexes Plan.Runs: the run that goes first.
	From int `json:"from"`
	// To indexes Plan.Runs: the run that waits.
	To int `json:"to"`
}

// Plan is the node-task DAG of a graph: runs in a stable topological order
// and the edges between them.
type Plan struct {
	// Runs in topological order; ties broken by node name, then task position.
	Runs []Run `json:"runs"`
	// Edges sorted by From then To, without duplicates; From < To always.
	Edges []Edge `json:"edges"`
	// Warnings about dependencies that resolved to nothing.
	Warnings []string `json:"warnings,omitempty"`
}
