package fuel

import (
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// RoleTaskGraph is the graph type in which roles without tasks of their own
// take part as one task each.
const RoleTaskGraph = "deployment"

// withRoleTasks adds, for every role that no task of the graph selects, one
// task named after the role, tagged with its name, running its script (or
// nothing), and waiting for its parent roles' tasks on whichever nodes hold
// them. So a Crowbar-style release, roles and requirements only, deploys
// without task lists, and a Fuel-style one is unchanged.
func withRoleTasks(tasks []plan.Task, roles []models.Role) []plan.Task {
	ids := map[string]bool{}
	for _, t := range tasks {
		ids[t.ID] = true
	}
	// The tasks that carry out each role: those selecting its name or one of
	// its tags; a role with none gets a task of its own.
	carriedBy := map[string][]string{}
	for _, r := range roles {
		for _, t := range tasks {
			sel := t.Selector()
			if slices.Contains(sel, r.Name) || slices.ContainsFunc(r.Tags, func(tag string) bool { return slices.Contains(sel, tag) }) {
				carriedBy[r.Name] = append(carriedBy[r.Name], t.ID)
			}
		}
		if len(carriedBy[r.Name]) == 0 && !ids[r.Name] {
			carriedBy[r.Name] = []string{r.Name}
		}
	}
	out := slices.Clone(tasks)
	for _, r := range roles {
		if ids[r.Name] || len(carriedBy[r.Name]) != 1 || carriedBy[r.Name][0] != r.Name {
			continue // carried by tasks of the graph
		}
		t := plan.Task{ID: r.Name, Type: plan.TypeShell, Tags: []string{r.Name}, Parameters: plan.Parameters{Cmd: r.Script}}
		if r.Script == "" {
			t.Type = "noop"
		}
		// Wait for the parent roles wherever they run, whether a task of
		// their own or the graph's tasks carry them out.
		for _, parent := range r.Requires {
			for _, id := range carriedBy[parent] {
				t.CrossDepends = append(t.CrossDepends, plan.CrossDep{Name: id, Role: plan.StringList{parent}})
			}
		}
		out = append(out, t)
	}
	return out
}

// graphTasks is the merged graph of a type for a deployment with the role
// tasks added to its deployment graph: what planning works on.
func graphTasks(tx *gorm.DB, dep *models.Deployment, graphType string) (*ResolvedGraph, error) {
	graph, err := resolveGraph(tx, dep, graphType)
	if graphType != RoleTaskGraph || dep.ReleaseID == nil {
		return graph, err
	}
	if errors.Is(err, models.ErrNotFound) {
		// A Crowbar-style release has roles and no graphs at all.
		graph, err = &ResolvedGraph{Type: graphType, Metadata: map[string]any{}}, nil
	}
	if err != nil {
		return nil, err
	}
	var roles []models.Role
	if err := tx.Where("release_id = ?", *dep.ReleaseID).Order("name").Find(&roles).Error; err != nil {
		return nil, fmt.Errorf("load roles of deployment %s: %w", dep.Name, err)
	}
	if len(roles) == 0 && len(graph.Tasks) == 0 {
		return nil, models.NotFound("graph type", graphType)
	}
	graph.Tasks = withRoleTasks(graph.Tasks, roles)
	return graph, nil
}
