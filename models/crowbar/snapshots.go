package crowbar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
)

// Snapshot states: a deployment has one linear history of snapshots, at most
// one proposed (editable, ignored by the annealer) and one committed (read
// only, run by the annealer); the others are archived.
const (
	SnapshotProposed  = "proposed"
	SnapshotCommitted = "committed"
	SnapshotArchived  = "archived"
)

// Snapshot is one step of a deployment's history of noderole bindings.
type Snapshot struct {
	ID           int64      `json:"id"`
	DeploymentID int64      `json:"deployment_id"`
	State        string     `json:"state"`
	CreatedAt    time.Time  `json:"created_at"`
	CommittedAt  *time.Time `json:"committed_at"`
	ArchivedAt   *time.Time `json:"archived_at"`
	// NodeRoles is filled by Store.Snapshot only.
	NodeRoles []NodeRole `json:"noderoles,omitempty" gorm:"-"`
	// MovedNodes, filled by CommitSnapshot, names the nodes the commit
	// moved into the deployment.
	MovedNodes []string `json:"moved_nodes,omitempty" gorm:"-"`
}

// DeploymentRole holds a deployment's defaults for a role, seeded from the
// role's template; noderoles' user data is seeded from it.
type DeploymentRole struct {
	ID           int64          `json:"id"`
	DeploymentID int64          `json:"deployment_id"`
	RoleID       int64          `json:"role_id"`
	Data         map[string]any `json:"data" gorm:"serializer:json"`
	CreatedAt    time.Time      `json:"created_at"`
	UpdatedAt    time.Time      `json:"updated_at"`
}

// lockSnapshot loads a snapshot and locks its row for the transaction.
func lockSnapshot(tx *gorm.DB, id int64) (*Snapshot, error) {
	var snap Snapshot
	err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&snap, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("snapshot", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load snapshot %d: %w", id, err)
	}
	return &snap, nil
}

// lockDeployment locks a deployment's row for the transaction: changes of
// its snapshot history take it first.
func lockDeployment(tx *gorm.DB, id int64) error {
	if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Select("id").Take(&models.Deployment{}, id).Error; err != nil {
		return fmt.Errorf("lock deployment %d: %w", id, err)
	}
	return nil
}

// snapshotIn returns the deployment's snapshot in state, or nil.
func snapshotIn(tx *gorm.DB, deploymentID int64, state string) (*Snapshot, error) {
	var snaps []Snapshot
	if err := tx.Where("deployment_id = ? AND state = ?", deploymentID, state).Limit(1).Find(&snaps).Error; err != nil {
		return nil, fmt.Errorf("load %s snapshot of deployment %d: %w", state, deploymentID, err)
	}
	if len(snaps) == 0 {
		return nil, nil
	}
	return &snaps[0], nil
}

// EnsureSnapshot returns the deployment's committed snapshot, creating an
// empty one if the deployment never had one (deployments created after the
// migration start without). It runs inside the caller's transaction.
func EnsureSnapshot(tx *gorm.DB, deploymentID int64) (*Snapshot, error) {
	snap, err := snapshotIn(tx, deploymentID, SnapshotCommitted)
	if err != nil || snap != nil {
		return snap, err
	}
	t := models.Now()
	snap = &Snapshot{DeploymentID: deploymentID, State: SnapshotCommitted, CreatedAt: t, CommittedAt: &t}
	// Two requests racing here: the partial unique index lets one win; the
	// other reads the winner's row.
	res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(snap)
	if res.Error != nil {
		return nil, fmt.Errorf("create the first snapshot of deployment %d: %w", deploymentID, res.Error)
	}
	if res.RowsAffected == 0 {
		return snapshotIn(tx, deploymentID, SnapshotCommitted)
	}
	return snap, nil
}

// EnsureSnapshot is the Store form of the function of the same name.
func (s *Store) EnsureSnapshot(ctx context.Context, deploymentRef string) (*Snapshot, error) {
	var out *Snapshot
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := models.FindDeployment(tx, deploymentRef)
		if err != nil {
			return err
		}
		out, err = EnsureSnapshot(tx, dep.ID)
		return err
	})
	return out, err
}

// Snapshots lists a deployment's history, oldest first.
func (s *Store) Snapshots(ctx context.Context, deploymentRef string) ([]Snapshot, error) {
	var out []Snapshot
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := models.FindDeployment(tx, deploymentRef)
		if err != nil {
			return err
		}
		if _, err := EnsureSnapshot(tx, dep.ID); err != nil {
			return err
		}
		if err := tx.Where("deployment_id = ?", dep.ID).Order("id").Find(&out).Error; err != nil {
			return fmt.Errorf("list snapshots of deployment %s: %w", dep.Name, err)
		}
		return nil
	})
	return out, err
}

// Snapshot loads a snapshot with its noderoles (with their edges, node and
// role names), in creation order.
func (s *Store) Snapshot(ctx context.Context, id int64) (*Snapshot, error) {
	db := s.DB.WithContext(ctx)
	var snap Snapshot
	err := db.Take(&snap, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("snapshot", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load snapshot %d: %w", id, err)
	}
	var nrs []NodeRole
	if err := db.Where("snapshot_id = ?", id).Order("id").Find(&nrs).Error; err != nil {
		return nil, fmt.Errorf("load noderoles of snapshot %d: %w", id, err)
	}
	if err := decorateNodeRoles(db, nrs); err != nil {
		return nil, err
	}
	snap.NodeRoles = nrs
	return &snap, nil
}

// ProposeSnapshot starts a proposed snapshot of the deployment as a copy of
// its committed one: the noderoles with their state and data, and their
// edges (edges to parents in ancestor deployments are kept as they are).
func (s *Store) ProposeSnapshot(ctx context.Context, deploymentRef string) (*Snapshot, error) {
	var out *Snapshot
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := models.FindDeployment(tx, deploymentRef)
		if err != nil {
			return err
		}
		// The deployment's row serializes its snapshot history: a commit or
		// a node bootstrap racing with us waits.
		if err := lockDeployment(tx, dep.ID); err != nil {
			return err
		}
		committed, err := EnsureSnapshot(tx, dep.ID)
		if err != nil {
			return err
		}
		if prop, err := snapshotIn(tx, dep.ID, SnapshotProposed); err != nil {
			return err
		} else if prop != nil {
			return &models.ConflictError{Reason: fmt.Sprintf("deployment %q already has a proposed snapshot (%d); edit or commit it", dep.Name, prop.ID)}
		}
		snap := &Snapshot{DeploymentID: dep.ID, State: SnapshotProposed, CreatedAt: models.Now()}
		if err := tx.Create(snap).Error; err != nil {
			return fmt.Errorf("propose a snapshot of deployment %s: %w",
				dep.Name, models.UniqueViolation(err, fmt.Sprintf("deployment %q already has a proposed snapshot", dep.Name)))
		}
		if err := tx.Exec(`INSERT INTO noderoles (snapshot_id, node_id, role_id, state, user_data, system_data, wall, run_count, created_at, updated_at)
			SELECT ?, node_id, role_id, state, user_data, system_data, wall, run_count, now(), now()
			FROM noderoles WHERE snapshot_id = ? ORDER BY id`, snap.ID, committed.ID).Error; err != nil {
			return fmt.Errorf("copy noderoles of snapshot %d: %w", committed.ID, err)
		}
		if err := tx.Exec(`INSERT INTO noderole_edges (parent_id, child_id)
			SELECT COALESCE(np.id, e.parent_id), nc.id
			FROM noderole_edges e
			JOIN noderoles oc ON oc.id = e.child_id AND oc.snapshot_id = @old
			JOIN noderoles nc ON nc.snapshot_id = @new AND nc.node_id = oc.node_id AND nc.role_id = oc.role_id
			LEFT JOIN noderoles op ON op.id = e.parent_id AND op.snapshot_id = @old
			LEFT JOIN noderoles np ON np.snapshot_id = @new AND np.node_id = op.node_id AND np.role_id = op.role_id
			ON CONFLICT DO NOTHING`,
			map[string]any{"old": committed.ID, "new": snap.ID}).Error; err != nil {
			return fmt.Errorf("copy noderole edges of snapshot %d: %w", committed.ID, err)
		}
		out = snap
		return nil
	})
	return out, err
}

// CommitSnapshot commits a proposed snapshot: the deployment's committed one
// is archived, edges of other deployments' noderoles that pointed into the
// archived snapshot follow to the same binding in the new one, and the
// noderoles that still have to run go todo (no parents, or all parents
// active) or blocked. Active and errored noderoles keep their state.
func (s *Store) CommitSnapshot(ctx context.Context, id int64) (*Snapshot, error) {
	var out *Snapshot
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var depID []int64
		if err := tx.Model(&Snapshot{}).Where("id = ?", id).Pluck("deployment_id", &depID).Error; err != nil {
			return fmt.Errorf("load snapshot %d: %w", id, err)
		}
		if len(depID) == 0 {
			return models.NotFound("snapshot", id)
		}
		// Deployment first, then snapshots: the order every change of a
		// deployment's history takes (propose, node bootstrap).
		if err := lockDeployment(tx, depID[0]); err != nil {
			return err
		}
		snap, err := lockSnapshot(tx, id)
		if err != nil {
			return err
		}
		if snap.State != SnapshotProposed {
			return &models.ConflictError{Reason: fmt.Sprintf("snapshot %d is %s; only a proposed snapshot can be committed", id, snap.State)}
		}
		old, err := snapshotIn(tx, snap.DeploymentID, SnapshotCommitted)
		if err != nil {
			return err
		}
		t := models.Now()
		if old != nil {
			if _, err := lockSnapshot(tx, old.ID); err != nil {
				return err
			}
			if err := tx.Model(&Snapshot{}).Where("id = ?", old.ID).
				Updates(map[string]any{"state": SnapshotArchived, "archived_at": t}).Error; err != nil {
				return fmt.Errorf("archive snapshot %d: %w", old.ID, err)
			}
		}
		if err := tx.Model(&Snapshot{}).Where("id = ?", id).
			Updates(map[string]any{"state": SnapshotCommitted, "committed_at": t}).Error; err != nil {
			return fmt.Errorf("commit snapshot %d: %w", id, err)
		}
		if old != nil {
			// A binding copied when the snapshot was proposed, unedited since,
			// whose original ran to active meanwhile, takes over that
			// result instead of running again.
			if err := tx.Exec(`UPDATE noderoles n SET state = o.state, wall = o.wall, system_data = o.system_data,
					run_count = o.run_count, updated_at = now()
				FROM noderoles o
				WHERE n.snapshot_id = @new AND o.snapshot_id = @old AND o.node_id = n.node_id AND o.role_id = n.role_id
				  AND o.state = 'active' AND n.state <> 'active' AND n.user_data = o.user_data`,
				map[string]any{"old": old.ID, "new": id}).Error; err != nil {
				return fmt.Errorf("carry results over to snapshot %d: %w", id, err)
			}
			if err := tx.Exec(`UPDATE noderole_edges e SET parent_id = np.id
				FROM noderoles op, noderoles np, noderoles c
				WHERE op.id = e.parent_id AND op.snapshot_id = @old
				  AND np.snapshot_id = @new AND np.node_id = op.node_id AND np.role_id = op.role_id
				  AND c.id = e.child_id AND c.snapshot_id NOT IN (@old, @new)
				  AND NOT EXISTS (SELECT 1 FROM noderole_edges x WHERE x.parent_id = np.id AND x.child_id = e.child_id)`,
				map[string]any{"old": old.ID, "new": id}).Error; err != nil {
				return fmt.Errorf("move edges to snapshot %d: %w", id, err)
			}
		}
		moved, err := moveBoundNodes(tx, snap)
		if err != nil {
			return err
		}
		scheduled, err := schedule(tx, "n.snapshot_id = ? AND n.state IN ('proposed', 'todo', 'blocked', 'transition')", id)
		if err != nil {
			return fmt.Errorf("schedule noderoles of snapshot %d: %w", id, err)
		}
		if err := announce(ctx, tx, scheduled...); err != nil {
			return err
		}
		snap.State, snap.CommittedAt, snap.MovedNodes = SnapshotCommitted, &t, moved
		out = snap
		return nil
	})
	return out, err
}

// moveBoundNodes moves the nodes bound in a snapshot being committed that
// still belong to a parent deployment (discovered nodes in system) into
// the snapshot's deployment, and returns their names. A bound node that
// meanwhile went to a deployment off the chain stops the commit.
func moveBoundNodes(tx *gorm.DB, snap *Snapshot) ([]string, error) {
	var dep models.Deployment
	if err := tx.Take(&dep, snap.DeploymentID).Error; err != nil {
		return nil, fmt.Errorf("load deployment %d: %w", snap.DeploymentID, err)
	}
	chain, err := deploymentChain(tx, &dep)
	if err != nil {
		return nil, err
	}
	ancestors := []int64{0}
	for _, d := range chain[1:] {
		ancestors = append(ancestors, d.ID)
	}
	var lost []string
	if err := tx.Raw(`SELECT name FROM nodes WHERE id IN (SELECT node_id FROM noderoles WHERE snapshot_id = ?)
		AND deployment_id <> ? AND deployment_id NOT IN ? ORDER BY name`, snap.ID, dep.ID, ancestors).Scan(&lost).Error; err != nil {
		return nil, fmt.Errorf("check nodes of snapshot %d: %w", snap.ID, err)
	}
	if len(lost) > 0 {
		return nil, &models.ConflictError{Reason: fmt.Sprintf("nodes %s are bound in snapshot %d but now belong to a deployment outside %q and its parents; remove their noderoles or move them back",
			strings.Join(lost, ", "), snap.ID, dep.Name)}
	}
	var moved []string
	if err := tx.Raw(`UPDATE nodes SET deployment_id = ?, updated_at = now()
		WHERE id IN (SELECT node_id FROM noderoles WHERE snapshot_id = ?) AND deployment_id IN ?
		RETURNING name`, dep.ID, snap.ID, ancestors).Scan(&moved).Error; err != nil {
		return nil, fmt.Errorf("move nodes into deployment %s: %w", dep.Name, err)
	}
	slices.Sort(moved)
	return moved, nil
}

// requireProposed refuses edits to a snapshot that is not proposed.
func requireProposed(snap *Snapshot) error {
	if snap.State != SnapshotProposed {
		return &models.ConflictError{Reason: fmt.Sprintf("snapshot %d is %s and cannot be edited; propose a new snapshot of the deployment (POST /api/v1/deployments/%s/snapshots/propose) and edit that",
			snap.ID, snap.State, strconv.FormatInt(snap.DeploymentID, 10))}
	}
	return nil
}

// ProposedSnapshot returns the deployment's proposed snapshot, or a 409
// saying to propose one when it has none.
func (s *Store) ProposedSnapshot(ctx context.Context, deploymentRef string) (*Snapshot, error) {
	db := s.DB.WithContext(ctx)
	dep, err := models.FindDeployment(db, deploymentRef)
	if err != nil {
		return nil, err
	}
	snap, err := snapshotIn(db, dep.ID, SnapshotProposed)
	if err != nil {
		return nil, err
	}
	if snap == nil {
		return nil, &models.ConflictError{Reason: fmt.Sprintf("deployment %q has no proposed snapshot; propose one first (POST /api/v1/deployments/%s/snapshots/propose)", dep.Name, dep.Name)}
	}
	return snap, nil
}
