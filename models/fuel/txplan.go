package fuel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// Skip codes of a plan: why a task does not run on a node.
const (
	SkipLCMUnchanged = "lcm_unchanged"     // unchanged since its last successful run there
	SkipTaskType     = "task_type_skipped" // the task's type is skipped
	SkipFilteredOut  = "filtered_out"      // left out by the execute's node or task filter
)

// maxFilteredPerGraph caps what a graph's plan records of the runs its
// filters left out (a one-task execute on a big deployment leaves out
// most); the plan says how many more there were.
const maxFilteredPerGraph = 10000

// FilteredRun is a task of the graph that resolved to a node but was left
// out by the execute's filters.
type FilteredRun struct {
	NodeID int64  `json:"node_id"`
	Node   string `json:"node"`
	Task   string `json:"task"`
	Reason string `json:"reason"`
}

// filteredGraph is what planning records of a graph's filtered-out runs.
type filteredGraph struct {
	Runs []FilteredRun `json:"runs"`
	More int           `json:"more,omitempty"`
}

// recordFiltered records, for a graph planned with node or task filters,
// the runs the unfiltered graph has that the filters left out, so that the
// plan can say why they do not run. A graph that only plans filtered (the
// unfiltered one has a cycle) records nothing.
func recordFiltered(tx *gorm.DB, txn *Transaction, gi int, req GraphRequest, tasks []plan.Task, nodes []plan.Node, p *plan.Plan) error {
	if len(req.Nodes) == 0 && len(req.Tasks) == 0 {
		return nil
	}
	full, err := plan.Build(tasks, nodes, plan.Options{})
	if err != nil {
		return nil
	}
	kept := map[[2]string]bool{}
	for _, r := range p.Runs {
		kept[[2]string{r.NodeName, r.Task.ID}] = true
	}
	var out filteredGraph
	for _, r := range full.Runs {
		if kept[[2]string{r.NodeName, r.Task.ID}] {
			continue
		}
		reason := fmt.Sprintf("filtered out: task %s is not in graphs[%d].tasks", r.Task.ID, gi)
		if len(req.Nodes) > 0 && !slices.Contains(req.Nodes, r.NodeID) {
			reason = fmt.Sprintf("filtered out: node %d is not in graphs[%d].nodes", r.NodeID, gi)
		}
		if len(out.Runs) >= maxFilteredPerGraph {
			out.More++
			continue
		}
		out.Runs = append(out.Runs, FilteredRun{NodeID: r.NodeID, Node: r.NodeName, Task: r.Task.ID, Reason: reason})
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("record filtered runs of %s graph %d: %w", txn.ID, gi, err)
	}
	if err := tx.Exec(`UPDATE transactions SET filtered_out = filtered_out || jsonb_build_object(?::text, ?::jsonb) WHERE id = ?`,
		strconv.Itoa(gi), string(raw), txn.ID).Error; err != nil {
		return fmt.Errorf("record filtered runs of %s graph %d: %w", txn.ID, gi, err)
	}
	return nil
}

// TransactionPlan is a transaction's plan as persisted: per graph, its
// nodes, each node's tasks in plan order with the edges between them, the
// edges across nodes, and why each task that does not run is left out.
type TransactionPlan struct {
	Transaction uuid.UUID   `json:"transaction"`
	DryRun      bool        `json:"dry_run"`
	Status      string      `json:"status"`
	Graphs      []GraphPlan `json:"graphs"`
}

// GraphPlan is one graph of a transaction's plan.
type GraphPlan struct {
	Index int      `json:"index"`
	Type  string   `json:"type"`
	Nodes []int64  `json:"node_filter,omitempty"`
	Tasks []string `json:"task_filter,omitempty"`
	// Planned is false while the graph has not been planned yet (a later
	// graph of a running transaction).
	Planned   bool       `json:"planned"`
	PlanNodes []PlanNode `json:"nodes"`
	// CrossNodeEdges order runs of different nodes.
	CrossNodeEdges []PlanEdge `json:"cross_node_edges"`
	// FilteredOutMore counts the filtered-out runs beyond those listed.
	FilteredOutMore int `json:"filtered_out_more,omitempty"`
}

// PlanNode is a node of a graph's plan.
type PlanNode struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Tasks are the node's runs in plan order (a topological order).
	Tasks []PlanTask `json:"tasks"`
	// Edges order the node's own runs (task names).
	Edges []PlanEdge `json:"edges"`
	// FilteredOut lists the tasks the execute's filters left out here.
	FilteredOut []PlanTask `json:"filtered_out,omitempty"`
}

// PlanTask is one task of a node's plan.
type PlanTask struct {
	RunID    int64  `json:"run_id,omitempty"`
	Task     string `json:"task"`
	Type     string `json:"type,omitempty"`
	Position int    `json:"position"`
	State    string `json:"state"`
	// Skip says why the task does not run (code and reason), when it does
	// not: SkipLCMUnchanged, SkipTaskType or SkipFilteredOut.
	Skip       string `json:"skip,omitempty"`
	SkipReason string `json:"skip_reason,omitempty"`
}

// PlanEdge orders two runs: From must succeed before To. Within a node
// they are task names; across nodes, "task@node".
type PlanEdge struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// TransactionPlan loads a transaction's plan from its persisted runs and
// edges (and what planning recorded of its filtered-out runs).
func (s *Store) TransactionPlan(ctx context.Context, id uuid.UUID) (*TransactionPlan, error) {
	db := s.DB.WithContext(ctx)
	var txn Transaction
	if err := db.Take(&txn, "id = ?", id).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, models.NotFound("transaction", id)
		}
		return nil, fmt.Errorf("load transaction %s: %w", id, err)
	}
	var runs []models.TaskRun
	if err := db.Select("id", "graph_index", "node_id", "node_name", "task_name", "task_type", "position", "state", "error").
		Where("transaction_id = ?", id).Order("graph_index, position").Find(&runs).Error; err != nil {
		return nil, fmt.Errorf("load runs of %s: %w", id, err)
	}
	var edges []models.RunEdge
	if err := db.Raw(`SELECT e.parent_id, e.child_id FROM run_edges e JOIN task_runs c ON c.id = e.child_id
		WHERE c.transaction_id = ? ORDER BY e.parent_id, e.child_id`, id).Scan(&edges).Error; err != nil {
		return nil, fmt.Errorf("load edges of %s: %w", id, err)
	}
	var rawFiltered string
	if err := db.Raw(`SELECT filtered_out::text FROM transactions WHERE id = ?`, id).Scan(&rawFiltered).Error; err != nil {
		return nil, fmt.Errorf("load filtered runs of %s: %w", id, err)
	}
	filtered := map[string]filteredGraph{}
	if rawFiltered != "" {
		if err := json.Unmarshal([]byte(rawFiltered), &filtered); err != nil {
			return nil, fmt.Errorf("decode filtered runs of %s: %w", id, err)
		}
	}

	out := &TransactionPlan{Transaction: id, DryRun: txn.DryRun, Status: txn.Status, Graphs: make([]GraphPlan, len(txn.Graphs))}
	type nodeKey struct {
		gi   int
		node int64
	}
	nodeAt := map[nodeKey]*PlanNode{}
	order := map[int][]nodeKey{}
	byRun := map[int64]models.TaskRun{}
	for gi, g := range txn.Graphs {
		out.Graphs[gi] = GraphPlan{Index: gi, Type: g.Type, Nodes: g.Nodes, Tasks: g.Tasks, PlanNodes: []PlanNode{}, CrossNodeEdges: []PlanEdge{}}
	}
	node := func(gi int, id int64, name string) *PlanNode {
		k := nodeKey{gi, id}
		if n := nodeAt[k]; n != nil {
			return n
		}
		n := &PlanNode{ID: id, Name: name, Tasks: []PlanTask{}, Edges: []PlanEdge{}}
		nodeAt[k] = n
		order[gi] = append(order[gi], k)
		return n
	}
	for _, r := range runs {
		if r.GraphIndex < 0 || r.GraphIndex >= len(out.Graphs) {
			continue
		}
		byRun[r.ID] = r
		out.Graphs[r.GraphIndex].Planned = true
		t := PlanTask{RunID: r.ID, Task: r.TaskName, Type: r.TaskType, Position: r.Position, State: r.State}
		if r.State == contract.RunSkipped {
			t.SkipReason = r.Error
			t.Skip = SkipLCMUnchanged // LCM: the other way a planned run is skipped
			if r.TaskType == TaskSkipped {
				t.Skip = SkipTaskType
			}
		}
		n := node(r.GraphIndex, r.NodeID, r.NodeName)
		n.Tasks = append(n.Tasks, t)
	}
	for _, e := range edges {
		p, okp := byRun[e.ParentID]
		c, okc := byRun[e.ChildID]
		if !okp || !okc {
			continue
		}
		if p.NodeID == c.NodeID {
			n := node(c.GraphIndex, c.NodeID, c.NodeName)
			n.Edges = append(n.Edges, PlanEdge{From: p.TaskName, To: c.TaskName})
			continue
		}
		g := &out.Graphs[c.GraphIndex]
		g.CrossNodeEdges = append(g.CrossNodeEdges, PlanEdge{From: p.TaskName + "@" + p.NodeName, To: c.TaskName + "@" + c.NodeName})
	}
	for key, fg := range filtered {
		gi, err := strconv.Atoi(key)
		if err != nil || gi < 0 || gi >= len(out.Graphs) {
			continue
		}
		out.Graphs[gi].FilteredOutMore = fg.More
		for _, f := range fg.Runs {
			n := node(gi, f.NodeID, f.Node)
			n.FilteredOut = append(n.FilteredOut, PlanTask{Task: f.Task, State: contract.RunSkipped, Skip: SkipFilteredOut, SkipReason: f.Reason})
		}
	}
	for gi := range out.Graphs {
		keys := order[gi]
		sort.SliceStable(keys, func(i, j int) bool { return nodeAt[keys[i]].Name < nodeAt[keys[j]].Name })
		for _, k := range keys {
			out.Graphs[gi].PlanNodes = append(out.Graphs[gi].PlanNodes, *nodeAt[k])
		}
	}
	return out, nil
}

// ParsePlanFilters reads graph.gv's node and task filters (?nodes=1,2 and
// ?tasks=a,b, the same as an execute's graphs[].nodes and graphs[].tasks).
func ParsePlanFilters(nodes, tasks []string) (plan.Options, error) {
	var opts plan.Options
	for i, raw := range nodes {
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || id <= 0 {
			return opts, &models.InputError{Status: 400, Field: fmt.Sprintf("nodes[%d]", i), Reason: fmt.Sprintf("%q is not a node id", models.Clip(raw))}
		}
		opts.Nodes = append(opts.Nodes, id)
	}
	for i, t := range tasks {
		if err := models.ValidLine(fmt.Sprintf("tasks[%d]", i), t, models.MaxTaskIDLen); err != nil {
			return opts, err
		}
		opts.Tasks = append(opts.Tasks, t)
	}
	if err := models.MaxItems("nodes", len(opts.Nodes), models.MaxListLen); err != nil {
		return opts, err
	}
	if err := models.MaxItems("tasks", len(opts.Tasks), models.MaxListLen); err != nil {
		return opts, err
	}
	return opts, nil
}
