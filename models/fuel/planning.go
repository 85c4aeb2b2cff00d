package fuel

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// PlanGraph plans graph gi of a transaction: resolves its tasks to the
// deployment's nodes, builds the DAG and persists one run per (node, task)
// with its edges. Planning twice returns the first plan (activities retry).
func (s *Store) PlanGraph(ctx context.Context, id uuid.UUID, gi int) (*contract.GraphPlan, error) {
	var out *contract.GraphPlan
	err := models.ConnTransaction(ctx, s.DB, func(tx *gorm.DB, copyRows models.CopyFunc) error {
		var txn Transaction
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&txn, "id = ?", id).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return models.NotFound("transaction", id)
			}
			return fmt.Errorf("load transaction %s: %w", id, err)
		}
		if gi < 0 || gi >= len(txn.Graphs) {
			return &PlanError{Reason: fmt.Sprintf("transaction %s has no graph %d", id, gi)}
		}
		req := txn.Graphs[gi]
		switch txn.Status {
		case models.TxPending:
			if err := tx.Model(&txn).Updates(map[string]any{"status": models.TxRunning, "started_at": models.Now()}).Error; err != nil {
				return fmt.Errorf("start transaction %s: %w", id, err)
			}
		case models.TxReady, models.TxError, models.TxStopped:
			// The workflow was reset (`temporal workflow reset`) to run again.
			if err := tx.Model(&txn).Updates(map[string]any{"status": models.TxRunning, "error": "", "finished_at": nil}).Error; err != nil {
				return fmt.Errorf("restart transaction %s: %w", id, err)
			}
		}
		threshold := DefaultFailureThreshold
		if req.FailureThreshold != nil {
			threshold = *req.FailureThreshold
		}
		out = &contract.GraphPlan{GraphType: req.Type, DryRun: txn.DryRun,
			MaxNodesInFlight: contract.DefaultMaxNodesInFlight, FailureThreshold: &threshold}
		if req.MaxNodesInFlight > 0 {
			out.MaxNodesInFlight = req.MaxNodesInFlight
		}
		var existing int64
		if err := tx.Model(&models.TaskRun{}).Where("transaction_id = ? AND graph_index = ?", id, gi).Count(&existing).Error; err != nil {
			return fmt.Errorf("check plan of %s graph %d: %w", id, gi, err)
		}
		if existing > 0 && !txn.DryRun {
			// Planning a graph that has runs means the workflow runs again
			// (reset or retried): what did not succeed runs again, and this
			// happens before any node workflow starts, so none of them sees
			// a stale failure of another node.
			err := tx.Model(&models.TaskRun{}).
				Where("transaction_id = ? AND graph_index = ? AND state IN ?", id, gi, []string{contract.RunFailed, contract.RunBlocked, contract.RunCancelled, contract.RunRunning}).
				Updates(map[string]any{"state": contract.RunPending, "error": "", "exit_code": nil, "claimed_at": nil,
					"started_at": nil, "finished_at": nil, "updated_at": models.Now()}).Error
			if err != nil {
				return fmt.Errorf("reopen runs of %s graph %d: %w", id, gi, err)
			}
		}
		var deps []nodeDep
		if existing == 0 {
			var dep models.Deployment
			if err := tx.Take(&dep, txn.DeploymentID).Error; err != nil {
				return fmt.Errorf("load deployment of %s: %w", id, err)
			}
			graph, err := graphTasks(tx, &dep, req.Type)
			if err != nil {
				return fmt.Errorf("graph %q: %w", req.Type, err)
			}
			nodes, err := plannableNodes(tx, dep.ID)
			if err != nil {
				return err
			}
			p, err := plan.Build(graph.Tasks, nodes, plan.Options{Nodes: req.Nodes, Tasks: req.Tasks})
			if err != nil {
				return &PlanError{Reason: fmt.Sprintf("plan graph %q: %v", req.Type, err)}
			}
			out.Warnings = p.Warnings
			if err := persistPlan(tx, copyRows, &txn, gi, req.Type, p, nodes); err != nil {
				return err
			}
			deps = planNodeDeps(p)
			if err := recordFiltered(tx, &txn, gi, req, graph.Tasks, nodes, p); err != nil {
				return err
			}
			if len(p.Warnings) > 0 {
				warnings := append(slices.Clone(txn.Warnings), p.Warnings...)
				if err := tx.Model(&txn).Select("warnings").Updates(&Transaction{Warnings: warnings}).Error; err != nil {
					return fmt.Errorf("record plan warnings of %s: %w", id, err)
				}
			}
		}
		var rows []contract.PlannedNode
		err := tx.Model(&models.TaskRun{}).Select("node_id AS id, node_name AS name, count(*) AS runs").
			Where("transaction_id = ? AND graph_index = ?", id, gi).
			Group("node_id, node_name").Order("node_name").Scan(&rows).Error
		if err != nil {
			return fmt.Errorf("summarise plan of %s graph %d: %w", id, gi, err)
		}
		if existing > 0 {
			// Planned before: the persisted edges say it.
			err = tx.Raw(`
SELECT DISTINCT p.node_id AS before, c.node_id AS after
FROM run_edges e
JOIN task_runs p ON p.id = e.parent_id
JOIN task_runs c ON c.id = e.child_id
WHERE c.transaction_id = ? AND c.graph_index = ? AND p.node_id <> c.node_id`, id, gi).Scan(&deps).Error
			if err != nil {
				return fmt.Errorf("load node dependencies of %s graph %d: %w", id, gi, err)
			}
		}
		out.Nodes = nodeStartOrder(rows, deps)
		for _, n := range rows {
			out.Runs += n.Runs
		}
		return nil
	})
	if err == nil && out.Runs >= analyzeAfterRuns && s.runStatisticsOutgrown(ctx, out.Runs) {
		// A large plan grows the tables by orders of magnitude at once.
		// Until autovacuum analyzes them (up to a minute later), the
		// planner keeps the statistics of small tables and scans all of a
		// transaction's runs where an index finds a node's twenty: for
		// each node's plan (6.5 ms instead of 0.05 ms at 1,000 nodes x 20
		// tasks, three times per node) and each dispatch. Best effort: the
		// plan is committed, and autovacuum gets there in the end, so a
		// table locked by another ANALYZE or a VACUUM is not waited for.
		// Only when the plan at least doubles the table as the statistics
		// know it: an ANALYZE also makes every connection plan again each
		// statement it had prepared on these tables, a cost paid at every
		// transaction of a site with a history for nothing.
		aerr := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL lock_timeout = '1s'").Error; err != nil {
				return err
			}
			return tx.Exec("ANALYZE task_runs, run_edges").Error
		})
		if aerr != nil {
			slog.Warn("planner statistics not refreshed after a large plan; autovacuum will do it",
				"transaction", id, "graph", gi, "runs", out.Runs, "error", aerr)
		}
	}
	return out, err
}

// analyzeAfterRuns is the size of a plan after which the planner statistics
// of runs and edges are refreshed at once (see PlanGraph).
const analyzeAfterRuns = 500

// runStatisticsOutgrown says whether a plan of runs at least doubles
// task_runs as the planner's statistics count it (pg_class.reltuples: -1,
// or 0, before its first ANALYZE). Unknown is yes.
func (s *Store) runStatisticsOutgrown(ctx context.Context, runs int) bool {
	var known float64
	if err := s.DB.WithContext(ctx).Raw("SELECT reltuples FROM pg_class WHERE oid = 'task_runs'::regclass").Scan(&known).Error; err != nil {
		return true
	}
	return known <= float64(runs)
}

// nodeDep says that a run on node After waits for a run on node Before.
type nodeDep struct{ Before, After int64 }

// planNodeDeps are the node dependencies of a plan just made, each once:
// what the query over its persisted edges would find, without reading
// back the tens of thousands of edges of a big graph.
func planNodeDeps(p *plan.Plan) []nodeDep {
	seen := map[nodeDep]bool{}
	var out []nodeDep
	for _, e := range p.Edges {
		d := nodeDep{Before: p.Runs[e.From].NodeID, After: p.Runs[e.To].NodeID}
		if d.Before != d.After && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// nodeStartOrder orders nodes so that a node comes after the nodes it waits
// for (ties, and nodes caught in a cycle, by name). With a cap on the nodes
// in flight, the first unfinished node then never waits for a node that has
// not started, so the cap cannot deadlock an acyclic graph.
func nodeStartOrder(nodes []contract.PlannedNode, deps []nodeDep) []contract.PlannedNode {
	waits := map[int64]int{}
	next := map[int64][]int64{}
	for _, d := range deps {
		waits[d.After]++
		next[d.Before] = append(next[d.Before], d.After)
	}
	out := make([]contract.PlannedNode, 0, len(nodes))
	done := map[int64]bool{}
	for len(out) < len(nodes) {
		progressed := false
		for _, n := range nodes { // nodes are in name order
			if done[n.ID] || waits[n.ID] > 0 {
				continue
			}
			done[n.ID], progressed = true, true
			out = append(out, n)
			for _, m := range next[n.ID] {
				waits[m]--
			}
			break // restart from the first name: ties go by name
		}
		if !progressed {
			// A cycle between nodes: start the first remaining one by name.
			for _, n := range nodes {
				if !done[n.ID] {
					waits[n.ID] = 0
					break
				}
			}
		}
	}
	return out
}

// PlanError is a graph that cannot be planned (a cycle, say): retrying will
// not help, the transaction fails with this reason.
type PlanError struct{ Reason string }

// Error returns the reason.
func (e *PlanError) Error() string { return e.Reason }

// SkipTaskTypeReason is why a run of a task of type skipped is skipped,
// as its error says (the plan maps it to its code).
const SkipTaskTypeReason = "skipped: the task's type is skipped"

// GraphVerification is the built-in graph that checks the nodes: LCM never
// skips it, since what it checks is the world, not its inputs.
const GraphVerification = "verification"

// lcmExempt are the task types LCM never skips: a reboot is asked for, and
// the node-wiping ones forget the node's history (models.LastFinishedRuns).
var lcmExempt = []string{TaskReboot, TaskEraseNode, TaskMoveToBootstrap, TaskSkipped}

// persistPlan writes the runs of a plan and their edges, each with the
// merged data of its node (attrs_in, sent as $ANNEAL_ATTRS) and its inputs,
// and decides which runs LCM skips (see models/lcm.go for the rule and why
// part of the decision waits for dispatch).
//
// Runs come in topological order, so each run's parents are decided before
// it. A run's upstream outputs are known at plan time when no run it depends
// on executes a command: then its hash is final and it is skipped when its
// last finished run succeeded with that hash. Otherwise its hash is left for
// DispatchRun, which may still skip it.
func persistPlan(tx *gorm.DB, copyRows models.CopyFunc, txn *Transaction, gi int, graphType string, p *plan.Plan, nodes []plan.Node) error {
	state := contract.RunPending
	if txn.DryRun {
		state = contract.RunPlanned
	}
	tags := map[int64][]string{}
	for _, n := range nodes {
		tags[n.ID] = n.Tags
	}
	inPlan := map[int64][]string{}
	for _, r := range p.Runs {
		inPlan[r.NodeID] = tags[r.NodeID]
	}
	data, err := models.NodeInputs(tx, txn.DeploymentID, inPlan)
	if err != nil {
		return err
	}
	lcm := !txn.Force && graphType != GraphVerification
	var last map[models.LCMKey]*models.LastRun
	if lcm && len(inPlan) > 0 {
		ids := make([]int64, 0, len(inPlan))
		for id := range inPlan {
			ids = append(ids, id)
		}
		if last, err = models.LastFinishedRuns(tx, txn.DeploymentID, graphType, ids); err != nil {
			return err
		}
	}
	parents := make([][]int, len(p.Runs))
	for _, e := range p.Edges {
		parents[e.To] = append(parents[e.To], e.From)
	}
	// Runs of a task share its definition and runs of a node its data:
	// each is encoded once (20 tasks and 1,000 nodes, not 20,000 runs).
	type taskCode struct {
		spec       models.RunSpec
		specJSON   []byte
		definition []byte
	}
	taskCodes := map[*plan.Task]*taskCode{}
	dataJSON := map[int64][]byte{}
	// known[i]: the outputs of run i and of every run it depends on are
	// known now; seen[i]: which of those runs have outputs (what run i's
	// children read through it).
	known := make([]bool, len(p.Runs))
	seen := make([][]int, len(p.Runs))
	now := models.Now()
	runs := make([]models.TaskRun, len(p.Runs))
	for i, r := range p.Runs {
		tc := taskCodes[r.Task]
		if tc == nil {
			spec, err := runSpec(r.Task)
			if err != nil {
				return &PlanError{Reason: err.Error()}
			}
			tc = &taskCode{spec: spec}
			if tc.specJSON, err = json.Marshal(spec); err != nil {
				return fmt.Errorf("encode the spec of task %s: %w", r.Task.ID, err)
			}
			if tc.definition, err = json.Marshal(r.Task); err != nil {
				return fmt.Errorf("encode the inputs of %s on %s: %w", r.Task.ID, r.NodeName, err)
			}
			taskCodes[r.Task] = tc
		}
		raw, ok := dataJSON[r.NodeID]
		if !ok {
			if raw, err = json.Marshal(data[r.NodeID]); err != nil {
				return fmt.Errorf("encode the data of node %s: %w", r.NodeName, err)
			}
			dataJSON[r.NodeID] = raw
		}
		spec := tc.spec
		kind := r.Task.Kind()
		base := models.InputsBaseJSON(tc.definition, r.NodeName, raw)
		runs[i] = models.TaskRun{
			TransactionID: txn.ID, GraphIndex: gi, GraphType: graphType, NodeID: r.NodeID, NodeName: r.NodeName,
			TaskName: r.Task.ID, TaskType: kind, Position: i, State: state, Outputs: map[string]string{},
			Spec: spec, InputsBase: base, AttrsIn: data[r.NodeID], LCM: lcm && !slices.Contains(lcmExempt, kind),
		}
		upstreamKnown := true
		var upstream []int
		for _, q := range parents[i] {
			upstreamKnown = upstreamKnown && known[q]
			upstream = append(upstream, seen[q]...)
			if len(runs[q].Outputs) > 0 {
				upstream = append(upstream, q)
			}
		}
		slices.Sort(upstream)
		upstream = slices.Compact(upstream)
		// A run that executes nothing hands over no outputs either.
		known[i] = upstreamKnown && (spec.Jig == JigNone || kind == TaskSkipped)
		if !upstreamKnown {
			continue // final inputs known at dispatch
		}
		seen[i] = upstream
		outs := make([]models.RunOutputs, len(upstream))
		for j, q := range upstream {
			outs[j] = models.RunOutputs{TaskName: runs[q].TaskName, NodeName: runs[q].NodeName, Outputs: runs[q].Outputs}
		}
		runs[i].InputsHash = models.InputsHash(base, outs)
		if kind == TaskSkipped {
			runs[i].State = contract.RunSkipped
			runs[i].Error = SkipTaskTypeReason
			continue
		}
		prev := last[models.LCMKey{Node: r.NodeID, Task: r.Task.ID}]
		if runs[i].LCM && prev.Reusable(runs[i].InputsHash) {
			// It stands for that run: its children read that run's outputs.
			runs[i].State = contract.RunSkipped
			runs[i].Outputs = prev.Outputs
			if runs[i].Outputs == nil {
				runs[i].Outputs = map[string]string{}
			}
			if !txn.DryRun {
				runs[i].FinishedAt = &now
			}
			runs[i].Error = fmt.Sprintf("skipped: its inputs (definition, node data, outputs it reads) are those of run %d, "+
				"its last finished run on this node, which succeeded (force runs it)", prev.ID)
			known[i] = true
		}
	}
	if len(runs) == 0 {
		return nil
	}
	// The runs' ids first, in plan order (as an INSERT of them in that
	// order would number them), so that the runs and their edges can both
	// go by COPY. The sequence is task_runs.id's (bigserial, migration
	// 0001), named: pg_get_serial_sequence would be called once per id.
	var ids []int64
	if err := tx.Raw(`SELECT nextval('task_runs_id_seq') AS id FROM generate_series(1, ?) ORDER BY 1`, len(runs)).
		Scan(&ids).Error; err != nil {
		return fmt.Errorf("number the runs of %s graph %d: %w", txn.ID, gi, err)
	}
	if len(ids) != len(runs) {
		return fmt.Errorf("number the runs of %s graph %d: got %d ids for %d runs", txn.ID, gi, len(ids), len(runs))
	}
	for i := range runs {
		runs[i].ID = ids[i]
		runs[i].CreatedAt, runs[i].UpdatedAt = now, now
	}
	ctx := tx.Statement.Context
	outputsJSON := []byte("{}")
	_, err = copyRows(ctx, "task_runs", runColumns, pgx.CopyFromSlice(len(runs), func(i int) ([]any, error) {
		r := &runs[i]
		outputs := outputsJSON
		if len(r.Outputs) > 0 {
			var err error
			if outputs, err = json.Marshal(r.Outputs); err != nil {
				return nil, fmt.Errorf("encode the outputs of run %d: %w", r.ID, err)
			}
		}
		var attrsIn []byte // NULL, as gorm writes a nil map
		if r.AttrsIn != nil {
			attrsIn = dataJSON[r.NodeID]
		}
		return []any{r.ID, [16]byte(r.TransactionID), r.GraphIndex, r.GraphType, r.NodeID, r.NodeName, r.TaskName, r.TaskType,
			r.Position, taskCodes[p.Runs[i].Task].specJSON, r.State, r.Attempt, r.FinishedAt, outputs, r.Error,
			r.InputsHash, r.InputsBase, r.LCM, attrsIn, r.CreatedAt, r.UpdatedAt}, nil
	}))
	if err != nil {
		return fmt.Errorf("persist runs of %s graph %d: %w", txn.ID, gi, err)
	}
	if len(p.Edges) > 0 {
		_, err := copyRows(ctx, "run_edges", []string{"parent_id", "child_id"}, pgx.CopyFromSlice(len(p.Edges), func(i int) ([]any, error) {
			return []any{runs[p.Edges[i].From].ID, runs[p.Edges[i].To].ID}, nil
		}))
		if err != nil {
			return fmt.Errorf("persist edges of %s graph %d: %w", txn.ID, gi, err)
		}
	}
	return nil
}

// runColumns are the columns of task_runs persistPlan copies, in the order
// of its values; the others (claim, result, tails, noderole) keep their
// defaults, as gorm's INSERT of a fresh TaskRun left them.
var runColumns = []string{"id", "transaction_id", "graph_index", "graph_type", "node_id", "node_name", "task_name", "task_type",
	"position", "spec", "state", "attempt", "finished_at", "outputs", "error",
	"inputs_hash", "inputs_base", "lcm", "attrs_in", "created_at", "updated_at"}

// NodePlan loads a node's runs of graph gi in plan order with their edges.
func (s *Store) NodePlan(ctx context.Context, id uuid.UUID, gi int, nodeID int64) (*contract.NodePlan, error) {
	return s.nodePlan(ctx, id, gi, nodeID, false)
}

// StartNodePlan is NodePlan for the node's workflow as it begins: when
// some of the runs are still pending, the same statement that reads them
// marks the node busy with the graph (progress 0, as StartNodeGraph does).
func (s *Store) StartNodePlan(ctx context.Context, id uuid.UUID, gi int, nodeID int64) (*contract.NodePlan, error) {
	return s.nodePlan(ctx, id, gi, nodeID, true)
}

// nodePlanSQL reads in one round trip a node's runs of a graph in plan
// order (kind 'r') and the edges into and out of them (kind 'e'). The
// edges are two simple selects (edges into the node, edges out of it),
// which use the indexes where one with OR across both joins would not.
// Each looks the edges up from each of the node's runs (materialized),
// through run_edges' indexes (run_edges_child_idx, its primary key): the
// lateral subqueries are kept from being flattened (OFFSET 0), since as a
// join a generic plan preferred reading all of run_edges, every
// transaction's, at every node workflow's start, a cost that grew with
// the site's history. %s is startNodeSQL or nothing.
var nodePlanSQL = `WITH runs AS MATERIALIZED (
  SELECT id, task_name, task_type, state, spec, position, node_id, node_name FROM task_runs
  WHERE transaction_id = @tx AND graph_index = @gi AND node_id = @node
)%s
SELECT 'r' AS kind, id, task_name, task_type, state,
  COALESCE(spec->>'jig', '') AS jig, COALESCE((spec->>'timeout_sec')::int, 0) AS timeout_sec, COALESCE((spec->>'retries')::int, 0) AS retries,
  position,
  NULL::bigint AS parent_id, NULL::bigint AS child_id, NULL::bigint AS parent_node, NULL::bigint AS child_node,
  NULL::text AS parent_state, NULL::text AS child_node_name
FROM runs
UNION ALL` + nodeEdgesSQL("c", "p") + `
UNION ALL` + nodeEdgesSQL("p", "c") + `
ORDER BY kind DESC, position`

// nodeEdgesSQL selects, in nodePlanSQL's columns, the edges one of whose
// ends (end: c, the child, or p, the parent) is one of the node's runs,
// looked up from each of them; other is the edge's other end, read by id.
func nodeEdgesSQL(end, other string) string {
	return fmt.Sprintf(`
SELECT 'e', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, e.parent_id, e.child_id, p.node_id, c.node_id, p.state, c.node_name
FROM runs %[1]s CROSS JOIN LATERAL (SELECT parent_id, child_id FROM run_edges WHERE %[3]s = %[1]s.id OFFSET 0) e
JOIN task_runs %[2]s ON %[2]s.id = e.%[4]s`, end, other, edgeColumn[end], edgeColumn[other])
}

// edgeColumn is the run_edges column of each end of an edge.
var edgeColumn = map[string]string{"c": "child_id", "p": "parent_id"}

// startNodeSQL sets the node's progress to 0, in nodePlanSQL's statement,
// when one of its runs is pending (StartNodePlan).
const startNodeSQL = `, start AS (
  UPDATE nodes SET progress = 0, updated_at = now()
  WHERE id = @node AND EXISTS (SELECT 1 FROM runs WHERE state = '` + contract.RunPending + `')
)`

func (s *Store) nodePlan(ctx context.Context, id uuid.UUID, gi int, nodeID int64, start bool) (*contract.NodePlan, error) {
	startCTE := ""
	if start {
		startCTE = startNodeSQL
	}
	rows, err := s.DB.WithContext(ctx).Raw(fmt.Sprintf(nodePlanSQL, startCTE), sql.Named("tx", id), sql.Named("gi", gi), sql.Named("node", nodeID)).Rows()
	if err != nil {
		return nil, fmt.Errorf("load runs and edges of node %d in %s: %w", nodeID, id, err)
	}
	defer rows.Close()
	out := &contract.NodePlan{RemoteStates: map[int64]string{}}
	index := map[int64]int{}
	// Scanned by hand, as a node workflow starts with this call: through
	// gorm's reflection it was most of the call's CPU in the worker.
	var row nodePlanRow
	dests := row.dests()
	for rows.Next() {
		if err := rows.Scan(dests...); err != nil {
			return nil, fmt.Errorf("read runs and edges of node %d in %s: %w", nodeID, id, err)
		}
		if row.kind == "r" { // the runs come first
			index[row.id.Int64] = len(out.Runs)
			out.Runs = append(out.Runs, contract.NodeRun{
				ID: row.id.Int64, Task: row.taskName.String, State: row.state.String,
				TimeoutSec: int(row.timeoutSec.Int64), Retries: int(row.retries.Int64),
				NoOp: row.jig.String == JigNone, OnOrchestrator: row.jig.String == JigOrchestrator,
				OverSSH: row.jig.String == JigSSH, Reboot: row.taskType.String == TaskReboot,
			})
			continue
		}
		parent, child := row.parentID.Int64, row.childID.Int64
		switch parentNode, childNode := row.parentNode.Int64, row.childNode.Int64; {
		case parentNode == nodeID && childNode == nodeID:
			// Seen from both sides; keep it once.
			r := &out.Runs[index[child]]
			if !slices.Contains(r.Parents, parent) {
				r.Parents = append(r.Parents, parent)
			}
		case childNode == nodeID:
			r := &out.Runs[index[child]]
			r.Remote = append(r.Remote, parent)
			out.RemoteStates[parent] = row.parentState.String
		default:
			r := &out.Runs[index[parent]]
			r.RemoteKids = append(r.RemoteKids, contract.Peer{RunID: child, Node: row.childNodeName.String})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read runs and edges of node %d in %s: %w", nodeID, id, err)
	}
	return out, nil
}

// nodePlanRow is a row of nodePlanSQL: a run (kind 'r') or an edge (kind
// 'e'), the other's columns NULL.
type nodePlanRow struct {
	kind                                     string
	id, timeoutSec, retries, position        sql.NullInt64 // position only orders the rows
	taskName, taskType, state, jig           sql.NullString
	parentID, childID, parentNode, childNode sql.NullInt64
	parentState, childNodeName               sql.NullString
}

// dests are the row's fields in nodePlanSQL's column order.
func (r *nodePlanRow) dests() []any {
	return []any{&r.kind, &r.id, &r.taskName, &r.taskType, &r.state, &r.jig, &r.timeoutSec, &r.retries, &r.position,
		&r.parentID, &r.childID, &r.parentNode, &r.childNode, &r.parentState, &r.childNodeName}
}
