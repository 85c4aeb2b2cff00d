package crowbar

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// BootstrapNode gives a freshly created node its default roles, as Crowbar
// does: the bootstrap roles for an admin node, the discovery roles (whose
// jig is active) for the others, sorted in dependency order and bound to
// the node in the system deployment's committed snapshot, which is then
// recommitted (the new noderoles go todo or blocked) so that the annealer
// takes over; a proposed snapshot of system gets the same bindings, so that
// committing it keeps them. on_node_create hooks run last. It is
// idempotent: bindings that exist are kept.
func (s *Store) BootstrapNode(ctx context.Context, nodeID int64) (*contract.BootstrapResult, error) {
	var out *contract.BootstrapResult
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, _, err := models.LockNode(tx, strconv.FormatInt(nodeID, 10))
		if err != nil {
			return err
		}
		system, err := models.FindDeployment(tx, models.SystemDeployment)
		if err != nil {
			return err
		}
		// As a commit of system does: deployment, then its snapshots, so
		// that the committed snapshot read here is still the committed one.
		if err := lockDeployment(tx, system.ID); err != nil {
			return err
		}
		snap, err := EnsureSnapshot(tx, system.ID)
		if err != nil {
			return err
		}
		if _, err := lockSnapshot(tx, snap.ID); err != nil {
			return err
		}
		out = &contract.BootstrapResult{Node: node.Name, Flag: models.FlagDiscovery, NodeRoles: []int64{}, Roles: []string{}}
		if node.Admin {
			out.Flag = models.FlagBootstrap
		}
		roles, err := flaggedRoles(tx, system, out.Flag)
		if err != nil {
			return err
		}
		b := &binder{ctx: ctx, tx: tx, snap: snap, chain: []models.Deployment{*system}, node: node}
		for _, role := range roles {
			if out.Flag == models.FlagDiscovery && !JigActive(role.Jig) {
				continue
			}
			nr, _, err := b.add(&role, nil)
			if err != nil {
				return fmt.Errorf("bind %s role %s to node %s: %w", out.Flag, role.Name, node.Name, err)
			}
			out.NodeRoles = append(out.NodeRoles, nr.ID)
			out.Roles = append(out.Roles, role.Name)
		}
		// The recommit: what was just bound (and any implicit parents)
		// leaves proposed.
		// A proposal of system under way would archive these bindings when
		// committed: it gets them too, still proposed.
		prop, err := snapshotIn(tx, system.ID, SnapshotProposed)
		if err != nil {
			return err
		}
		if prop != nil {
			pb := &binder{ctx: ctx, tx: tx, snap: prop, chain: []models.Deployment{*system}, node: node}
			for _, name := range out.Roles {
				role := roles[slices.IndexFunc(roles, func(r models.Role) bool { return r.Name == name })]
				if _, _, err := pb.add(&role, nil); err != nil {
					return fmt.Errorf("bind %s role %s to node %s in proposed snapshot %d: %w", out.Flag, role.Name, node.Name, prop.ID, err)
				}
			}
		}
		scheduled, err := schedule(tx, "n.snapshot_id = ? AND n.node_id = ? AND n.state = 'proposed'", snap.ID, node.ID)
		if err != nil {
			return fmt.Errorf("recommit snapshot %d for node %s: %w", snap.ID, node.Name, err)
		}
		if err := announce(ctx, tx, scheduled...); err != nil {
			return err
		}
		// Crowbar calls on_node_create once the default noderoles are bound.
		return models.RunNodeHooks(ctx, tx, models.OnNodeCreate, node)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// flaggedRoles returns the roles carrying flag that apply to the system
// deployment, in dependency order (parents first, otherwise by name): those
// of its release, or with no release there, of every release, the newest
// release winning for a name defined in several.
func flaggedRoles(tx *gorm.DB, system *models.Deployment, flag string) ([]models.Role, error) {
	q := tx.Where("flags @> ?::jsonb", `["`+flag+`"]`)
	if system.ReleaseID != nil {
		q = q.Where("release_id = ?", *system.ReleaseID)
	}
	var all []models.Role
	if err := q.Order("release_id DESC, name").Find(&all).Error; err != nil {
		return nil, fmt.Errorf("load %s roles: %w", flag, err)
	}
	byName := map[string]models.Role{}
	for _, r := range all {
		if _, ok := byName[r.Name]; !ok {
			byName[r.Name] = r
		}
	}
	return dependencyOrder(byName), nil
}

// dependencyOrder sorts roles so that each comes after the roles of the
// set it requires (requirements outside the set are the binder's business);
// among roles that are ready at once, by name. Role requirements are
// acyclic (checked at import).
func dependencyOrder(roles map[string]models.Role) []models.Role {
	names := make([]string, 0, len(roles))
	for n := range roles {
		names = append(names, n)
	}
	slices.Sort(names)
	done := map[string]bool{}
	out := make([]models.Role, 0, len(roles))
	for len(out) < len(roles) {
		progressed := false
		for _, n := range names {
			if done[n] {
				continue
			}
			ready := !slices.ContainsFunc(roles[n].Requires, func(req string) bool {
				_, inSet := roles[req]
				return inSet && !done[req]
			})
			if ready {
				done[n] = true
				out = append(out, roles[n])
				progressed = true
				break // restart: keep name order among the ready ones
			}
		}
		if !progressed {
			break // a cycle: cannot happen after import, but never loop forever
		}
	}
	return out
}
