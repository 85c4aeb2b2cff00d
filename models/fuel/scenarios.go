package fuel

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/nodeexpr"
)

// DeployChangesScenario is the built-in scenario that committing a snapshot
// starts: provision the new nodes, then deploy the affected ones.
const DeployChangesScenario = "deploy-changes"

// Scenario is a named, ordered list of acts (Fuel's scenarios): executing it
// runs every act's graph type, one after another, as the graphs of one
// transaction, each on the nodes its act selects.
type Scenario struct {
	ID          int64  `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	// Builtin scenarios ship with anneal (scenarios/*.yaml) and are
	// upserted at start; they cannot be deleted.
	Builtin   bool          `json:"builtin"`
	Acts      []ScenarioAct `json:"scenario" gorm:"foreignKey:ScenarioID"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// ScenarioAct is one step of a scenario: a graph type and its nodes.
type ScenarioAct struct {
	ID         int64 `json:"id"`
	ScenarioID int64 `json:"-"`
	// Position is the act's order in its scenario, from 1.
	Position  int      `json:"position"`
	GraphType string   `json:"graph_type"`
	Nodes     ActNodes `json:"nodes"`
	// MaxNodesInFlight and FailureThreshold (percent of failed nodes that
	// aborts the rest) override the transaction's defaults for this act;
	// nil keeps the default.
	MaxNodesInFlight *int      `json:"max_nodes_in_flight"`
	FailureThreshold *int      `json:"failure_threshold"`
	CreatedAt        time.Time `json:"-"`
}

// ActNodes selects the nodes of an act: explicit ids, a CEL expression over
// each node (see package nodeexpr), or, with neither, every node of the
// deployment. Stored as the JSON object {"ids": [...]}, {"expr": "..."} or
// {}; the API shows the same object, or null for all nodes.
type ActNodes struct {
	IDs  []int64 `json:"ids,omitempty"`
	Expr string  `json:"expr,omitempty"`
}

// All reports whether the act runs on every node of the deployment.
func (n ActNodes) All() bool { return len(n.IDs) == 0 && n.Expr == "" }

// MarshalJSON shows all nodes as null.
func (n ActNodes) MarshalJSON() ([]byte, error) {
	if n.All() {
		return []byte("null"), nil
	}
	type plain ActNodes
	return json.Marshal(plain(n))
}

// Value stores the selection as a JSON object.
func (n ActNodes) Value() (driver.Value, error) {
	type plain ActNodes
	b, err := json.Marshal(plain(n))
	return string(b), err
}

// Scan reads the stored JSON object.
func (n *ActNodes) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*n = ActNodes{}
		return nil
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("scan act nodes: unexpected %T", src)
	}
	type plain ActNodes
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("scan act nodes: %w", err)
	}
	*n = ActNodes(p)
	return nil
}

// ScenarioInput is the body of POST /scenarios, and the shape of a built-in
// scenario's YAML document.
type ScenarioInput struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Acts        []ActInput `json:"scenario"`
}

// ActInput is one act as given. Nodes is a JSON array of node ids, an
// object {"expr": "<CEL>"} ("yaql_exp" is accepted as an alias of "expr",
// as the seed names it, but the expression is CEL) or {"ids": [...]}, or
// absent/null for all nodes of the deployment.
type ActInput struct {
	GraphType        string          `json:"graph_type"`
	Nodes            json.RawMessage `json:"nodes"`
	MaxNodesInFlight *int            `json:"max_nodes_in_flight"`
	FailureThreshold *int            `json:"failure_threshold"`
}

// Limits of a scenario.
const (
	maxScenarioName = 100
	maxScenarioDesc = 4000
	maxScenarioActs = 100
	maxActNodeIDs   = 10000
)

var scenarioNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validateScenario checks a scenario completely and returns its acts. Every
// error is an InputError naming the field, e.g. "scenario[1].nodes.expr"; a
// bad expression carries its line and column in the reason and the details.
func validateScenario(tx *gorm.DB, in ScenarioInput) ([]ScenarioAct, error) {
	switch {
	case in.Name == "":
		return nil, models.Invalid("name", "is required")
	case len(in.Name) > maxScenarioName:
		return nil, models.Invalid("name", "must be at most %d characters", maxScenarioName)
	case !scenarioNameRe.MatchString(in.Name):
		return nil, models.Invalid("name", "%q may contain only letters, digits, '.', '_' and '-', and must start with a letter or digit", in.Name)
	case len(in.Description) > maxScenarioDesc:
		return nil, models.Invalid("description", "must be at most %d characters", maxScenarioDesc)
	case len(in.Acts) == 0:
		return nil, models.Invalid("scenario", "must list at least one act, e.g. [{\"graph_type\": \"deployment\"}]")
	case len(in.Acts) > maxScenarioActs:
		return nil, models.Invalid("scenario", "has %d acts; at most %d are allowed", len(in.Acts), maxScenarioActs)
	}
	acts := make([]ScenarioAct, len(in.Acts))
	for i, a := range in.Acts {
		field := fmt.Sprintf("scenario[%d]", i)
		if err := ValidateGraphType(a.GraphType); err != nil {
			var ie *models.InputError
			if errors.As(err, &ie) {
				return nil, models.Invalid(field+".graph_type", "%s", ie.Reason)
			}
			return nil, err
		}
		nodes, err := parseActNodes(field+".nodes", a.Nodes)
		if err != nil {
			return nil, err
		}
		if a.MaxNodesInFlight != nil && (*a.MaxNodesInFlight < 1 || *a.MaxNodesInFlight > models.MaxNodesInFlight) {
			return nil, models.Invalid(field+".max_nodes_in_flight", "must be at least 1 and at most %d (or omitted for the transaction's default), not %d", models.MaxNodesInFlight, *a.MaxNodesInFlight)
		}
		if a.FailureThreshold != nil && (*a.FailureThreshold < 0 || *a.FailureThreshold > 100) {
			return nil, models.Invalid(field+".failure_threshold", "is a percentage of failed nodes: it must be between 0 and 100, not %d", *a.FailureThreshold)
		}
		acts[i] = ScenarioAct{
			Position: i + 1, GraphType: a.GraphType, Nodes: nodes,
			MaxNodesInFlight: a.MaxNodesInFlight, FailureThreshold: a.FailureThreshold,
		}
	}
	// Explicit node ids must name existing nodes (their deployment is only
	// known when the scenario runs).
	for i, a := range acts {
		if len(a.Nodes.IDs) == 0 {
			continue
		}
		var found []int64
		if err := tx.Model(&models.Node{}).Where("id IN ?", a.Nodes.IDs).Pluck("id", &found).Error; err != nil {
			return nil, fmt.Errorf("check nodes of act %d: %w", i+1, err)
		}
		have := map[int64]bool{}
		for _, id := range found {
			have[id] = true
		}
		for j, id := range a.Nodes.IDs {
			if !have[id] {
				return nil, models.Invalid(fmt.Sprintf("scenario[%d].nodes[%d]", i, j), "no node with id %d", id)
			}
		}
	}
	return acts, nil
}

// parseActNodes reads an act's nodes: absent or null (all nodes), an array
// of node ids, or an object with exactly one of "expr" (alias "yaql_exp")
// and "ids".
func parseActNodes(field string, raw json.RawMessage) (ActNodes, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ActNodes{}, nil
	}
	switch raw[0] {
	case '[':
		ids, err := parseNodeIDs(field, raw)
		return ActNodes{IDs: ids}, err
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return ActNodes{}, models.Invalid(field, "malformed object: %v", err)
		}
		var keys []string
		for _, k := range sortedKeys(obj) {
			switch k {
			case "expr", "yaql_exp", "ids":
				keys = append(keys, k)
			default:
				return ActNodes{}, models.Invalid(field+"."+k, "unknown field; give {\"expr\": \"<CEL expression>\"} (\"yaql_exp\" is accepted as its alias) or {\"ids\": [node ids]}")
			}
		}
		if len(keys) != 1 {
			return ActNodes{}, models.Invalid(field, "give exactly one of \"expr\" (or its alias \"yaql_exp\") and \"ids\", not %s", describeKeys(keys))
		}
		key := keys[0]
		if key == "ids" {
			if v := bytes.TrimSpace(obj[key]); len(v) == 0 || v[0] != '[' {
				return ActNodes{}, models.Invalid(field+".ids", "must be a list of node ids")
			}
			ids, err := parseNodeIDs(field+".ids", obj[key])
			return ActNodes{IDs: ids}, err
		}
		var expr string
		if err := json.Unmarshal(obj[key], &expr); err != nil {
			return ActNodes{}, models.Invalid(field+"."+key, "must be a string holding a CEL expression over node, e.g. \"'compute' in node.roles\"")
		}
		if _, err := nodeexpr.Compile(expr); err != nil {
			return ActNodes{}, expressionError(field+"."+key, expr, err)
		}
		return ActNodes{Expr: expr}, nil
	default:
		return ActNodes{}, models.Invalid(field, "must be a list of node ids, an object {\"expr\": \"<CEL expression>\"}, or omitted for all nodes of the deployment")
	}
}

func describeKeys(keys []string) string {
	if len(keys) == 0 {
		return "neither"
	}
	return "both " + strings.Join(keys, " and ")
}

// expressionError is bad input for a CEL expression, with its position.
func expressionError(field, expr string, err error) error {
	var ce *nodeexpr.Error
	if !errors.As(err, &ce) {
		return err
	}
	details := map[string]any{"expression": expr}
	if ce.Line > 0 {
		details["line"], details["column"] = ce.Line, ce.Column
	}
	if len(ce.Issues) > 0 {
		details["issues"] = ce.Issues
	}
	return &models.InputError{Field: field, Reason: "bad expression: " + ce.Error(), Details: details}
}

func parseNodeIDs(field string, raw json.RawMessage) ([]int64, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var items []any
	if err := dec.Decode(&items); err != nil {
		return nil, models.Invalid(field, "must be a list of node ids: %v", err)
	}
	if len(items) == 0 {
		return nil, models.Invalid(field, "is an empty list; list node ids, or omit nodes for all nodes of the deployment")
	}
	if len(items) > maxActNodeIDs {
		return nil, models.Invalid(field, "lists %d nodes; at most %d are allowed (use an expression)", len(items), maxActNodeIDs)
	}
	ids := make([]int64, len(items))
	seen := map[int64]int{}
	for j, item := range items {
		n, ok := item.(json.Number)
		var id int64
		var err error
		if ok {
			id, err = strconv.ParseInt(string(n), 10, 64)
		}
		if !ok || err != nil || id <= 0 {
			return nil, models.Invalid(fmt.Sprintf("%s[%d]", field, j), "must be a node id (a positive integer), not %s", jsonText(item))
		}
		if k, dup := seen[id]; dup {
			return nil, models.Invalid(fmt.Sprintf("%s[%d]", field, j), "node %d is already listed at [%d]", id, k)
		}
		seen[id] = j
		ids[j] = id
	}
	return ids, nil
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// CreateScenario validates and creates a scenario with its acts in one
// database transaction. A taken name is a conflict.
func (s *Store) CreateScenario(ctx context.Context, in ScenarioInput) (*Scenario, error) {
	var out *Scenario
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		acts, err := validateScenario(tx, in)
		if err != nil {
			return err
		}
		var count int64
		if err := tx.Model(&Scenario{}).Where("name = ?", in.Name).Count(&count).Error; err != nil {
			return fmt.Errorf("check scenario name: %w", err)
		}
		if count > 0 {
			return &models.ConflictError{Reason: fmt.Sprintf("a scenario named %q already exists", in.Name)}
		}
		sc := &Scenario{Name: in.Name, Description: in.Description}
		if err := tx.Omit("Acts").Create(sc).Error; err != nil {
			return fmt.Errorf("create scenario %q: %w", in.Name, models.UniqueViolation(err, fmt.Sprintf("a scenario named %q already exists", in.Name)))
		}
		if err := insertActs(tx, sc, acts); err != nil {
			return err
		}
		out = sc
		return nil
	})
	return out, err
}

func insertActs(tx *gorm.DB, sc *Scenario, acts []ScenarioAct) error {
	for i := range acts {
		acts[i].ScenarioID = sc.ID
	}
	if err := tx.Create(&acts).Error; err != nil {
		return fmt.Errorf("create acts of scenario %q: %w", sc.Name, err)
	}
	sc.Acts = acts
	return nil
}

// Scenarios lists every scenario with its acts, in creation order.
func (s *Store) Scenarios(ctx context.Context) ([]Scenario, error) {
	var out []Scenario
	err := s.DB.WithContext(ctx).Preload("Acts", func(db *gorm.DB) *gorm.DB { return db.Order("position") }).
		Order("id").Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list scenarios: %w", err)
	}
	return out, nil
}

// Scenario loads a scenario by name with its acts.
func (s *Store) Scenario(ctx context.Context, name string) (*Scenario, error) {
	return findScenario(s.DB.WithContext(ctx), name)
}

func findScenario(tx *gorm.DB, name string) (*Scenario, error) {
	var sc Scenario
	err := tx.Preload("Acts", func(db *gorm.DB) *gorm.DB { return db.Order("position") }).
		Where("name = ?", name).Take(&sc).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("scenario", strconv.Quote(name))
	}
	if err != nil {
		return nil, fmt.Errorf("load scenario %q: %w", name, err)
	}
	return &sc, nil
}

// DeleteScenario deletes a scenario and its acts; a built-in one is a
// conflict.
func (s *Store) DeleteScenario(ctx context.Context, name string) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		sc, err := findScenario(tx, name)
		if err != nil {
			return err
		}
		if sc.Builtin {
			return &models.ConflictError{Reason: fmt.Sprintf("scenario %q is built in (shipped with anneal and restored at every start); it cannot be deleted", name)}
		}
		if err := tx.Delete(&Scenario{}, sc.ID).Error; err != nil {
			return fmt.Errorf("delete scenario %q: %w", name, err)
		}
		return nil
	})
}

// ParseScenarioYAML decodes a scenario document in the shape of the POST
// /scenarios body (YAML, or JSON since YAML is a superset), refusing
// unknown fields.
func ParseScenarioYAML(doc []byte) (*ScenarioInput, error) {
	var generic any
	if err := yaml.Unmarshal(doc, &generic); err != nil {
		return nil, &models.InputError{Status: 400, Field: "body", Reason: "malformed scenario YAML: " + err.Error()}
	}
	buf, err := json.Marshal(generic)
	if err != nil {
		return nil, &models.InputError{Status: 400, Field: "body", Reason: "scenario YAML is not representable as JSON: " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	var in ScenarioInput
	if err := dec.Decode(&in); err != nil {
		return nil, &models.InputError{Status: 400, Field: "body", Reason: "malformed scenario: " + err.Error()}
	}
	return &in, nil
}

// EnsureBuiltinScenarios upserts the built-in scenarios, one YAML document
// each (see scenarios.Builtins): a scenario of the same name is replaced
// and marked built in. Call it at start, after Migrate; it is idempotent and
// safe when several processes start at once.
func EnsureBuiltinScenarios(ctx context.Context, store *Store, docs ...[]byte) error {
	for i, doc := range docs {
		in, err := ParseScenarioYAML(doc)
		if err != nil {
			return fmt.Errorf("built-in scenario #%d: %w", i+1, err)
		}
		err = store.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			acts, err := validateScenario(tx, *in)
			if err != nil {
				return err
			}
			sc := &Scenario{Name: in.Name, Description: in.Description, Builtin: true}
			// The upsert locks the row: a concurrent start waits for this one.
			err = tx.Raw(`INSERT INTO scenarios (name, description, builtin) VALUES (?, ?, true)
				ON CONFLICT (name) DO UPDATE SET description = excluded.description, builtin = true, updated_at = now()
				RETURNING id`, in.Name, in.Description).Scan(&sc.ID).Error
			if err != nil {
				return fmt.Errorf("upsert scenario %q: %w", in.Name, err)
			}
			if err := tx.Where("scenario_id = ?", sc.ID).Delete(&ScenarioAct{}).Error; err != nil {
				return fmt.Errorf("replace acts of scenario %q: %w", in.Name, err)
			}
			return insertActs(tx, sc, acts)
		})
		if err != nil {
			return fmt.Errorf("built-in scenario %q: %w", in.Name, err)
		}
	}
	return nil
}

// ScenarioExecuteInput is the body of POST /scenarios/:name/execute.
type ScenarioExecuteInput struct {
	Deployment string
	DryRun     bool
	Force      bool
	// MaxNodesInFlight and FailureThreshold are the transaction's defaults
	// for the acts that do not set their own (see ExecuteInput).
	MaxNodesInFlight int
	FailureThreshold *int
}

// ScenarioPlan is a scenario resolved against a deployment's nodes: the
// execute request it becomes (one graph per act that selects a node) and
// what each act selected.
type ScenarioPlan struct {
	Scenario *Scenario
	Input    ExecuteInput
	Acts     []ActSelection
}

// ActSelection is what one act selected.
type ActSelection struct {
	Position  int    `json:"position"`
	GraphType string `json:"graph_type"`
	// AllNodes: the act has no node filter and runs on every node the
	// annealer may give work.
	AllNodes bool `json:"all_nodes,omitempty"`
	// Nodes are the selected node ids that get the graph.
	Nodes []int64 `json:"nodes"`
	// Unavailable are nodes the act selected that are not allocated, alive
	// and available: the annealer gives them nothing.
	Unavailable []int64 `json:"unavailable,omitempty"`
	// Skipped: the act selected no node that can run; it is not part of
	// the transaction.
	Skipped bool   `json:"skipped"`
	Reason  string `json:"reason,omitempty"`
	// Graph is the index of the act's graph in the transaction.
	Graph *int `json:"graph,omitempty"`
}

// PrepareScenario evaluates every act of a scenario over the nodes of a
// deployment, at the time of the call (the selections of later acts do not
// see what earlier acts change), and returns the execute request: one graph
// per act that selects at least one node, in act order, with the act's
// nodes. Acts that select nothing are skipped; if all are, it is bad input.
// Give the result's Input to CreateTransaction and pass its error through
// MapError.
func (s *Store) PrepareScenario(ctx context.Context, name string, in ScenarioExecuteInput) (*ScenarioPlan, error) {
	if in.Deployment == "" {
		return nil, models.Invalid("deployment", "is required (a deployment name or id)")
	}
	sc, err := s.Scenario(ctx, name)
	if err != nil {
		return nil, err
	}
	dep, err := models.DeploymentInField(s.DB.WithContext(ctx), "deployment", in.Deployment)
	if err != nil {
		return nil, err
	}
	nodes, err := s.Nodes(ctx, dep.ID)
	if err != nil {
		return nil, err
	}
	exprNodes := make([]nodeexpr.Node, len(nodes))
	byID := map[int64]*models.Node{}
	var runnable []int64
	for i := range nodes {
		n := &nodes[i]
		byID[n.ID] = n
		exprNodes[i] = ExprNode(n)
		if plannableNode(n) {
			runnable = append(runnable, n.ID)
		}
	}
	out := &ScenarioPlan{Scenario: sc, Input: ExecuteInput{
		Deployment: in.Deployment, DryRun: in.DryRun, Force: in.Force,
		MaxNodesInFlight: in.MaxNodesInFlight, FailureThreshold: in.FailureThreshold,
	}}
	for i, act := range sc.Acts {
		field := fmt.Sprintf("scenario[%d].nodes", i)
		sel := ActSelection{Position: act.Position, GraphType: act.GraphType, Nodes: []int64{}}
		var chosen []int64
		switch {
		case act.Nodes.All():
			sel.AllNodes = true
			chosen = runnable
		case act.Nodes.Expr != "":
			ids, err := nodeexpr.Select(act.Nodes.Expr, exprNodes)
			var ce *nodeexpr.Error
			if errors.As(err, &ce) {
				return nil, expressionError(field+".expr", act.Nodes.Expr, err)
			}
			if err != nil {
				return nil, &models.InputError{Field: field + ".expr", Reason: fmt.Sprintf("scenario %q act %d: %v", sc.Name, act.Position, err),
					Details: map[string]any{"expression": act.Nodes.Expr}}
			}
			chosen = ids
		default:
			for j, id := range act.Nodes.IDs {
				if byID[id] == nil {
					return nil, models.Invalid(fmt.Sprintf("%s[%d]", field, j), "node %d is not in deployment %q", id, dep.Name)
				}
			}
			chosen = act.Nodes.IDs
		}
		for _, id := range chosen {
			if plannableNode(byID[id]) {
				sel.Nodes = append(sel.Nodes, id)
			} else {
				sel.Unavailable = append(sel.Unavailable, id)
			}
		}
		if len(sel.Nodes) == 0 {
			sel.Skipped = true
			switch {
			case len(sel.Unavailable) > 0:
				sel.Reason = "every node it selects is unallocated, dead or unavailable"
			case act.Nodes.Expr != "":
				sel.Reason = "the expression selects no node"
			default:
				sel.Reason = "the deployment has no node the annealer may give work"
			}
			out.Acts = append(out.Acts, sel)
			continue
		}
		g := GraphRequest{Type: act.GraphType, FailureThreshold: act.FailureThreshold}
		if act.MaxNodesInFlight != nil {
			g.MaxNodesInFlight = *act.MaxNodesInFlight
		}
		if !sel.AllNodes {
			g.Nodes = sel.Nodes
		}
		idx := len(out.Input.Graphs)
		sel.Graph = &idx
		out.Input.Graphs = append(out.Input.Graphs, g)
		out.Acts = append(out.Acts, sel)
	}
	if len(out.Input.Graphs) == 0 {
		return nil, &models.InputError{Field: "deployment", Reason: fmt.Sprintf("no act of scenario %q selects a node of deployment %q that can run: nothing to do", sc.Name, dep.Name),
			Details: map[string]any{"acts": out.Acts, "nothing_to_run": true}}
	}
	return out, nil
}

// plannableNode: the annealer gives work only to allocated, alive and
// available nodes (as plannableNodes in transactions.go).
func plannableNode(n *models.Node) bool { return n != nil && n.Allocated && n.Alive && n.Available }

// ExprNode is what a node-selection expression sees of a node.
func ExprNode(n *models.Node) nodeexpr.Node {
	errType := ""
	if n.ErrorType != nil {
		errType = *n.ErrorType
	}
	return nodeexpr.Node{
		ID: n.ID, Name: n.Name, Status: n.Status, Roles: n.Roles, Tags: n.Tags,
		Admin: n.Admin, Alive: n.Alive, Attributes: n.Attributes, Progress: int64(n.Progress), ErrorType: errType,
	}
}

var graphFieldRe = regexp.MustCompile(`^graphs\[(\d+)\](\.type)?`)

// MapError renames the fields of CreateTransaction's input errors from the
// transaction's graphs ("graphs[1].type") to the scenario's acts
// ("scenario[2].graph_type"), so the caller sees which act is wrong.
func (p *ScenarioPlan) MapError(err error) error {
	var ie *models.InputError
	if !errors.As(err, &ie) {
		return err
	}
	m := graphFieldRe.FindStringSubmatch(ie.Field)
	if m == nil {
		return err
	}
	g, _ := strconv.Atoi(m[1])
	for i, sel := range p.Acts {
		if sel.Graph != nil && *sel.Graph == g {
			field := fmt.Sprintf("scenario[%d]", i)
			if m[2] != "" {
				field += ".graph_type"
			}
			out := *ie
			out.Field = field + strings.TrimPrefix(ie.Field, m[0])
			out.Reason = fmt.Sprintf("act %d (%s): %s", sel.Position, sel.GraphType, ie.Reason)
			return &out
		}
	}
	return err
}
