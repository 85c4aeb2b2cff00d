package fuel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
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
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
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
			if err := persistPlan(tx, &txn, gi, req.Type, p); err != nil {
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
		var deps []nodeDep
		err = tx.Raw(`
SELECT DISTINCT p.node_id AS before, c.node_id AS after
FROM run_edges e
JOIN task_runs p ON p.id = e.parent_id
JOIN task_runs c ON c.id = e.child_id
WHERE c.transaction_id = ? AND c.graph_index = ? AND p.node_id <> c.node_id`, id, gi).Scan(&deps).Error
		if err != nil {
			return fmt.Errorf("load node dependencies of %s graph %d: %w", id, gi, err)
		}
		out.Nodes = nodeStartOrder(rows, deps)
		for _, n := range rows {
			out.Runs += n.Runs
		}
		return nil
	})
	return out, err
}

// nodeDep says that a run on node After waits for a run on node Before.
type nodeDep struct{ Before, After int64 }

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

func persistPlan(tx *gorm.DB, txn *Transaction, gi int, graphType string, p *plan.Plan) error {
	state := contract.RunPending
	if txn.DryRun {
		state = contract.RunPlanned
	}
	done, err := lastSucceeded(tx, txn.DeploymentID, graphType)
	if err != nil {
		return err
	}
	runs := make([]models.TaskRun, len(p.Runs))
	for i, r := range p.Runs {
		spec, err := runSpec(r.Task)
		if err != nil {
			return &PlanError{Reason: err.Error()}
		}
		hash := inputsHash(r)
		runs[i] = models.TaskRun{
			TransactionID: txn.ID, GraphIndex: gi, GraphType: graphType, NodeID: r.NodeID, NodeName: r.NodeName,
			TaskName: r.Task.ID, TaskType: r.Task.Kind(), Position: i, State: state, Outputs: map[string]string{},
			Spec: spec, InputsHash: hash,
		}
		if r.Task.Kind() == TaskSkipped {
			runs[i].State = contract.RunSkipped
			runs[i].Error = "skipped: the task's type is skipped"
			continue
		}
		if !txn.Force && done[lcmKey{r.NodeID, r.Task.ID}] == hash {
			runs[i].State = contract.RunSkipped
			runs[i].Error = "skipped: unchanged since its last successful run on this node (force runs it)"
		}
	}
	if len(runs) > 0 {
		if err := tx.CreateInBatches(&runs, 1000).Error; err != nil {
			return fmt.Errorf("persist runs of %s graph %d: %w", txn.ID, gi, err)
		}
	}
	edges := make([]models.RunEdge, len(p.Edges))
	for i, e := range p.Edges {
		edges[i] = models.RunEdge{ParentID: runs[e.From].ID, ChildID: runs[e.To].ID}
	}
	if len(edges) > 0 {
		if err := tx.CreateInBatches(&edges, 2000).Error; err != nil {
			return fmt.Errorf("persist edges of %s graph %d: %w", txn.ID, gi, err)
		}
	}
	return nil
}

// lcmKey names a task on a node.
type lcmKey struct {
	node int64
	task string
}

// lastSucceeded maps each (node, task) of a deployment's graph type to the
// inputs hash of its last successful run.
func lastSucceeded(tx *gorm.DB, deploymentID int64, graphType string) (map[lcmKey]string, error) {
	var rows []struct {
		NodeID     int64
		TaskName   string
		InputsHash string
	}
	err := tx.Raw(`
SELECT DISTINCT ON (r.node_id, r.task_name) r.node_id, r.task_name, r.inputs_hash
FROM task_runs r JOIN transactions t ON t.id = r.transaction_id
WHERE t.deployment_id = ? AND r.graph_type = ? AND r.state = ?
ORDER BY r.node_id, r.task_name, r.finished_at DESC`, deploymentID, graphType, contract.RunSucceeded).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load last successful runs: %w", err)
	}
	out := make(map[lcmKey]string, len(rows))
	for _, r := range rows {
		out[lcmKey{r.NodeID, r.TaskName}] = r.InputsHash
	}
	return out, nil
}

// inputsHash digests what a run depends on: the task's definition and the
// node it runs on. Equal hashes mean re-running would do the same thing.
func inputsHash(r plan.Run) string {
	def, err := json.Marshal(r.Task)
	if err != nil {
		panic(fmt.Sprintf("marshal task %s: %v", r.Task.ID, err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(append(append(def, 0), r.NodeName...))
	return hex.EncodeToString(sum[:])
}

// contract.NodePlan loads a node's runs of graph gi in plan order with their edges.
func (s *Store) NodePlan(ctx context.Context, id uuid.UUID, gi int, nodeID int64) (*contract.NodePlan, error) {
	db := s.DB.WithContext(ctx)
	var runs []models.TaskRun
	err := db.Select("id", "task_name", "task_type", "state", "spec").
		Where("transaction_id = ? AND graph_index = ? AND node_id = ?", id, gi, nodeID).
		Order("position").Find(&runs).Error
	if err != nil {
		return nil, fmt.Errorf("load runs of node %d in %s: %w", nodeID, id, err)
	}
	out := &contract.NodePlan{RemoteStates: map[int64]string{}}
	index := map[int64]int{}
	for i, r := range runs {
		index[r.ID] = i
		out.Runs = append(out.Runs, contract.NodeRun{
			ID: r.ID, Task: r.TaskName, State: r.State, TimeoutSec: r.Spec.TimeoutSec, Retries: r.Spec.Retries,
			NoOp: r.Spec.Jig == JigNone, OnOrchestrator: r.Spec.Jig == JigOrchestrator, OverSSH: r.Spec.Jig == JigSSH, Reboot: r.TaskType == TaskReboot,
		})
	}
	const edgeSQL = `
SELECT e.parent_id, e.child_id, p.node_id AS parent_node, c.node_id AS child_node,
       p.state AS parent_state, c.node_name AS child_node_name
FROM run_edges e
JOIN task_runs p ON p.id = e.parent_id
JOIN task_runs c ON c.id = e.child_id
WHERE %[1]s.transaction_id = ? AND %[1]s.graph_index = ? AND %[1]s.node_id = ?`
	// Two simple queries (edges into the node, edges out of it) use the
	// indexes; one query with OR across both joins would not.
	var edges []edgeRow
	for _, side := range []string{"c", "p"} {
		var part []edgeRow
		if err := db.Raw(fmt.Sprintf(edgeSQL, side), id, gi, nodeID).Scan(&part).Error; err != nil {
			return nil, fmt.Errorf("load edges of node %d in %s: %w", nodeID, id, err)
		}
		edges = append(edges, part...)
	}
	for _, e := range edges {
		switch {
		case e.ParentNode == nodeID && e.ChildNode == nodeID:
			// Seen from both sides; keep it once.
			r := &out.Runs[index[e.ChildID]]
			if !slices.Contains(r.Parents, e.ParentID) {
				r.Parents = append(r.Parents, e.ParentID)
			}
		case e.ChildNode == nodeID:
			r := &out.Runs[index[e.ChildID]]
			r.Remote = append(r.Remote, e.ParentID)
			out.RemoteStates[e.ParentID] = e.ParentState
		default:
			r := &out.Runs[index[e.ParentID]]
			r.RemoteKids = append(r.RemoteKids, contract.Peer{RunID: e.ChildID, Node: e.ChildNodeName})
		}
	}
	return out, nil
}

// edgeRow is an edge with both ends' nodes, as contract.NodePlan reads it.
type edgeRow struct {
	ParentID, ChildID          int64
	ParentNode, ChildNode      int64
	ParentState, ChildNodeName string
}
