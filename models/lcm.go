package models

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models/attrs"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// LCM (life-cycle management) skips a graph task on a node when running it
// again would do nothing new: the last finished run of that task on that
// node (any transaction of the same deployment, same graph type) succeeded,
// or was itself skipped, with the same inputs. A failed run, or none, means
// the task runs.
//
// The inputs are everything the task sees:
//   - its definition and its node (InputsBaseJSON);
//   - the merged data of its node, sent as $ANNEAL_ATTRS (NodeInputs);
//   - the outputs of the runs it depends on, directly or not, as
//     ANNEAL_OUT_* and ANNEAL_CONTEXT show them (seenOutputs). Outputs
//     of runs it does not depend on are left out: they are there or not
//     depending on timing, so a task cannot rely on them.
//
// Where the hash is computed: the definition and merged data are known at
// plan time, but the outputs of the runs it depends on are known at plan
// time only when those runs are skipped too (a skipped run carries the
// outputs of the run it stands for). So planning skips a run when it and
// everything it depends on are unchanged; a run with an upstream run that
// will execute is planned pending, and DispatchRun, when every upstream run
// has ended, computes its final hash from the actual outputs and skips it
// there if those match (the upstream task ran but handed over the same
// outputs). The hash stored on a run is therefore always the one of what
// it saw, and the next plan compares against that.

// InputsBaseJSON digests the part of a run's inputs known at plan time: its
// task's definition and its merged data, as their JSON encodings
// (json.Marshal's), and its node. Planning encodes each task and each
// node's data once, not once per run. The bytes hashed are those of
// {"task":…,"node":…,"data":…}, as the first version encoded them, so the
// hashes agree with those of runs already stored (LCM compares them; see
// the test's inputsBase).
func InputsBaseJSON(definition []byte, node string, data []byte) string {
	name, _ := json.Marshal(node) // a string: cannot fail
	h := sha256.New()
	for _, part := range [][]byte{[]byte(`{"task":`), definition, []byte(`,"node":`), name, []byte(`,"data":`), data, []byte(`}`)} {
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// InputsHash completes base with the outputs of the runs a run depends on.
// Runs without outputs are not seen by the task and do not count; the
// order of upstream does not matter.
func InputsHash(base string, upstream []RunOutputs) string {
	seen := make([]RunOutputs, 0, len(upstream))
	for _, u := range upstream {
		if len(u.Outputs) > 0 {
			seen = append(seen, u)
		}
	}
	slices.SortFunc(seen, func(a, b RunOutputs) int {
		return cmp.Or(cmp.Compare(a.NodeName, b.NodeName), cmp.Compare(a.TaskName, b.TaskName))
	})
	raw, err := json.Marshal(seen)
	if err != nil {
		panic(fmt.Sprintf("encode outputs: %v", err)) // strings only: cannot fail
	}
	sum := sha256.Sum256(append(append([]byte(base), 0), raw...))
	return hex.EncodeToString(sum[:])
}

// NodeInputs returns the merged data each graph task of a node sees, the
// Fuel-style counterpart of a noderole's attributes: the deep merge of the
// deployment's attributes, then the deployment's role data of each of the
// node's roles (in the node's order), then the node's own attributes; with
// "anneal": {"node", "roles", "tags"} naming the node, its roles and its
// tags (as planning resolved them) on top. tags maps each node to return
// to its tags.
func NodeInputs(tx *gorm.DB, deploymentID int64, tags map[int64][]string) (map[int64]map[string]any, error) {
	var dep Deployment
	if err := tx.Select("id", "attributes").Take(&dep, deploymentID).Error; err != nil {
		return nil, fmt.Errorf("load attributes of deployment %d: %w", deploymentID, err)
	}
	var roleRows []struct {
		Name string
		Data string
	}
	err := tx.Raw(`SELECT r.name, dr.data::text AS data FROM deployment_roles dr JOIN roles r ON r.id = dr.role_id
		WHERE dr.deployment_id = ? ORDER BY r.id`, deploymentID).Scan(&roleRows).Error
	if err != nil {
		return nil, fmt.Errorf("load role data of deployment %d: %w", deploymentID, err)
	}
	roleData := make(map[string]map[string]any, len(roleRows))
	for _, r := range roleRows {
		var data map[string]any
		if err := json.Unmarshal([]byte(r.Data), &data); err != nil {
			return nil, fmt.Errorf("decode data of role %s in deployment %d: %w", r.Name, deploymentID, err)
		}
		roleData[r.Name] = data
	}
	ids := make([]int64, 0, len(tags))
	for id := range tags {
		ids = append(ids, id)
	}
	var nodes []Node
	if err := tx.Select("id", "name", "roles", "attributes").Where("id IN ?", ids).Find(&nodes).Error; err != nil {
		return nil, fmt.Errorf("load attributes of nodes: %w", err)
	}
	out := make(map[int64]map[string]any, len(nodes))
	for _, n := range nodes {
		layers := []map[string]any{dep.Attributes}
		for _, role := range n.Roles {
			layers = append(layers, roleData[role])
		}
		layers = append(layers, n.Attributes)
		roles := n.Roles
		if roles == nil {
			roles = []string{}
		}
		nodeTags := tags[n.ID]
		if nodeTags == nil {
			nodeTags = []string{}
		}
		layers = append(layers, map[string]any{"anneal": map[string]any{
			"node": n.Name, "roles": toAny(roles), "tags": toAny(nodeTags),
		}})
		// DeepMerge copies, so the layers stay untouched; a JSON round trip
		// makes the result compare equal to what the database hands back.
		merged, err := jsonRoundTrip(attrs.DeepMerge(layers...))
		if err != nil {
			return nil, fmt.Errorf("merge data of node %s: %w", n.Name, err)
		}
		out[n.ID] = merged
	}
	return out, nil
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func jsonRoundTrip(m map[string]any) (map[string]any, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// LastRun is the last finished run of a task on a node, as LCM compares it.
type LastRun struct {
	ID         int64
	NodeID     int64
	TaskName   string
	State      string
	InputsBase string
	InputsHash string
	Outputs    map[string]string `gorm:"serializer:json"`
}

// Reusable says whether a run with the given inputs hash may stand for
// this one: it succeeded (or was skipped, standing for one that did) with
// the same inputs.
func (l *LastRun) Reusable(hash string) bool {
	return l != nil && (l.State == contract.RunSucceeded || l.State == contract.RunSkipped) && l.InputsHash == hash
}

// LCMKey names a task on a node.
type LCMKey struct {
	Node int64
	Task string
}

// lastRunsWhere is the condition on a finished run r (of task_runs, joined
// with its transaction t) that makes it one LCM compares with: of graph
// type %[2]s in deployment %[1]s (not a dry run's, not one a task of type
// skipped made), finished after its node was last wiped, and %[3]s.
//
// The tasks of type erase_node and move_to_bootstrap wipe a node: its runs
// that finished before the last of them are forgotten, so a node erased and
// sent back to bootstrap is provisioned again. A failed one counts too: it
// may have wiped part of the node. The literals match the partial indexes
// of migration 0014.
const lastRunsWhere = `t.deployment_id = %[1]s AND r.graph_type = %[2]s AND r.finished_at IS NOT NULL AND r.transaction_id IS NOT NULL
  AND r.state IN ('succeeded', 'failed', 'skipped') AND r.task_type <> 'skipped' AND NOT t.dry_run AND %[3]s
  AND r.finished_at > coalesce((SELECT max(w.finished_at) FROM task_runs w
        WHERE w.node_id = r.node_id AND w.task_type IN ('erase_node', 'move_to_bootstrap') AND w.finished_at IS NOT NULL), '-infinity')`

// lastRunsSQL picks, per (node, task), the last finished run of a graph
// type in a deployment (see lastRunsWhere); %s narrows it further.
var lastRunsSQL = `
SELECT DISTINCT ON (r.node_id, r.task_name) r.id, r.node_id, r.task_name, r.state, r.inputs_base, r.inputs_hash, r.outputs
FROM task_runs r JOIN transactions t ON t.id = r.transaction_id
WHERE ` + fmt.Sprintf(lastRunsWhere, "?", "?", "%s") + `
ORDER BY r.node_id, r.task_name, r.finished_at DESC, r.id DESC`

// LastFinishedRuns returns the last finished run of each task on each of
// nodes in a deployment's graph type (see lastRunsSQL).
func LastFinishedRuns(tx *gorm.DB, deploymentID int64, graphType string, nodes []int64) (map[LCMKey]*LastRun, error) {
	var rows []LastRun
	err := tx.Raw(fmt.Sprintf(lastRunsSQL, "r.node_id IN ?"), deploymentID, graphType, nodes).
		Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load the last finished runs of graph %s: %w", graphType, err)
	}
	out := make(map[LCMKey]*LastRun, len(rows))
	for i := range rows {
		out[LCMKey{rows[i].NodeID, rows[i].TaskName}] = &rows[i]
	}
	return out, nil
}

// seenOutputs are the outputs a run sees when it starts (all: its
// ancestors', the earlier graphs', and its own node's earlier runs of its
// graph, as ANNEAL_CONTEXT shows them) and, among them, those of the runs
// it depends on, directly or not, that ended well (succeeded, or skipped
// with the outputs of the run they stand for: upstream, which its inputs
// hash covers). One query gives both, for its inputs hash at its dispatch
// and, when its dispatch also builds its work item (a chain's next run,
// handed back with its predecessor's report), for that too.
type seenOutputs struct {
	all, upstream []RunOutputs
}

// loadSeenOutputs reads a run's seenOutputs. The predicate on state and
// outputs is written with literals so that the partial index
// task_runs_tx_outputs_idx serves it, also from a cached generic plan: a
// transaction of 20,000 runs has few with outputs, and the walk up the
// run's ancestors is made only when there are some.
func loadSeenOutputs(tx *gorm.DB, run *TaskRun) (*seenOutputs, error) {
	if run.noOutputsSeen {
		return &seenOutputs{all: []RunOutputs{}}, nil
	}
	var rows []struct {
		TaskName string
		NodeName string
		Outputs  map[string]string `gorm:"serializer:json"`
		Upstream bool
	}
	err := tx.Raw(`
WITH RECURSIVE ancestors(id) AS (
  SELECT parent_id FROM run_edges WHERE child_id = ?
  UNION
  SELECT e.parent_id FROM run_edges e JOIN ancestors a ON e.child_id = a.id
)
SELECT task_name, node_name, outputs, id IN (SELECT id FROM ancestors) AS upstream
FROM task_runs WHERE transaction_id = ? AND state IN ('succeeded', 'skipped') AND outputs <> '{}'::jsonb
  AND (id IN (SELECT id FROM ancestors) OR graph_index < ? OR (node_id = ? AND graph_index = ? AND position < ?))
ORDER BY finished_at, id`,
		run.ID, run.TransactionID, run.GraphIndex, run.NodeID, run.GraphIndex, run.Position).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load the outputs seen by run %d: %w", run.ID, err)
	}
	out := &seenOutputs{all: make([]RunOutputs, 0, len(rows))}
	for _, r := range rows {
		o := RunOutputs{TaskName: r.TaskName, NodeName: r.NodeName, Outputs: r.Outputs}
		out.all = append(out.all, o)
		if r.Upstream {
			out.upstream = append(out.upstream, o)
		}
	}
	return out, nil
}

// settleInputs runs inside DispatchRun, when every run that run depends on
// has ended: it stores the run's final inputs hash, over the outputs it is
// about to see, and, when LCM applies and the last finished run of its task
// on its node succeeded with that very hash, skips it instead (with that
// run's outputs, which its children then read). It returns the skipped
// run, or nil when the run is to be dispatched.
func settleInputs(tx *gorm.DB, runID int64) (*TaskRun, error) {
	skipped, hash, err := finalInputs(tx, runID, true)
	if err != nil || skipped != nil {
		return skipped, err
	}
	return nil, writeInputsHash(tx, runID, hash)
}

// writeInputsHash stores a run's final inputs hash (nothing when "").
func writeInputsHash(tx *gorm.DB, runID int64, hash string) error {
	if hash == "" {
		return nil
	}
	if err := tx.Model(&TaskRun{}).Where("id = ?", runID).Update("inputs_hash", hash).Error; err != nil {
		return fmt.Errorf("record the inputs of run %d: %w", runID, err)
	}
	return nil
}

// recordInputs stores a run's final inputs hash, as settleInputs does,
// without skipping it: a no-op run costs nothing to run.
func recordInputs(tx *gorm.DB, runID int64) error {
	_, hash, err := finalInputs(tx, runID, false)
	if err != nil {
		return err
	}
	return writeInputsHash(tx, runID, hash)
}

// finalInputs computes a run's final inputs hash ("" for a run without
// inputs) and, when maySkip, skips the run if its last finished run
// succeeded with the same inputs (then it returns the skipped run, hash
// written).
func finalInputs(tx *gorm.DB, runID int64, maySkip bool) (*TaskRun, string, error) {
	var run TaskRun
	err := tx.Select(inputsColumns).Take(&run, runID).Error
	if err != nil {
		return nil, "", fmt.Errorf("load run %d: %w", runID, err)
	}
	return finalInputsOf(tx, run, maySkip, nil)
}

// inputsColumns are the columns of a run finalInputsOf reads.
var inputsColumns = []string{"id", "transaction_id", "node_id", "node_name", "task_name", "graph_type", "graph_index", "position", "state", "inputs_base", "lcm"}

// finalInputsOf is finalInputs of a run whose inputsColumns are loaded
// already (dispatch reads them with the lock of the run's node), with the
// outputs it sees when they are loaded already too (nil: loaded here).
func finalInputsOf(tx *gorm.DB, run TaskRun, maySkip bool, seen *seenOutputs) (*TaskRun, string, error) {
	runID := run.ID
	if run.InputsBase == "" {
		return nil, "", nil // a noderole's run, or one planned before LCM knew inputs
	}
	if seen == nil {
		var err error
		if seen, err = loadSeenOutputs(tx, &run); err != nil {
			return nil, "", err
		}
	}
	hash := InputsHash(run.InputsBase, seen.upstream)
	if maySkip && run.LCM && run.State == contract.RunPending {
		// The deployment as a subquery: one round trip fewer per dispatch.
		deployment := gorm.Expr("(SELECT deployment_id FROM transactions WHERE id = ?)", run.TransactionID)
		var last []LastRun
		err := tx.Raw(fmt.Sprintf(lastRunsSQL, "r.node_id = ? AND r.task_name = ? AND r.id <> ?"),
			deployment, run.GraphType, run.NodeID, run.TaskName, run.ID).Find(&last).Error
		if err != nil {
			return nil, "", fmt.Errorf("load the last finished run of %s on %s: %w", run.TaskName, run.NodeName, err)
		}
		if len(last) == 1 && last[0].Reusable(hash) {
			outputs := last[0].Outputs
			if outputs == nil {
				outputs = map[string]string{}
			}
			now := Now()
			skipped := TaskRun{ID: runID, State: contract.RunSkipped, InputsHash: hash, Outputs: outputs, FinishedAt: &now, UpdatedAt: now,
				Error: fmt.Sprintf("skipped: the runs it depends on handed over the same outputs, and its inputs are those of run %d, which succeeded (force runs it)", last[0].ID)}
			res := tx.Model(&skipped).Where("state = ?", contract.RunPending).
				Select("state", "inputs_hash", "outputs", "finished_at", "updated_at", "error").Updates(&skipped)
			if res.Error != nil {
				return nil, "", fmt.Errorf("skip run %d: %w", runID, res.Error)
			}
			if res.RowsAffected == 0 {
				// No longer pending (its state was read before the node's
				// lock was granted, and another dispatch came first): the
				// dispatching UPDATE, which checks the row as it is now,
				// decides.
				return nil, hash, nil
			}
			var out TaskRun
			if err := tx.Take(&out, runID).Error; err != nil {
				return nil, "", fmt.Errorf("load run %d: %w", runID, err)
			}
			return &out, hash, nil
		}
	}
	return nil, hash, nil
}
