package fuel

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
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
// overridden task by task by the graphs of the plugins the deployment enables
// and then by the deployment's own graph of the same type.
type ResolvedGraph struct {
	Type     string         `json:"type"`
	Metadata map[string]any `json:"metadata"`
	Tasks    []plan.Task    `json:"tasks"`
	// Sources are the graphs merged, in merge order.
	Sources []GraphSource `json:"sources"`
}

// GraphSource names one graph that went into a ResolvedGraph.
type GraphSource struct {
	OwnerKind string `json:"owner_kind"`
	OwnerID   int64  `json:"owner_id"`
	Name      string `json:"name"`
}

// ResolveGraph merges the graphs of one type for a deployment: release, then
// the enabled plugins in plugin id order, then the deployment (a later level
// replaces a task of the same id, and overwrites metadata keys). It returns
// ErrNotFound when no level defines the type.
func (s *Store) ResolveGraph(ctx context.Context, dep *models.Deployment, graphType string) (*ResolvedGraph, error) {
	return resolveGraph(s.DB.WithContext(ctx), dep, graphType)
}

// visibleGraphs narrows a graphs query to the graphs a deployment sees: its
// release's, its enabled plugins' and its own, in merge order.
func visibleGraphs(tx *gorm.DB, dep *models.Deployment) *gorm.DB {
	return tx.Where(visibleGraphsWhere("@release", "@deployment"),
		sql.Named("release", dep.ReleaseID), sql.Named("deployment", dep.ID))
}

// visibleGraphsWhere is visibleGraphs' condition on a graphs row, for the
// release and deployment ids given as SQL expressions.
func visibleGraphsWhere(releaseID, deploymentID string) string {
	return fmt.Sprintf(`(owner_kind = '%s' OR (owner_kind = '%s' AND owner_id = %s)
		OR (owner_kind = '%s' AND owner_id IN (SELECT plugin_id FROM deployment_plugins WHERE deployment_id = %s))
		OR (owner_kind = '%s' AND owner_id = %s))`,
		OwnerBuiltin, OwnerRelease, releaseID, OwnerPlugin, deploymentID, OwnerDeployment, deploymentID)
}

// mergeOrder orders graphs built-in → release → plugins (by id) → deployment.
const mergeOrder = "CASE owner_kind WHEN 'builtin' THEN -1 WHEN 'release' THEN 0 WHEN 'plugin' THEN 1 ELSE 2 END, owner_id"

func resolveGraph(tx *gorm.DB, dep *models.Deployment, graphType string) (*ResolvedGraph, error) {
	var graphs []Graph
	err := visibleGraphs(tx.Where("type = ?", graphType), dep).Order(mergeOrder).Find(&graphs).Error
	if err != nil {
		return nil, fmt.Errorf("load %s graphs of deployment %s: %w", graphType, dep.Name, err)
	}
	if len(graphs) == 0 {
		return nil, models.NotFound("graph type", graphType)
	}
	out := &ResolvedGraph{Type: graphType, Metadata: mergedMetadata(graphs), Tasks: []plan.Task{}}
	index := map[string]int{}
	for _, g := range graphs {
		out.Sources = append(out.Sources, GraphSource{OwnerKind: g.OwnerKind, OwnerID: g.OwnerID, Name: g.Name})
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

// mergedMetadata merges graphs' metadata in their order (mergeOrder): a
// later graph's key wins.
func mergedMetadata(graphs []Graph) map[string]any {
	out := map[string]any{}
	for _, g := range graphs {
		for k, v := range g.Metadata {
			out[k] = v
		}
	}
	return out
}

// GraphTypes lists the graph types a deployment can run: those of its
// release, its enabled plugins and its own.
func (s *Store) GraphTypes(ctx context.Context, dep *models.Deployment) ([]string, error) {
	types := []string{}
	q := visibleGraphs(s.DB.WithContext(ctx).Model(&Graph{}), dep).Distinct("type").Order("type")
	if err := q.Pluck("type", &types).Error; err != nil {
		return nil, fmt.Errorf("list graph types of %s: %w", dep.Name, err)
	}
	return types, nil
}

// ExecutableGraph is the graph of a type a deployment executes: the merged
// graph (see ResolveGraph) with, for the deployment graph, a task for every
// role no task selects — what execute validates and plans.
func (s *Store) ExecutableGraph(ctx context.Context, dep *models.Deployment, graphType string) (*ResolvedGraph, error) {
	g, err := graphTasks(s.DB.WithContext(ctx), dep, graphType)
	return g, noGraph(err, dep, graphType)
}

// noGraph names the deployment and type in a not-found error.
func noGraph(err error, dep *models.Deployment, graphType string) error {
	if errors.Is(err, models.ErrNotFound) {
		return fmt.Errorf("deployment %s has no graph of type %q (its release, enabled plugins and own graphs define none): %w",
			dep.Name, graphType, models.ErrNotFound)
	}
	return err
}

// PlanPreview plans a deployment's graph of a type on its plannable nodes
// exactly as execute validates it (ExecutableGraph, plannableNodes,
// plan.Build, the node and task filters of opts checked as execute checks
// graphs[].nodes and graphs[].tasks), recording no transaction. A cycle or
// bad graph is an *InputError on field "tasks" with the cycle's path; a
// filter naming a node outside the deployment or an unknown task is an
// *InputError on nodes[i] or tasks[i]; a type no level defines is
// ErrNotFound. Like execute, it settles the deployment's primary tags
// (they are stable across plans).
func (s *Store) PlanPreview(ctx context.Context, dep *models.Deployment, graphType string, opts plan.Options) (*plan.Plan, error) {
	var p *plan.Plan
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		graph, err := graphTasks(tx, dep, graphType)
		if err != nil {
			return err
		}
		if err := checkFilters("", GraphRequest{Type: graphType, Nodes: opts.Nodes, Tasks: opts.Tasks}, graph, dep, tx); err != nil {
			return err
		}
		nodes, err := plannableNodes(tx, dep.ID)
		if err != nil {
			return err
		}
		p, err = plan.Build(graph.Tasks, nodes, opts)
		if err != nil {
			return planError("tasks", err)
		}
		return nil
	})
	if err != nil {
		return nil, noGraph(err, dep, graphType)
	}
	return p, nil
}

// GraphOwner addresses the owner of graphs: a release (id, name@version or
// name), a plugin (the same) or a deployment (id or name).
type GraphOwner struct {
	Kind string // OwnerRelease, OwnerPlugin or OwnerDeployment
	Ref  string
}

// GraphView is a graph as the API shows and takes it.
type GraphView struct {
	Type     string         `json:"type"`
	Name     string         `json:"name"`
	Metadata map[string]any `json:"metadata"`
	Tasks    []plan.Task    `json:"tasks"`
}

// View returns the graph as the API shows it.
func (g *Graph) View() GraphView {
	v := GraphView{Type: g.Type, Name: g.Name, Metadata: g.Metadata, Tasks: g.Tasks}
	if v.Metadata == nil {
		v.Metadata = map[string]any{}
	}
	if v.Tasks == nil {
		v.Tasks = []plan.Task{}
	}
	return v
}

// GraphSummary is one line of an owner's graph listing.
type GraphSummary struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	TaskCount int    `json:"task_count"`
}

// GraphInput is the body of a graph write. For a PATCH, absent fields stay
// as they are: Name nil, Metadata nil and Tasks nil change nothing. Type, when
// given, must be the type in the path (so a graph read can be written back).
type GraphInput struct {
	Type     string         `json:"type"`
	Name     *string        `json:"name"`
	Metadata map[string]any `json:"metadata"`
	Tasks    []plan.Task    `json:"tasks"`
}

var graphTypeRe = regexp.MustCompile(`^[a-z0-9_-]+$`)

const (
	maxGraphType = 64
	maxGraphName = 200
)

// ValidateGraphType checks a graph type name: non-empty, lower-case letters,
// digits, '_' and '-'.
func ValidateGraphType(graphType string) error {
	switch {
	case graphType == "":
		return models.Invalid("type", "is required")
	case len(graphType) > maxGraphType:
		return models.Invalid("type", "must be at most %d characters", maxGraphType)
	case !graphTypeRe.MatchString(graphType):
		return models.Invalid("type", "%q may contain only lower-case letters, digits, '_' and '-'", graphType)
	}
	return nil
}

// graphLock serialises graph writes and plugin (de)activation, so the merged
// graphs they check cannot change underneath them.
const graphLock = 7262737

func lockGraphs(tx *gorm.DB) error {
	if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", graphLock).Error; err != nil {
		return fmt.Errorf("lock graphs: %w", err)
	}
	return nil
}

// findOwner resolves a graph owner to its id and a readable label.
func findOwner(tx *gorm.DB, o GraphOwner) (int64, string, error) {
	switch o.Kind {
	case OwnerRelease:
		rel, err := models.FindRelease(tx, o.Ref)
		if err != nil {
			return 0, "", err
		}
		return rel.ID, fmt.Sprintf("release %s@%s", rel.Name, rel.Version), nil
	case OwnerPlugin:
		p, err := findPlugin(tx, o.Ref)
		if err != nil {
			return 0, "", err
		}
		return p.ID, fmt.Sprintf("plugin %s@%s", p.Name, p.Version), nil
	case OwnerDeployment:
		dep, err := models.FindDeployment(tx, o.Ref)
		if err != nil {
			return 0, "", err
		}
		return dep.ID, fmt.Sprintf("deployment %s", dep.Name), nil
	}
	return 0, "", fmt.Errorf("unknown graph owner kind %q", o.Kind)
}

// ownGraph loads an owner's graph of a type, or nil.
func ownGraph(tx *gorm.DB, kind string, ownerID int64, graphType string) (*Graph, error) {
	var g Graph
	err := tx.Where("owner_kind = ? AND owner_id = ? AND type = ?", kind, ownerID, graphType).Take(&g).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load graph %s/%d/%s: %w", kind, ownerID, graphType, err)
	}
	return &g, nil
}

// OwnGraphs lists an owner's own graphs by type.
func (s *Store) OwnGraphs(ctx context.Context, o GraphOwner) ([]GraphSummary, error) {
	db := s.DB.WithContext(ctx)
	id, label, err := findOwner(db, o)
	if err != nil {
		return nil, err
	}
	out := []GraphSummary{}
	err = db.Model(&Graph{}).Select("type, name, jsonb_array_length(tasks) AS task_count").
		Where("owner_kind = ? AND owner_id = ?", o.Kind, id).Order("type").Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list graphs of %s: %w", label, err)
	}
	return out, nil
}

// OwnGraph returns an owner's own graph of a type (not merged with any other
// level); ErrNotFound when the owner has none.
func (s *Store) OwnGraph(ctx context.Context, o GraphOwner, graphType string) (*Graph, error) {
	db := s.DB.WithContext(ctx)
	id, label, err := findOwner(db, o)
	if err != nil {
		return nil, err
	}
	g, err := ownGraph(db, o.Kind, id, graphType)
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fmt.Errorf("%s has no graph of type %q: %w", label, graphType, models.ErrNotFound)
	}
	return g, nil
}

// graphOp is a graph write.
type graphOp int

const (
	opCreate graphOp = iota
	opReplace
	opPatch
	opDelete
)

// CreateGraph creates an owner's graph of a type; a conflict if it exists.
func (s *Store) CreateGraph(ctx context.Context, o GraphOwner, graphType string, in GraphInput) (*Graph, error) {
	g, _, err := s.writeGraph(ctx, o, graphType, opCreate, in)
	return g, err
}

// ReplaceGraph replaces an owner's graph of a type, or creates it (created
// then reports true).
func (s *Store) ReplaceGraph(ctx context.Context, o GraphOwner, graphType string, in GraphInput) (*Graph, bool, error) {
	return s.writeGraph(ctx, o, graphType, opReplace, in)
}

// PatchGraph merges into an owner's graph of a type: each task given replaces
// the task of the same id in place or is appended, each metadata key given
// overwrites the stored one, the name changes if given. ErrNotFound when the
// owner has no such graph.
func (s *Store) PatchGraph(ctx context.Context, o GraphOwner, graphType string, in GraphInput) (*Graph, error) {
	g, _, err := s.writeGraph(ctx, o, graphType, opPatch, in)
	return g, err
}

// DeleteGraph removes an owner's graph of a type; ErrNotFound when it has
// none, a conflict when a deployment's merged graph needs its tasks.
func (s *Store) DeleteGraph(ctx context.Context, o GraphOwner, graphType string) error {
	_, _, err := s.writeGraph(ctx, o, graphType, opDelete, GraphInput{})
	return err
}

// writeGraph validates and performs one graph write in one transaction.
//
// Tasks are validated with plan.Validate at two levels. The owner's own tasks
// first: strictly for a release (the base level), and for a plugin or a
// deployment with the task names they reference but do not define taken as
// defined below them. Then the merged graph of every deployment that sees
// the owner's graph: a deployment's own write must leave its merged graph
// valid; a release's or plugin's write (and any delete) must not break a
// deployment whose merged graph was valid before it. A cycle of same-node
// orderings (requires, required_for) is refused here with its path; cycles
// through cross dependencies depend on the nodes, and execute and graph.gv
// report them.
func (s *Store) writeGraph(ctx context.Context, o GraphOwner, graphType string, op graphOp, in GraphInput) (*Graph, bool, error) {
	if op != opDelete {
		if err := validateGraphInput(o.Kind, graphType, op, in); err != nil {
			return nil, false, err
		}
	}
	var out *Graph
	created := false
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := lockGraphs(tx); err != nil {
			return err
		}
		ownerID, label, err := findOwner(tx, o)
		if err != nil {
			return err
		}
		g, err := ownGraph(tx, o.Kind, ownerID, graphType)
		if err != nil {
			return err
		}
		switch {
		case g != nil && op == opCreate:
			return &models.ConflictError{Reason: fmt.Sprintf("%s already has a graph of type %q; use PUT to replace it or PATCH to change it", label, graphType)}
		case g == nil && (op == opPatch || op == opDelete):
			return fmt.Errorf("%s has no graph of type %q: %w", label, graphType, models.ErrNotFound)
		}
		if op == opPatch {
			patchGraph(g, in)
			if err := validateOwnTasks(o.Kind, g.Tasks); err != nil {
				return err
			}
		}

		deps, err := affectedDeployments(tx, o.Kind, ownerID)
		if err != nil {
			return err
		}
		types := []string{graphType}
		strict := o.Kind == OwnerDeployment && op != opDelete
		var before []mergeProblem
		if !strict {
			if before, err = mergedProblems(tx, deps, types); err != nil {
				return err
			}
		}

		switch op {
		case opCreate, opReplace:
			if g == nil {
				g = &Graph{OwnerKind: o.Kind, OwnerID: ownerID, Type: graphType}
				created = true
			}
			g.Name, g.Metadata, g.Tasks = "", in.Metadata, in.Tasks
			if in.Name != nil {
				g.Name = *in.Name
			}
		}
		switch {
		case op == opDelete:
			if err := tx.Delete(&Graph{}, g.ID).Error; err != nil {
				return fmt.Errorf("delete graph %q of %s: %w", graphType, label, err)
			}
		case created:
			if err := saveGraph(tx, g); err != nil {
				return models.UniqueViolation(err, fmt.Sprintf("%s already has a graph of type %q", label, graphType))
			}
		default:
			if g.Metadata == nil {
				g.Metadata = map[string]any{}
			}
			if g.Tasks == nil {
				g.Tasks = []plan.Task{}
			}
			g.UpdatedAt = models.Now()
			if err := tx.Save(g).Error; err != nil {
				return fmt.Errorf("save graph %q of %s: %w", graphType, label, err)
			}
		}

		after, err := mergedProblems(tx, deps, types)
		if err != nil {
			return err
		}
		if pr := newProblem(before, after); pr != nil {
			if op == opDelete {
				return &models.ConflictError{Reason: fmt.Sprintf("deleting graph %q of %s would break the merged graph of deployment %q: %v",
					graphType, label, pr.dep.Name, pr.err)}
			}
			ie := tasksError(pr.err)
			ie.Reason = fmt.Sprintf("merged into graph %q of deployment %q: %s", graphType, pr.dep.Name, ie.Reason)
			ie.Details["deployment"] = pr.dep.Name
			return ie
		}
		out = g
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, created, nil
}

// validateGraphInput checks what can be checked without the database.
func validateGraphInput(kind, graphType string, op graphOp, in GraphInput) error {
	if err := ValidateGraphType(graphType); err != nil {
		return err
	}
	if in.Type != "" && in.Type != graphType {
		return models.Invalid("type", "%q does not match the graph type %q in the path", in.Type, graphType)
	}
	if in.Name != nil {
		if err := models.ValidLine("name", *in.Name, maxGraphName); err != nil {
			return err
		}
	}
	if err := models.ValidateMap("metadata", in.Metadata); err != nil {
		return err
	}
	if err := ValidateTasks("tasks", in.Tasks); err != nil {
		return err
	}
	if op != opPatch {
		return validateOwnTasks(kind, in.Tasks)
	}
	// A patch is validated once merged into the stored graph; here only what
	// the merge itself needs: ids present and distinct.
	seen := map[string]int{}
	for i, t := range in.Tasks {
		if t.ID == "" {
			return &models.InputError{Field: "tasks", Reason: fmt.Sprintf("task at position %d has an empty id", i),
				Details: map[string]any{"task_field": "id"}}
		}
		if j, dup := seen[t.ID]; dup {
			return &models.InputError{Field: "tasks", Reason: fmt.Sprintf("task %q: duplicate task id (positions %d and %d)", t.ID, j, i),
				Details: map[string]any{"task": t.ID, "task_field": "id"}}
		}
		seen[t.ID] = i
	}
	return nil
}

// patchGraph merges a patch into g.
func patchGraph(g *Graph, in GraphInput) {
	if in.Name != nil {
		g.Name = *in.Name
	}
	if len(in.Metadata) > 0 {
		merged := make(map[string]any, len(g.Metadata)+len(in.Metadata))
		for k, v := range g.Metadata {
			merged[k] = v
		}
		for k, v := range in.Metadata {
			merged[k] = v
		}
		g.Metadata = merged
	}
	if len(in.Tasks) > 0 {
		tasks := append([]plan.Task(nil), g.Tasks...)
		index := make(map[string]int, len(tasks))
		for i, t := range tasks {
			index[t.ID] = i
		}
		for _, t := range in.Tasks {
			if i, ok := index[t.ID]; ok {
				tasks[i] = t
				continue
			}
			index[t.ID] = len(tasks)
			tasks = append(tasks, t)
		}
		g.Tasks = tasks
	}
}

// validateOwnTasks validates one level's tasks. A plugin's or deployment's
// graph may name tasks defined by the levels it merges onto, so those names
// are taken as defined (their existence is checked on the merged graphs).
func validateOwnTasks(kind string, tasks []plan.Task) error {
	check := tasks
	if kind != OwnerRelease {
		check = withStubs(tasks)
	}
	if err := plan.Validate(check); err != nil {
		return tasksError(err)
	}
	return nil
}

// withStubs appends a stage marker for every plain task name the tasks
// reference without defining it.
func withStubs(tasks []plan.Task) []plan.Task {
	defined := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		defined[t.ID] = true
	}
	out := tasks
	add := func(name string) {
		isRegex := len(name) >= 2 && strings.HasPrefix(name, "/") && strings.HasSuffix(name, "/")
		if name == "" || isRegex || defined[name] {
			return
		}
		defined[name] = true
		if len(out) == len(tasks) {
			out = append([]plan.Task(nil), tasks...)
		}
		out = append(out, plan.Task{ID: name, Type: plan.TypeStage})
	}
	for _, t := range tasks {
		for _, name := range t.Requires {
			add(name)
		}
		for _, name := range t.RequiredFor {
			add(name)
		}
		for _, d := range t.CrossDepends {
			add(d.Name)
		}
		for _, d := range t.CrossDependedBy {
			add(d.Name)
		}
	}
	return out
}

// tasksError turns a plan validation error into bad input on field "tasks".
func tasksError(err error) *models.InputError {
	out := &models.InputError{Field: "tasks", Reason: err.Error(), Details: map[string]any{}}
	var verr *plan.ValidationError
	if errors.As(err, &verr) {
		if verr.Task != "" {
			out.Details["task"] = verr.Task
		}
		out.Details["task_field"] = verr.Field
	}
	var cycle *plan.CycleError
	if errors.As(err, &cycle) {
		out.Details["cycle"] = cycle.Path
	}
	return out
}

// affectedDeployments lists, by name, the deployments whose merged graphs
// include the graphs of an owner.
func affectedDeployments(tx *gorm.DB, kind string, ownerID int64) ([]models.Deployment, error) {
	q := tx.Order("name")
	switch kind {
	case OwnerRelease:
		q = q.Where("release_id = ?", ownerID)
	case OwnerPlugin:
		q = q.Where("id IN (SELECT deployment_id FROM deployment_plugins WHERE plugin_id = ?)", ownerID)
	default:
		q = q.Where("id = ?", ownerID)
	}
	var deps []models.Deployment
	if err := q.Find(&deps).Error; err != nil {
		return nil, fmt.Errorf("list deployments using %s %d: %w", kind, ownerID, err)
	}
	return deps, nil
}

// mergeProblem is a merged graph that does not validate.
type mergeProblem struct {
	dep       models.Deployment
	graphType string
	err       error
}

// mergedProblems validates the graph of each type each deployment executes
// (merged, with its role tasks: see graphTasks), in order; a type no level
// defines is no problem.
func mergedProblems(tx *gorm.DB, deps []models.Deployment, types []string) ([]mergeProblem, error) {
	var out []mergeProblem
	for i := range deps {
		for _, typ := range types {
			g, err := graphTasks(tx, &deps[i], typ)
			if errors.Is(err, models.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if err := plan.Validate(g.Tasks); err != nil {
				out = append(out, mergeProblem{dep: deps[i], graphType: typ, err: err})
			}
		}
	}
	return out, nil
}

// newProblem returns the first problem of after that before did not have.
func newProblem(before, after []mergeProblem) *mergeProblem {
	had := make(map[string]bool, len(before))
	for _, p := range before {
		had[fmt.Sprintf("%d/%s", p.dep.ID, p.graphType)] = true
	}
	for i, p := range after {
		if !had[fmt.Sprintf("%d/%s", p.dep.ID, p.graphType)] {
			return &after[i]
		}
	}
	return nil
}
