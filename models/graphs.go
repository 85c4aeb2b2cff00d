package models

import (
	"context"
	"fmt"
	"sort"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models/plan"
)

// saveGraph stores a graph, normalising nil collections.
func saveGraph(tx *gorm.DB, g *Graph) error {
	if g.Metadata == nil {
		g.Metadata = map[string]any{}
	}
	if g.Tasks == nil {
		g.Tasks = []plan.Task{}
	}
	if err := tx.Create(g).Error; err != nil {
		return fmt.Errorf("save graph %s/%d/%s: %w", g.OwnerKind, g.OwnerID, g.Type, err)
	}
	return nil
}

// ResolvedGraph is a graph type as a deployment sees it: the release's graph,
// overridden task by task by the deployment's own graph of the same type.
type ResolvedGraph struct {
	Type     string         `json:"type"`
	Metadata map[string]any `json:"metadata"`
	Tasks    []plan.Task    `json:"tasks"`
}

// ResolveGraph merges the graphs of one type for a deployment: release, then
// deployment (a later level replaces a task of the same id). It returns
// ErrNotFound when no level defines the type.
func (s *Store) ResolveGraph(ctx context.Context, dep *Deployment, graphType string) (*ResolvedGraph, error) {
	return resolveGraph(s.DB.WithContext(ctx), dep, graphType)
}

func resolveGraph(tx *gorm.DB, dep *Deployment, graphType string) (*ResolvedGraph, error) {
	q := tx.Where("type = ?", graphType)
	if dep.ReleaseID != nil {
		q = q.Where("(owner_kind = ? AND owner_id = ?) OR (owner_kind = ? AND owner_id = ?)",
			OwnerRelease, *dep.ReleaseID, OwnerDeployment, dep.ID)
	} else {
		q = q.Where("owner_kind = ? AND owner_id = ?", OwnerDeployment, dep.ID)
	}
	var graphs []Graph
	if err := q.Find(&graphs).Error; err != nil {
		return nil, fmt.Errorf("load %s graphs of deployment %s: %w", graphType, dep.Name, err)
	}
	if len(graphs) == 0 {
		return nil, notFound("graph type", graphType)
	}
	level := map[string]int{OwnerRelease: 0, OwnerPlugin: 1, OwnerDeployment: 2}
	sort.SliceStable(graphs, func(i, j int) bool { return level[graphs[i].OwnerKind] < level[graphs[j].OwnerKind] })
	out := &ResolvedGraph{Type: graphType, Metadata: map[string]any{}}
	index := map[string]int{}
	for _, g := range graphs {
		for k, v := range g.Metadata {
			out.Metadata[k] = v
		}
		for _, t := range g.Tasks {
			if i, ok := index[t.ID]; ok {
				out.Tasks[i] = t
				continue
			}
			index[t.ID] = len(out.Tasks)
			out.Tasks = append(out.Tasks, t)
		}
	}
	return out, nil
}

// GraphTypes lists the graph types a deployment can run.
func (s *Store) GraphTypes(ctx context.Context, dep *Deployment) ([]string, error) {
	var types []string
	q := s.DB.WithContext(ctx).Model(&Graph{}).Distinct("type").Order("type")
	if dep.ReleaseID != nil {
		q = q.Where("(owner_kind = ? AND owner_id = ?) OR (owner_kind = ? AND owner_id = ?)",
			OwnerRelease, *dep.ReleaseID, OwnerDeployment, dep.ID)
	} else {
		q = q.Where("owner_kind = ? AND owner_id = ?", OwnerDeployment, dep.ID)
	}
	if err := q.Pluck("type", &types).Error; err != nil {
		return nil, fmt.Errorf("list graph types of %s: %w", dep.Name, err)
	}
	return types, nil
}
