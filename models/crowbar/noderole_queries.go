package crowbar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// NodeRoleStates lists every state a noderole can be in, in the order of
// its life: what a state filter may ask for.
var NodeRoleStates = []string{contract.NodeRoleProposed, contract.NodeRoleTodo, contract.NodeRoleBlocked, contract.NodeRoleTransition, contract.NodeRoleActive, contract.NodeRoleError}

// NodeRoleFilter narrows Store.NodeRoles; empty fields do not filter.
type NodeRoleFilter struct {
	// Deployment (id or name) keeps the noderoles of the deployment's
	// committed snapshot, or of Snapshot when that is set too.
	Deployment string
	// Snapshot keeps the noderoles of one snapshot, whatever its state (a
	// proposed or archived one too); with Deployment it must be one of that
	// deployment's. Without Deployment or Snapshot the list covers the
	// committed snapshot of every deployment: what the annealer works on.
	Snapshot int64
	// Node (id or name) keeps the noderoles bound to that node.
	Node string
	// Role keeps the noderoles of roles of that name (in any release).
	Role string
	// State is one of NodeRoleStates.
	State string
}

// NodeRoles lists noderoles by id, with their node and role names and
// their edges. A filter naming something that does not exist is bad input
// naming the filter: the list is the resource addressed, not the
// deployment, snapshot, node or role.
func (s *Store) NodeRoles(ctx context.Context, f NodeRoleFilter) ([]NodeRole, error) {
	if f.State != "" && !slices.Contains(NodeRoleStates, f.State) {
		return nil, &models.InputError{Field: "state",
			Reason:  fmt.Sprintf("%q is not a noderole state; valid states: %s", f.State, strings.Join(NodeRoleStates, ", ")),
			Details: map[string]any{"valid": NodeRoleStates}}
	}
	if f.Snapshot < 0 {
		return nil, models.Invalid("snapshot", "%d is not a snapshot id", f.Snapshot)
	}
	out := []NodeRole{}
	// One database transaction, so that a commit landing between finding
	// the committed snapshot and reading its noderoles cannot split the
	// answer across two snapshots.
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		q := tx.Model(&NodeRole{}).Order("id")
		var dep *models.Deployment
		if f.Deployment != "" {
			var err error
			dep, err = models.DeploymentInField(tx, "deployment", f.Deployment)
			if err != nil {
				return err
			}
		}
		switch {
		case f.Snapshot != 0:
			var snaps []Snapshot
			if err := tx.Where("id = ?", f.Snapshot).Limit(1).Find(&snaps).Error; err != nil {
				return fmt.Errorf("load snapshot %d: %w", f.Snapshot, err)
			}
			if len(snaps) == 0 {
				return models.Invalid("snapshot", "no snapshot %d", f.Snapshot)
			}
			if dep != nil && snaps[0].DeploymentID != dep.ID {
				return models.Invalid("snapshot", "snapshot %d belongs to deployment %d, not to %q", f.Snapshot, snaps[0].DeploymentID, dep.Name)
			}
			q = q.Where("snapshot_id = ?", f.Snapshot)
		case dep != nil:
			snap, err := snapshotIn(tx, dep.ID, SnapshotCommitted)
			if err != nil {
				return err
			}
			if snap == nil {
				// Never committed: nothing bound yet. A read does not
				// create the first snapshot (EnsureSnapshot) for it.
				return nil
			}
			q = q.Where("snapshot_id = ?", snap.ID)
		default:
			q = q.Where("snapshot_id IN (SELECT id FROM snapshots WHERE state = ?)", SnapshotCommitted)
		}
		if f.Node != "" {
			node, err := models.TakeRef[models.Node](models.ByRef(tx.Select("id"), f.Node), "node", f.Node)
			if errors.Is(err, models.ErrNotFound) {
				return models.Invalid("node", "no node named or numbered %q", f.Node)
			}
			if err != nil {
				return err
			}
			q = q.Where("node_id = ?", node.ID)
		}
		if f.Role != "" {
			// A name no release defines is a typo, not an empty answer.
			var known int64
			if err := tx.Model(&models.Role{}).Where("name = ?", f.Role).Count(&known).Error; err != nil {
				return fmt.Errorf("check role %s: %w", f.Role, err)
			}
			if known == 0 {
				return models.Invalid("role", "no release defines a role named %q", f.Role)
			}
			q = q.Where("role_id IN (SELECT id FROM roles WHERE name = ?)", f.Role)
		}
		if f.State != "" {
			q = q.Where("state = ?", f.State)
		}
		if err := q.Find(&out).Error; err != nil {
			return fmt.Errorf("list noderoles: %w", err)
		}
		return decorateNodeRoles(tx, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lastNodeRoleRun loads a noderole's newest run (the highest run number),
// or nil when the noderole never ran: it tells an operator what the last
// run saw, handed back, printed and how it ended. A copy made by proposing
// a snapshot has no runs of its own until it runs again: it shows the
// newest run of its role on its node, from the snapshots it came from.
func lastNodeRoleRun(tx *gorm.DB, id int64) (*models.TaskRun, error) {
	var runs []models.TaskRun
	if err := tx.Where("noderole_id = ?", id).Order("position DESC").Limit(1).Find(&runs).Error; err != nil {
		return nil, fmt.Errorf("load the last run of noderole %d: %w", id, err)
	}
	if len(runs) == 0 {
		if err := tx.Raw(`SELECT t.* FROM task_runs t
			JOIN noderoles o ON o.id = t.noderole_id
			JOIN noderoles n ON n.id = ? AND o.node_id = n.node_id AND o.role_id = n.role_id AND n.run_count > 0
			ORDER BY t.id DESC LIMIT 1`, id).Scan(&runs).Error; err != nil {
			return nil, fmt.Errorf("load the last run of noderole %d: %w", id, err)
		}
	}
	if len(runs) == 0 {
		return nil, nil
	}
	return &runs[0], nil
}

// NodeRoleCounts counts the noderoles of a deployment's committed snapshot
// by state, every state present (0 when none), so that an operator sees
// how far the annealer has come.
func (s *Store) NodeRoleCounts(ctx context.Context, deploymentID int64) (map[string]int, error) {
	var rows []struct {
		State string
		N     int
	}
	err := s.DB.WithContext(ctx).Raw(`SELECT nr.state, count(*) AS n FROM noderoles nr
		JOIN snapshots s ON s.id = nr.snapshot_id AND s.state = ? AND s.deployment_id = ?
		GROUP BY nr.state`, SnapshotCommitted, deploymentID).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("count noderoles of deployment %d: %w", deploymentID, err)
	}
	out := make(map[string]int, len(NodeRoleStates))
	for _, st := range NodeRoleStates {
		out[st] = 0
	}
	for _, r := range rows {
		out[r.State] = r.N
	}
	return out, nil
}
