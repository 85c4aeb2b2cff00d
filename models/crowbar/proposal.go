package crowbar

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
)

// RemoveNodeRole removes a binding from a proposed snapshot. Its
// descendants in the snapshot (the noderoles that need it, directly or not)
// go with it when cascade is set; otherwise the removal is refused (409)
// naming them. A committed or archived snapshot refuses (409). It returns
// the removed noderoles, the asked one first, then its descendants in
// creation order.
func (s *Store) RemoveNodeRole(ctx context.Context, id int64, cascade bool) ([]NodeRole, error) {
	var removed []NodeRole
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var nr NodeRole
		err := tx.Take(&nr, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("noderole", id)
		}
		if err != nil {
			return fmt.Errorf("load noderole %d: %w", id, err)
		}
		// The snapshot's row serializes its edits (bind, edit, commit).
		snap, err := lockSnapshot(tx, nr.SnapshotID)
		if err != nil {
			return err
		}
		if snap.State != SnapshotProposed {
			return &models.ConflictError{Reason: fmt.Sprintf("noderole %d is in snapshot %d, which is %s: only a proposed snapshot's bindings can be removed; propose a new snapshot of the deployment (POST /api/v1/deployments/%d/snapshots/propose) and remove it there",
				id, snap.ID, snap.State, snap.DeploymentID)}
		}
		var desc []NodeRole
		if err := tx.Raw(`WITH RECURSIVE d(id) AS (
				SELECT child_id FROM noderole_edges WHERE parent_id = @id
				UNION SELECT e.child_id FROM noderole_edges e JOIN d ON e.parent_id = d.id)
			SELECT n.* FROM noderoles n JOIN d ON d.id = n.id ORDER BY n.id`, map[string]any{"id": id}).Scan(&desc).Error; err != nil {
			return fmt.Errorf("find the descendants of noderole %d: %w", id, err)
		}
		all := append([]NodeRole{nr}, desc...)
		if err := decorateNodeRoles(tx, all); err != nil {
			return err
		}
		var outside, names []string
		for _, d := range all[1:] {
			name := fmt.Sprintf("%s on %s (noderole %d)", d.RoleName, d.NodeName, d.ID)
			names = append(names, name)
			if d.SnapshotID != snap.ID {
				outside = append(outside, fmt.Sprintf("%s, snapshot %d", strings.TrimSuffix(name, ")"), d.SnapshotID)+")")
			}
		}
		if len(outside) > 0 {
			// Never reached through the API (bindings find parents in their
			// own snapshot or committed ones), but a removal must not reach
			// into another snapshot.
			return &models.ConflictError{Reason: fmt.Sprintf("noderole %d (%s on %s) is needed by noderoles of other snapshots: %s",
				id, nr.RoleName, nr.NodeName, strings.Join(outside, "; "))}
		}
		if len(names) > 0 && !cascade {
			return &models.ConflictError{Reason: fmt.Sprintf("noderole %d (%s on %s) is needed by %s; remove them first, or remove it with ?cascade=true to remove them with it",
				id, nr.RoleName, nr.NodeName, strings.Join(names, ", "))}
		}
		ids := make([]int64, len(all))
		for i, d := range all {
			ids[i] = d.ID
		}
		// Edges go with their noderoles (ON DELETE CASCADE).
		if err := tx.Exec(`DELETE FROM noderoles WHERE id IN ? AND snapshot_id = ?`, ids, snap.ID).Error; err != nil {
			return fmt.Errorf("remove noderoles %v from snapshot %d: %w", ids, snap.ID, err)
		}
		removed = all
		return nil
	})
	if err != nil {
		return nil, err
	}
	return removed, nil
}

// DiffItem is one binding of a snapshot diff: a noderole added or removed,
// or present in both with different data.
type DiffItem struct {
	Role string `json:"role"`
	Node string `json:"node"`
	// NodeRole is the binding's id in the diffed snapshot (0 when removed);
	// Committed its id in the committed snapshot (0 when added).
	NodeRole  int64  `json:"noderole,omitempty"`
	Committed int64  `json:"committed_noderole,omitempty"`
	State     string `json:"state,omitempty"`
	// Changes (changed items only) lists each value that differs.
	Changes []DataChange `json:"changes,omitempty"`
}

// DataChange is one value of a binding that differs: in user_data or
// system_data (the path is dotted), or its parents (role@node names).
type DataChange struct {
	Field string `json:"field"`
	Path  string `json:"path,omitempty"`
	// Old and New are absent when the key did not exist on that side.
	Old any `json:"old,omitempty"`
	New any `json:"new,omitempty"`
}

// String is the change as the CLI prints it.
func (c DataChange) String() string {
	f := c.Field
	if c.Path != "" {
		f += "." + c.Path
	}
	return fmt.Sprintf("%s: %s → %s", f, short(c.Old), short(c.New))
}

func short(v any) string {
	if v == nil {
		return "(none)"
	}
	s := fmt.Sprint(v)
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}

// SnapshotDiff is what a snapshot changes against its deployment's
// committed snapshot.
type SnapshotDiff struct {
	Snapshot int64 `json:"snapshot"`
	// Against is the committed snapshot (0 when the deployment has none).
	Against int64      `json:"against"`
	Added   []DiffItem `json:"added"`
	Removed []DiffItem `json:"removed"`
	Changed []DiffItem `json:"changed"`
}

// DiffSnapshot compares a snapshot with its deployment's committed one:
// bindings (role on node) added and removed, and for the bindings in
// both, the user data, system data and parents that differ. Run state and
// results (wall) are not changes an operator proposes, so they are left out.
func (s *Store) DiffSnapshot(ctx context.Context, id int64) (*SnapshotDiff, error) {
	snap, err := s.Snapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	out := &SnapshotDiff{Snapshot: id, Added: []DiffItem{}, Removed: []DiffItem{}, Changed: []DiffItem{}}
	committed, err := snapshotIn(s.DB.WithContext(ctx), snap.DeploymentID, SnapshotCommitted)
	if err != nil {
		return nil, err
	}
	var old []NodeRole
	if committed != nil {
		out.Against = committed.ID
		if committed.ID == id {
			return out, nil
		}
		c, err := s.Snapshot(ctx, committed.ID)
		if err != nil {
			return nil, err
		}
		old = c.NodeRoles
	}
	key := func(nr NodeRole) [2]int64 { return [2]int64{nr.NodeID, nr.RoleID} }
	// Parents are named role@node so that the same binding in both
	// snapshots compares equal whatever its id.
	names := map[int64]string{}
	for _, nr := range append(slices.Clone(old), snap.NodeRoles...) {
		names[nr.ID] = nr.RoleName + "@" + nr.NodeName
	}
	var missing []int64
	for _, nr := range append(slices.Clone(old), snap.NodeRoles...) {
		for _, p := range nr.Parents {
			if _, ok := names[p]; !ok {
				missing = append(missing, p)
			}
		}
	}
	if len(missing) > 0 {
		var ext []NodeRole
		if err := s.DB.WithContext(ctx).Where("id IN ?", missing).Find(&ext).Error; err != nil {
			return nil, fmt.Errorf("load parents of snapshot %d: %w", id, err)
		}
		if err := decorateNodeRoles(s.DB.WithContext(ctx), ext); err != nil {
			return nil, err
		}
		for _, nr := range ext {
			names[nr.ID] = nr.RoleName + "@" + nr.NodeName
		}
	}
	parents := func(nr NodeRole) []string {
		out := []string{}
		for _, p := range nr.Parents {
			out = append(out, names[p])
		}
		sort.Strings(out)
		return out
	}
	before := map[[2]int64]NodeRole{}
	for _, nr := range old {
		before[key(nr)] = nr
	}
	seen := map[[2]int64]bool{}
	for _, nr := range snap.NodeRoles {
		seen[key(nr)] = true
		o, ok := before[key(nr)]
		item := DiffItem{Role: nr.RoleName, Node: nr.NodeName, NodeRole: nr.ID, State: nr.State}
		if !ok {
			out.Added = append(out.Added, item)
			continue
		}
		item.Committed = o.ID
		item.Changes = append(item.Changes, diffData("user_data", "", o.UserData, nr.UserData)...)
		item.Changes = append(item.Changes, diffData("system_data", "", o.SystemData, nr.SystemData)...)
		if op, np := parents(o), parents(nr); !slices.Equal(op, np) {
			item.Changes = append(item.Changes, DataChange{Field: "parents", Old: op, New: np})
		}
		if len(item.Changes) > 0 {
			out.Changed = append(out.Changed, item)
		}
	}
	for _, o := range old {
		if !seen[key(o)] {
			out.Removed = append(out.Removed, DiffItem{Role: o.RoleName, Node: o.NodeName, Committed: o.ID, State: o.State})
		}
	}
	return out, nil
}

// diffData lists the values that differ between two JSON objects, one
// change per leaf (objects are walked; lists and scalars compare whole),
// in key order.
func diffData(field, prefix string, a, b map[string]any) []DataChange {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var out []DataChange
	for _, k := range sorted {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		av, aok := a[k]
		bv, bok := b[k]
		am, aIsMap := av.(map[string]any)
		bm, bIsMap := bv.(map[string]any)
		switch {
		case aok && bok && aIsMap && bIsMap:
			out = append(out, diffData(field, path, am, bm)...)
		case aok && bok && reflect.DeepEqual(av, bv):
		default:
			out = append(out, DataChange{Field: field, Path: path, Old: av, New: bv})
		}
	}
	return out
}
