package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"gorm.io/gorm"

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

func findRelease(tx *gorm.DB, ref string) (*Release, error) {
	return takeRef[Release](byVersionedRef(tx, ref), "release", ref)
}

// Release finds a release by id, name@version or name (newest).
func (s *Store) Release(ctx context.Context, ref string) (*Release, error) {
	rel, err := findRelease(s.DB.WithContext(ctx), ref)
	if err != nil {
		return nil, err
	}
	if err := s.DB.WithContext(ctx).Where("release_id = ?", rel.ID).Order("name").Find(&rel.Roles).Error; err != nil {
		return nil, fmt.Errorf("load roles of release %s: %w", ref, err)
	}
	return rel, nil
}

// ImportRelease validates a release and stores it, replacing the roles and
// graphs of an existing release with the same name and version.
func (s *Store) ImportRelease(ctx context.Context, spec ReleaseSpec) (*Release, error) {
	if spec.Name == "" {
		return nil, Invalid("name", "is required")
	}
	roleNames := make([]string, 0, len(spec.RolesMetadata))
	for name := range spec.RolesMetadata {
		roleNames = append(roleNames, name)
	}
	sort.Strings(roleNames)
	for _, name := range roleNames {
		for i, req := range spec.RolesMetadata[name].Requires {
			if _, ok := spec.RolesMetadata[req]; !ok {
				return nil, Invalid(fmt.Sprintf("roles_metadata.%s.requires[%d]", name, i), "unknown role %q", req)
			}
		}
	}
	if cycle := roleCycle(spec.RolesMetadata, roleNames); cycle != nil {
		return nil, &InputError{Field: "roles_metadata", Reason: "role requirements form a cycle: " + strings.Join(cycle, " -> "),
			Details: map[string]any{"cycle": cycle}}
	}
	graphTypes := make([]string, 0, len(spec.Graphs))
	for typ, g := range spec.Graphs {
		if err := plan.Validate(g.Tasks); err != nil {
			return nil, Invalid(fmt.Sprintf("graphs.%s.tasks", typ), "%v", err)
		}
		graphTypes = append(graphTypes, typ)
	}
	sort.Strings(graphTypes)
	var rel Release
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Where("name = ? AND version = ?", spec.Name, spec.Version).Take(&rel).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			rel = Release{Name: spec.Name, Version: spec.Version}
		case err != nil:
			return fmt.Errorf("load release %s: %w", spec.Name, err)
		}
		rel.TagsMetadata = spec.TagsMetadata
		if rel.TagsMetadata == nil {
			rel.TagsMetadata = map[string]TagMetadata{}
		}
		rel.UpdatedAt = now()
		if err := tx.Save(&rel).Error; err != nil {
			return fmt.Errorf("save release %s: %w", spec.Name, err)
		}
		if err := tx.Where("release_id = ?", rel.ID).Delete(&Role{}).Error; err != nil {
			return fmt.Errorf("replace roles: %w", err)
		}
		for _, name := range roleNames {
			r := spec.RolesMetadata[name]
			role := Role{
				ReleaseID: rel.ID, Name: name, Title: r.Name, Jig: r.Jig,
				Requires: nonNil(r.Requires), Tags: nonNil(r.Tags), Flags: nonNil(r.Flags), Template: r.Template,
				Script: r.Script,
			}
			if role.Jig == "" {
				role.Jig = "agent"
			}
			if role.Template == nil {
				role.Template = map[string]any{}
			}
			if err := tx.Create(&role).Error; err != nil {
				return fmt.Errorf("create role %s: %w", name, err)
			}
			rel.Roles = append(rel.Roles, role)
		}
		if err := tx.Where("owner_kind = ? AND owner_id = ?", OwnerRelease, rel.ID).Delete(&Graph{}).Error; err != nil {
			return fmt.Errorf("replace graphs: %w", err)
		}
		for _, typ := range graphTypes {
			g := spec.Graphs[typ]
			graph := Graph{OwnerKind: OwnerRelease, OwnerID: rel.ID, Type: typ, Name: g.Name, Metadata: g.Metadata, Tasks: g.Tasks}
			if err := saveGraph(tx, &graph); err != nil {
				return err
			}
		}
		// Tags (models/tags.go): the release's declared tags, replaced;
		// user-created ones kept.
		return syncReleaseTags(tx, &rel, spec)
	})
	if err != nil {
		return nil, err
	}
	return &rel, nil
}

func nonNil(list []string) []string {
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
