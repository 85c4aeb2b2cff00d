package crowbar

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/attrs"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// NodeRoleRunGraph is the graph_type of a noderole's task run, so that its
// runs read apart from a transaction's.
const NodeRoleRunGraph = "noderole"

// PrepareNodeRoleRun creates the task run of run number run of a noderole
// in transition, with the attributes it sees (NodeRoleAttrs). It is
// idempotent: a second call returns the same run.
func (s *Store) PrepareNodeRoleRun(ctx context.Context, id int64, run int) (*contract.NodeRoleRunPlan, error) {
	var out *contract.NodeRoleRunPlan
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		nr, err := loadNodeRole(tx, id, true)
		if err != nil {
			return err
		}
		var role models.Role
		if err := tx.Take(&role, nr.RoleID).Error; err != nil {
			return fmt.Errorf("load role of noderole %d: %w", id, err)
		}
		out = &contract.NodeRoleRunPlan{NodeRoleID: id, Run: run, NodeID: nr.NodeID, Node: nr.NodeName, Role: role.Name,
			Jig: role.Jig, HasScript: role.Script != "", TimeoutSec: models.NodeRoleTimeoutSec}
		if nr.State != contract.NodeRoleTransition || nr.RunCount+1 != run {
			out.Skip = fmt.Sprintf("noderole %d is %s after %d runs; run %d is not awaited", id, nr.State, nr.RunCount, run)
			return nil
		}
		sees, err := NodeRoleAttrs(tx, nr)
		if err != nil {
			return err
		}
		spec := models.RunSpec{Cmd: role.Script, TimeoutSec: models.NodeRoleTimeoutSec}
		if err := tx.Exec(`INSERT INTO task_runs (noderole_id, graph_index, graph_type, node_id, node_name, task_name,
				task_type, position, spec, state, attrs_in)
			VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (noderole_id, position) WHERE noderole_id IS NOT NULL DO NOTHING`,
			id, NodeRoleRunGraph, nr.NodeID, nr.NodeName, role.Name, "shell", run, jsonValue(spec), contract.RunPending, jsonb(sees)).Error; err != nil {
			return fmt.Errorf("create run %d of noderole %d: %w", run, id, err)
		}
		return tx.Model(&models.TaskRun{}).Where("noderole_id = ? AND position = ?", id, run).Pluck("id", &out.RunID).Error
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// jsonValue is any JSON value as an SQL expression (a value that cannot be
// encoded, which JSON decoded from the database never is, becomes {}).
func jsonValue(v any) clause.Expr {
	raw, err := json.Marshal(v)
	if err != nil {
		raw = []byte("{}")
	}
	return gorm.Expr("?::jsonb", string(raw))
}

// FinishNodeRoleRun ends run number run of a noderole: ok sets it active,
// otherwise error (with reason on its task run when the run did not report
// one). The wall is the deep diff of what the jig handed back against what
// it was sent; a failed run keeps the previous wall. It is idempotent: once
// the noderole has left transition for this run, nothing changes.
//
// A noderole whose snapshot was archived while it ran (a newer snapshot
// was committed) still ends, so that its node is free again, but without
// events or changes to its children: the committed copy runs on its own.
func (s *Store) FinishNodeRoleRun(ctx context.Context, id int64, run int, ok bool, reason string) (*NodeRole, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		nr, err := loadNodeRole(tx, id, true)
		if err != nil {
			return err
		}
		if nr.State != contract.NodeRoleTransition || nr.RunCount+1 != run {
			return nil
		}
		var runs []models.TaskRun
		if err := tx.Where("noderole_id = ? AND position = ?", id, run).Limit(1).Find(&runs).Error; err != nil {
			return fmt.Errorf("load run %d of noderole %d: %w", run, id, err)
		}
		wall := nr.Wall
		if len(runs) == 0 && !ok {
			// The run ended before it had a task run (its workflow was
			// terminated early): one records why, for the operator.
			if err := tx.Exec(`INSERT INTO task_runs (noderole_id, graph_index, graph_type, node_id, node_name, task_name,
					position, state, error, finished_at)
				VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, now())
				ON CONFLICT (noderole_id, position) WHERE noderole_id IS NOT NULL DO NOTHING`,
				id, NodeRoleRunGraph, nr.NodeID, nr.NodeName, nr.RoleName, run, contract.RunFailed, reason).Error; err != nil {
				return fmt.Errorf("record the failed run %d of noderole %d: %w", run, id, err)
			}
		}
		if len(runs) == 1 {
			r := runs[0]
			// The run row ends with the noderole (the agent's report has
			// usually ended it already): it must not hold the node.
			if !contract.RunFinal(r.State) {
				state := contract.RunSucceeded
				if !ok {
					state = contract.RunFailed
				}
				if err := tx.Model(&models.TaskRun{}).Where("id = ?", r.ID).Updates(map[string]any{
					"state": state, "error": reason, "finished_at": models.Now(), "updated_at": models.Now()}).Error; err != nil {
					return fmt.Errorf("end run %d: %w", r.ID, err)
				}
			}
			if ok {
				back := r.AttrsOut
				if back == nil {
					back = r.AttrsIn
				}
				// A secret reference resolved for the run came back
				// redacted: that is no change.
				back = models.RestoreSecretRefs(r.AttrsIn, back)
				wall = attrs.Diff(r.AttrsIn, back)
			}
		}
		// Shared lock: a commit archiving the snapshot finishes first (and
		// we take the archived path) or waits for us.
		var snap Snapshot
		if err := tx.Clauses(clause.Locking{Strength: "SHARE"}).Take(&snap, nr.SnapshotID).Error; err != nil {
			return fmt.Errorf("load snapshot %d: %w", nr.SnapshotID, err)
		}
		if snap.State != SnapshotCommitted {
			state := contract.NodeRoleError
			if ok {
				state = contract.NodeRoleActive
			}
			return setState(tx, id, state, map[string]any{"wall": jsonb(wall), "run_count": gorm.Expr("run_count + 1")})
		}
		return finishNodeRole(ctx, tx, nr, ok, wall)
	})
	if err != nil {
		return nil, err
	}
	return s.NodeRole(ctx, id)
}

// attrsRow is a noderole's blobs as read for NodeRoleAttrs.
type attrsRow struct {
	ID         int64
	UserData   string
	SystemData string
	Wall       string
	DrData     *string
}

// contribution is what a noderole adds to the attributes others see: its
// user data under its system data, with its wall (the changes its last run
// made) applied.
func (r attrsRow) contribution() (map[string]any, error) {
	var user, system, wall map[string]any
	for _, f := range []struct {
		raw string
		dst *map[string]any
	}{{r.UserData, &user}, {r.SystemData, &system}, {r.Wall, &wall}} {
		if err := json.Unmarshal([]byte(f.raw), f.dst); err != nil {
			return nil, fmt.Errorf("decode data of noderole %d: %w", r.ID, err)
		}
	}
	return attrs.Apply(attrs.DeepMerge(user, system), wall), nil
}

func (r attrsRow) deploymentData() (map[string]any, error) {
	if r.DrData == nil {
		return nil, nil
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(*r.DrData), &out); err != nil {
		return nil, fmt.Errorf("decode deployment role data of noderole %d: %w", r.ID, err)
	}
	return out, nil
}

// NodeRoleAttrs returns the attributes a run of nr sees, by the seed's
// rule: the active noderoles of committed snapshots on the same node (in
// id order); then the parent noderoles with their deployment roles, one set
// per distance in the graph, most distant first (a noderole reachable at
// several distances counts at the closest; in a set, each parent's
// deployment role data comes just before the parent, parents in id order);
// then nr's own user and system data. A noderole's part is its user data,
// its system data, and its wall applied on top; nr's own wall is left out,
// since its run is about to replace it.
func NodeRoleAttrs(tx *gorm.DB, nr *NodeRole) (map[string]any, error) {
	const blobs = `SELECT nr.id, nr.user_data::text AS user_data, nr.system_data::text AS system_data,
		nr.wall::text AS wall, dr.data::text AS dr_data
		FROM noderoles nr JOIN snapshots s ON s.id = nr.snapshot_id
		LEFT JOIN deployment_roles dr ON dr.deployment_id = s.deployment_id AND dr.role_id = nr.role_id `
	var onNodeRows []attrsRow
	if err := tx.Raw(blobs+`WHERE nr.node_id = ? AND nr.state = ? AND s.state = ? AND nr.id <> ? ORDER BY nr.id`,
		nr.NodeID, contract.NodeRoleActive, SnapshotCommitted, nr.ID).Scan(&onNodeRows).Error; err != nil {
		return nil, fmt.Errorf("load active noderoles of node %s: %w", nr.NodeName, err)
	}
	onNode := make([]map[string]any, 0, len(onNodeRows))
	for _, r := range onNodeRows {
		c, err := r.contribution()
		if err != nil {
			return nil, err
		}
		onNode = append(onNode, c)
	}

	var sets [][]map[string]any
	seen := map[int64]bool{nr.ID: true}
	level := slices.Clone(nr.Parents)
	for len(level) > 0 {
		slices.Sort(level)
		var rows []attrsRow
		if err := tx.Raw(blobs+`WHERE nr.id IN ? ORDER BY nr.id`, level).Scan(&rows).Error; err != nil {
			return nil, fmt.Errorf("load parents of noderole %d: %w", nr.ID, err)
		}
		set := make([]map[string]any, 0, 2*len(rows))
		for _, r := range rows {
			seen[r.ID] = true
			dr, err := r.deploymentData()
			if err != nil {
				return nil, err
			}
			c, err := r.contribution()
			if err != nil {
				return nil, err
			}
			set = append(set, dr, c)
		}
		sets = append(sets, set)
		var up []int64
		if err := tx.Model(&NodeRoleEdge{}).Where("child_id IN ?", level).Distinct().Pluck("parent_id", &up).Error; err != nil {
			return nil, fmt.Errorf("load parents of noderole %d: %w", nr.ID, err)
		}
		level = slices.DeleteFunc(up, func(id int64) bool { return seen[id] })
	}
	slices.Reverse(sets)
	return attrs.Visible(onNode, sets, []map[string]any{nr.UserData, nr.SystemData}), nil
}

// NodeRolesInTransition lists the noderoles in transition, oldest first:
// the annealer checks at its start that each still has a run under way.
func (s *Store) NodeRolesInTransition(ctx context.Context) ([]NodeRole, error) {
	var out []NodeRole
	if err := s.DB.WithContext(ctx).Where("state = ?", contract.NodeRoleTransition).Order("id").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("find noderoles in transition: %w", err)
	}
	if err := decorateNodeRoles(s.DB.WithContext(ctx), out); err != nil {
		return nil, err
	}
	return out, nil
}
