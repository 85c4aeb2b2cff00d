package models

import (
	"context"
	"fmt"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DeleteDeployment deletes an empty deployment: one without nodes, child
// deployments, deployables or unfinished transactions. Its finished
// transactions (with their runs), graphs, tags, snapshots and role data go
// with it. Anything in it is a ConflictError naming it and what to do.
func (s *Store) DeleteDeployment(ctx context.Context, ref string) (*Deployment, error) {
	var dep *Deployment
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		dep, err = TakeRef[Deployment](ByRef(tx.Clauses(clause.Locking{Strength: "UPDATE"}), ref), "deployment", ref)
		if err != nil {
			return err
		}
		if dep.Name == SystemDeployment {
			return &ConflictError{Reason: "the system deployment holds every discovered node and cannot be deleted"}
		}
		var in []string
		count := func(what, query string, args ...any) error {
			var names []string
			if err := tx.Raw(query, args...).Scan(&names).Error; err != nil {
				return fmt.Errorf("look into deployment %s: %w", dep.Name, err)
			}
			if len(names) > 0 {
				in = append(in, fmt.Sprintf("%d %s (%s)", len(names), what, abbreviate(names, 5)))
			}
			return nil
		}
		// The transactions table is Fuel's and deployables Audrey's: the
		// kernel reads them by name only to say what holds a deployment.
		if err := count("node(s)", "SELECT name FROM nodes WHERE deployment_id = ? ORDER BY name", dep.ID); err != nil {
			return err
		}
		if err := count("child deployment(s)", "SELECT name FROM deployments WHERE parent_id = ? ORDER BY name", dep.ID); err != nil {
			return err
		}
		if err := count("deployable(s)", "SELECT name FROM deployables WHERE deployment_id = ? ORDER BY name", dep.ID); err != nil {
			return err
		}
		if err := count("unfinished transaction(s)", "SELECT id::text FROM transactions WHERE deployment_id = ? AND status IN (?, ?) ORDER BY created_at", dep.ID, TxPending, TxRunning); err != nil {
			return err
		}
		if len(in) > 0 {
			return &ConflictError{Reason: fmt.Sprintf("deployment %s is not empty: it holds %s; move or delete the nodes (PATCH or DELETE /api/v1/nodes/:id), "+
				"delete the child deployments and deployables, and wait for (or stop) its transactions, then delete it", dep.Name, strings.Join(in, ", "))}
		}
		for _, q := range []string{
			"DELETE FROM transactions WHERE deployment_id = ?", // runs and edges cascade
			"DELETE FROM graphs WHERE owner_kind = 'deployment' AND owner_id = ?",
			"DELETE FROM tags WHERE owner_kind = 'deployment' AND owner_id = ?",
			"DELETE FROM deployments WHERE id = ?", // snapshots, plugins, role data cascade
		} {
			if err := tx.Exec(q, dep.ID).Error; err != nil {
				return fmt.Errorf("delete deployment %s: %w", dep.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dep, nil
}

// Releases lists one page of releases, newest first (keyset on id), without
// their roles.
func (s *Store) Releases(ctx context.Context, page Page) (rels []Release, next string, err error) {
	limit := page.PageLimit()
	q := s.DB.WithContext(ctx).Order("id DESC").Limit(limit + 1)
	if page.Cursor != "" {
		var after int64
		if err := DecodeCursor(page.Cursor, &after); err != nil {
			return nil, "", err
		}
		q = q.Where("id < ?", after)
	}
	if err := q.Find(&rels).Error; err != nil {
		return nil, "", fmt.Errorf("list releases: %w", err)
	}
	if len(rels) > limit {
		rels = rels[:limit]
		next = EncodeCursor(rels[limit-1].ID)
	}
	return rels, next, nil
}

// DeleteRelease deletes a release nothing uses: no deployment is of it and
// none of its roles is bound in a snapshot. Its roles, graphs and tags go
// with it. A release in use is a ConflictError naming its users.
func (s *Store) DeleteRelease(ctx context.Context, ref string) (*Release, error) {
	var rel *Release
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		rel, err = TakeRef[Release](ByVersionedRef(tx.Clauses(clause.Locking{Strength: "UPDATE"}), ref), "release", ref)
		if err != nil {
			return err
		}
		var deps []string
		if err := tx.Raw("SELECT name FROM deployments WHERE release_id = ? ORDER BY name", rel.ID).Scan(&deps).Error; err != nil {
			return fmt.Errorf("find the users of release %s: %w", rel.Name, err)
		}
		if len(deps) > 0 {
			return &ConflictError{Reason: fmt.Sprintf("release %s@%s is used by deployment(s) %s; delete them (or they must be empty first), then the release",
				rel.Name, rel.Version, abbreviate(deps, 10))}
		}
		// Crowbar binds roles into snapshots of any deployment (the system
		// deployment's node-base, say): those bindings use the release too.
		var bound []string
		err = tx.Raw(`SELECT DISTINCT r.name || ' in deployment ' || d.name FROM noderoles nr
			JOIN roles r ON r.id = nr.role_id JOIN snapshots sn ON sn.id = nr.snapshot_id
			JOIN deployments d ON d.id = sn.deployment_id WHERE r.release_id = ? AND sn.state <> 'archived' ORDER BY 1`, rel.ID).Scan(&bound).Error
		if err != nil {
			return fmt.Errorf("find the bindings of release %s: %w", rel.Name, err)
		}
		if len(bound) > 0 {
			return &ConflictError{Reason: fmt.Sprintf("release %s@%s has roles bound to nodes: %s; unbind them (a snapshot without them, committed), then delete the release",
				rel.Name, rel.Version, abbreviate(bound, 10))}
		}
		for _, q := range []string{
			"DELETE FROM graphs WHERE owner_kind = 'release' AND owner_id = ?",
			"DELETE FROM tags WHERE owner_kind = 'release' AND owner_id = ?",
			"DELETE FROM releases WHERE id = ?", // roles cascade
		} {
			if err := tx.Exec(q, rel.ID).Error; err != nil {
				return fmt.Errorf("delete release %s: %w", rel.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rel, nil
}

// abbreviate joins up to n names and says how many more there are.
func abbreviate(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
