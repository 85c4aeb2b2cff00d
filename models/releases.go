package models

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models/plan"
)

// ReleaseSpec is a release as imported from YAML or JSON, in Fuel's shape.
type ReleaseSpec struct {
	Name          string                 `json:"name" yaml:"name"`
	Version       string                 `json:"version" yaml:"version"`
	RolesMetadata map[string]RoleSpec    `json:"roles_metadata" yaml:"roles_metadata"`
	TagsMetadata  map[string]TagMetadata `json:"tags_metadata" yaml:"tags_metadata"`
	Graphs        map[string]GraphSpec   `json:"graphs" yaml:"graphs"`
}

// RoleSpec is one role of a release.
type RoleSpec struct {
	Name     string         `json:"name" yaml:"name"`
	Jig      string         `json:"jig" yaml:"jig"`
	Requires []string       `json:"requires" yaml:"requires"`
	Tags     []string       `json:"tags" yaml:"tags"`
	Flags    []string       `json:"flags" yaml:"flags"`
	Template map[string]any `json:"template" yaml:"template"`
	// Script runs the role as one task when no task of the release's
	// deployment graph selects the role (Crowbar style).
	Script string `json:"script" yaml:"script"`
}

// GraphSpec is one graph as imported.
type GraphSpec struct {
	Name     string         `json:"name" yaml:"name"`
	Metadata map[string]any `json:"metadata" yaml:"metadata"`
	Tasks    []plan.Task    `json:"tasks" yaml:"tasks"`
}

func FindRelease(tx *gorm.DB, ref string) (*Release, error) {
	return TakeRef[Release](ByVersionedRef(tx, ref), "release", ref)
}

// Release finds a release by id, name@version or name (newest).
func (s *Store) Release(ctx context.Context, ref string) (*Release, error) {
	rel, err := FindRelease(s.DB.WithContext(ctx), ref)
	if err != nil {
		return nil, err
	}
	if err := s.DB.WithContext(ctx).Where("release_id = ?", rel.ID).Order("name").Find(&rel.Roles).Error; err != nil {
		return nil, fmt.Errorf("load roles of release %s: %w", ref, err)
	}
	return rel, nil
}

// ImportedRelease is a release as an import stored it, with the warnings
// about its spec that did not stop the import (redundant requirements).
// Its JSON is the release's own fields plus "warnings".
type ImportedRelease struct {
	*Release
	// Warnings is never nil, so the API answers "warnings": [] rather
	// than leaving clients to tell an absent field from an empty one.
	Warnings []string `json:"warnings"`
}

// ImportRelease validates a release and stores it; see
// ImportReleaseWithWarnings, whose warnings it drops.
func (s *Store) ImportRelease(ctx context.Context, spec ReleaseSpec) (*Release, error) {
	out, err := s.ImportReleaseWithWarnings(ctx, spec)
	if err != nil {
		return nil, err
	}
	return out.Release, nil
}

// ImportReleaseWithWarnings validates a release and stores it. Re-importing
// an existing release (same name and version) updates its roles in place,
// keeping their ids so that noderoles and deployment roles bound to them
// survive; it replaces the release's graphs. A role the new spec no longer
// has is deleted, unless it is still bound to a node in any snapshot: then
// nothing is written and the answer is a ConflictError. Redundant
// requirements (see RedundantRequirements) are allowed and reported.
func (s *Store) ImportReleaseWithWarnings(ctx context.Context, spec ReleaseSpec) (*ImportedRelease, error) {
	if err := validateReleaseSpec(spec); err != nil {
		return nil, err
	}
	roleNames := slices.Sorted(maps.Keys(spec.RolesMetadata))
	requires := make(map[string][]string, len(roleNames))
	for _, name := range roleNames {
		for i, req := range spec.RolesMetadata[name].Requires {
			if _, ok := spec.RolesMetadata[req]; !ok {
				return nil, Invalid(fmt.Sprintf("roles_metadata.%s.requires[%d]", name, i), "unknown role %q", req)
			}
		}
		for i, flag := range spec.RolesMetadata[name].Flags {
			if !slices.Contains(RoleFlags, flag) {
				return nil, Invalid(fmt.Sprintf("roles_metadata.%s.flags[%d]", name, i), "unknown flag %q (known: %s)", flag, strings.Join(RoleFlags, ", "))
			}
		}
		requires[name] = spec.RolesMetadata[name].Requires
	}
	if cycle := roleCycle(spec.RolesMetadata, roleNames); cycle != nil {
		return nil, &InputError{Field: "roles_metadata", Reason: "role requirements form a cycle: " + strings.Join(cycle, " -> "),
			Details: map[string]any{"cycle": cycle}}
	}
	for _, sec := range releaseSections() {
		if err := sec.Validate(spec); err != nil {
			return nil, err
		}
	}
	ref := spec.Name + "@" + spec.Version
	var rel Release
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// The lock serialises two imports of one release, so that neither
		// sees roles the other is about to delete.
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
			Where("name = ? AND version = ?", spec.Name, spec.Version).Take(&rel).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			rel = Release{Name: spec.Name, Version: spec.Version}
		case err != nil:
			return fmt.Errorf("import release %s: load release: %w", ref, err)
		}
		if rel.ID != 0 {
			// Checked before anything is written: a removed role that is
			// still bound refuses the import.
			if err := checkRemovedRoles(tx, &rel, spec); err != nil {
				return err
			}
		}
		rel.TagsMetadata = spec.TagsMetadata
		if rel.TagsMetadata == nil {
			rel.TagsMetadata = map[string]TagMetadata{}
		}
		rel.UpdatedAt = Now()
		if err := tx.Save(&rel).Error; err != nil {
			// Two first imports of one release race on UNIQUE (name, version).
			err = UniqueViolation(err, fmt.Sprintf("release %s is being imported concurrently; retry", ref))
			return fmt.Errorf("import release %s: save release: %w", ref, err)
		}
		if err := upsertRoles(tx, &rel, spec, roleNames); err != nil {
			return fmt.Errorf("import release %s: %w", ref, err)
		}
		for _, sec := range releaseSections() {
			if err := sec.Save(tx, &rel, spec); err != nil {
				return fmt.Errorf("import release %s: %s: %w", ref, sec.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &ImportedRelease{Release: &rel, Warnings: NonNil(RedundantRequirements(requires))}, nil
}

// checkRemovedRoles refuses, with a ConflictError, a re-import of rel that
// drops roles still bound to nodes: deleting a role cascades to its
// noderoles, which would silently unbind it everywhere. Only proposed and
// committed snapshots count: archived ones are history, and their
// bindings of the dropped role go with it (otherwise a role once bound
// could never be dropped). The removed roles are locked first, so a
// concurrent BindRole either commits before the check (and is seen) or
// waits and then fails on the deleted role.
func checkRemovedRoles(tx *gorm.DB, rel *Release, spec ReleaseSpec) error {
	var existing []Role
	if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
		Where("release_id = ?", rel.ID).Order("name").Find(&existing).Error; err != nil {
		return fmt.Errorf("import release %s@%s: load roles: %w", rel.Name, rel.Version, err)
	}
	var removed []int64
	for _, r := range existing {
		if _, ok := spec.RolesMetadata[r.Name]; !ok {
			removed = append(removed, r.ID)
		}
	}
	if len(removed) == 0 {
		return nil
	}
	var bound []struct{ Role, Node string }
	err := tx.Raw(`SELECT DISTINCT r.name AS role, n.name AS node
		FROM noderoles nr JOIN roles r ON r.id = nr.role_id JOIN nodes n ON n.id = nr.node_id
		JOIN snapshots s ON s.id = nr.snapshot_id AND s.state IN ('proposed', 'committed')
		WHERE nr.role_id IN ? ORDER BY r.name, n.name`, removed).Scan(&bound).Error
	if err != nil {
		return fmt.Errorf("import release %s@%s: find bindings of removed roles: %w", rel.Name, rel.Version, err)
	}
	if len(bound) == 0 {
		return nil
	}
	var parts []string
	for i := 0; i < len(bound); {
		j := i
		var nodes []string
		for ; j < len(bound) && bound[j].Role == bound[i].Role; j++ {
			nodes = append(nodes, bound[j].Node)
		}
		parts = append(parts, fmt.Sprintf("%q (on %s)", bound[i].Role, strings.Join(nodes, ", ")))
		i = j
	}
	return &ConflictError{Reason: fmt.Sprintf(
		"release %s@%s: the new spec drops roles that are still bound to nodes: %s; unbind them first",
		rel.Name, rel.Version, strings.Join(parts, "; "))}
}

// upsertRoles makes rel's roles those of spec: existing ones (by release
// and name) are updated in place so their ids, and every binding that
// references them, survive; new ones are created; the rest are deleted
// (checkRemovedRoles has made sure none of those is bound). rel.Roles ends
// up as stored, in name order.
func upsertRoles(tx *gorm.DB, rel *Release, spec ReleaseSpec, roleNames []string) error {
	stamp := Now()
	roles := make([]Role, 0, len(roleNames))
	for _, name := range roleNames {
		r := spec.RolesMetadata[name]
		role := Role{
			ReleaseID: rel.ID, Name: name, Title: r.Name, Jig: r.Jig,
			Requires: NonNil(r.Requires), Tags: NonNil(r.Tags), Flags: NonNil(r.Flags), Template: r.Template,
			Script: r.Script, CreatedAt: stamp, UpdatedAt: stamp,
		}
		if role.Jig == "" {
			role.Jig = "agent"
		}
		if role.Template == nil {
			role.Template = map[string]any{}
		}
		roles = append(roles, role)
	}
	if len(roles) > 0 {
		// roles has UNIQUE (release_id, name) since 0001_foundation.sql.
		err := tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "release_id"}, {Name: "name"}},
			DoUpdates: clause.AssignmentColumns([]string{"title", "jig", "requires", "tags", "flags", "template", "script", "updated_at"}),
		}).Create(&roles).Error
		if err != nil {
			return fmt.Errorf("upsert roles: %w", err)
		}
	}
	del := tx.Where("release_id = ?", rel.ID)
	if len(roleNames) > 0 {
		del = del.Where("name NOT IN ?", roleNames)
	}
	if err := del.Delete(&Role{}).Error; err != nil {
		return fmt.Errorf("delete roles no longer in the spec: %w", err)
	}
	// Reloaded rather than taken from roles: an updated row keeps its
	// created_at, which the insert above does not return.
	rel.Roles = nil
	if err := tx.Where("release_id = ?", rel.ID).Order("name").Find(&rel.Roles).Error; err != nil {
		return fmt.Errorf("reload roles: %w", err)
	}
	return nil
}

func NonNil(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

// roleCycle returns a cycle in the roles' requirements as a path that ends
// where it starts, or nil. Roles are visited in name order, so the answer is
// the same every time.
func roleCycle(roles map[string]RoleSpec, names []string) []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(string) []string
	visit = func(name string) []string {
		state[name] = onPath
		path = append(path, name)
		reqs := append([]string(nil), roles[name].Requires...)
		sort.Strings(reqs)
		for _, req := range reqs {
			switch state[req] {
			case onPath:
				start := slices.Index(path, req)
				return append(append([]string(nil), path[start:]...), req)
			case unseen:
				if c := visit(req); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[name] = done
		return nil
	}
	for _, name := range names {
		if state[name] == unseen {
			if c := visit(name); c != nil {
				return c
			}
		}
	}
	return nil
}

// RedundantRequirements reports every requirement a role declares although
// it already has it indirectly, through another of its requirements. The
// Crowbar rule is that a role should not declare a dependency on a role it
// only indirectly depends on: the edge adds nothing to the order and hides
// the real structure. Such a release is still valid, so these are warnings.
//
// requires maps each role to the roles it requires (names it does not list
// require nothing). There is one warning per redundant edge, ordered by role
// and then by required role, naming the shortest path found (requirements
// are visited in name order, so the answer is the same every time):
//
//	role "A" requires "C", which it already requires through "B"
func RedundantRequirements(requires map[string][]string) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(requires)) {
		direct := uniqueSorted(requires[name])
		for _, target := range direct {
			path := indirectPath(requires, name, direct, target)
			if path == nil {
				continue
			}
			quoted := make([]string, len(path))
			for i, p := range path {
				quoted[i] = strconv.Quote(p)
			}
			out = append(out, fmt.Sprintf("role %q requires %q, which it already requires through %s",
				name, target, strings.Join(quoted, " -> ")))
		}
	}
	return out
}

// indirectPath is the shortest chain of roles leading from role from to
// target without using the direct edge from -> target: it starts at one of
// from's other direct requirements and ends just before target. It is nil
// when target is only required directly. Breadth first, so the chain is a
// shortest one; neighbours in name order, so it is always the same one.
func indirectPath(requires map[string][]string, from string, direct []string, target string) []string {
	// prev maps a visited role to the one it was reached from; the starting
	// roles map to themselves.
	prev := map[string]string{from: from}
	var queue []string
	for _, d := range direct {
		if d != target && d != from {
			prev[d] = d
			queue = append(queue, d)
		}
	}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, next := range uniqueSorted(requires[cur]) {
			if next == target {
				path := []string{cur}
				for at := cur; prev[at] != at; at = prev[at] {
					path = append(path, prev[at])
				}
				slices.Reverse(path)
				return path
			}
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// uniqueSorted is a sorted copy of list without duplicates, so that a role
// listed twice is not taken for a path to itself.
func uniqueSorted(list []string) []string {
	out := slices.Clone(list)
	sort.Strings(out)
	return slices.Compact(out)
}

// ReleaseSection is a seed's part of a release (Fuel's graphs and tags):
// it is validated before anything is written, and saved inside the
// import's database transaction after the release row and its roles.
type ReleaseSection struct {
	// Name says what the section is, in errors.
	Name string
	// Validate refuses a spec whose section cannot work, with an
	// InputError naming the field.
	Validate func(spec ReleaseSpec) error
	// Save writes the section of spec for rel.
	Save func(tx *gorm.DB, rel *Release, spec ReleaseSpec) error
}

var (
	sectionsMu sync.RWMutex
	sections   []ReleaseSection
)

// RegisterReleaseSection adds a section every release import validates and
// saves, in registration order. Seeds register theirs when their package
// is initialised, so that an import writes a whole release wherever the
// seed is linked.
func RegisterReleaseSection(sec ReleaseSection) {
	sectionsMu.Lock()
	defer sectionsMu.Unlock()
	sections = append(sections, sec)
}

func releaseSections() []ReleaseSection {
	sectionsMu.RLock()
	defer sectionsMu.RUnlock()
	return slices.Clone(sections)
}

// validateReleaseSpec checks a release's names, texts and lists against the
// validation vocabulary (validate.go) before anything else looks at it.
func validateReleaseSpec(spec ReleaseSpec) error {
	if err := ValidName("name", "release", spec.Name); err != nil {
		return err
	}
	if err := ValidVersion("version", spec.Version); err != nil {
		return err
	}
	if err := MaxItems("roles_metadata", len(spec.RolesMetadata), MaxListLen); err != nil {
		return err
	}
	if err := MaxItems("tags_metadata", len(spec.TagsMetadata), MaxListLen); err != nil {
		return err
	}
	if err := MaxItems("graphs", len(spec.Graphs), 100); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(spec.RolesMetadata)) {
		r := spec.RolesMetadata[name]
		field := "roles_metadata." + Clip(name)
		if err := ValidName(field, "role", name); err != nil {
			return err
		}
		if err := ValidLine(field+".name", r.Name, MaxLineLen); err != nil {
			return err
		}
		if r.Jig != "" {
			if err := OneOf(field+".jig", r.Jig, KnownJigs...); err != nil {
				return err
			}
		}
		for _, l := range []struct {
			name string
			list []string
		}{{"requires", r.Requires}, {"tags", r.Tags}, {"flags", r.Flags}} {
			if err := MaxItems(field+"."+l.name, len(l.list), MaxListLen); err != nil {
				return err
			}
		}
		for i, tag := range r.Tags {
			if err := ValidTagEntry(fmt.Sprintf("%s.tags[%d]", field, i), tag, false); err != nil {
				return err
			}
		}
		if err := ValidText(field+".script", r.Script, MaxTextLen); err != nil {
			return err
		}
		if err := ValidateMap(field+".template", r.Template); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(spec.TagsMetadata)) {
		field := "tags_metadata." + Clip(name)
		if err := ValidTagEntry(field, name, false); err != nil {
			return err
		}
		if err := ValidLine(field+".name", spec.TagsMetadata[name].Name, MaxLineLen); err != nil {
			return err
		}
	}
	return nil
}
