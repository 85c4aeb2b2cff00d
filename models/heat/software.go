package heat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// DefaultSoftwareGroup is the group of a config that names none: the
// agent's built-in shell script hook.
const DefaultSoftwareGroup = "script"

// DefaultSoftwareTimeoutSec bounds a round of a software deployment when
// the request sets no timeout_sec: waiting for its get_attr references and
// for the agent's signal together.
const DefaultSoftwareTimeoutSec = 600

// AcceptForeignConfigs is the node attribute that lets a node take software
// deployments made on behalf of another deployment (cluster).
const AcceptForeignConfigs = "accept_foreign_configs"

// SoftwareIODef is one entry of a config's inputs or outputs schema.
type SoftwareIODef struct {
	Name        string `json:"name"`
	Type        string `json:"type,omitempty"`
	Description string `json:"description,omitempty"`
	Default     any    `json:"default,omitempty"`
	// ErrorOutput (outputs only): any non-empty value signalled for this
	// output fails the deployment.
	ErrorOutput bool `json:"error_output,omitempty"`
	// Hidden (inputs only; newer Heat's hidden parameters, "sensitive" is
	// read as a synonym) marks a sensitive input: it has no default, and a
	// deployment gives its value as a secret reference,
	// {"get_secret": "<name>"}, resolved only in what the node's agent
	// receives.
	Hidden bool `json:"hidden,omitempty"`
	// Sensitive is read as Hidden and not stored.
	Sensitive bool `json:"sensitive,omitempty" gorm:"-"`
}

// SoftwareConfig is an immutable script or document with its inputs and
// outputs schemas; its group names the hook that runs it on a node.
type SoftwareConfig struct {
	ID           int64           `json:"id"`
	Name         string          `json:"name"`
	Group        string          `json:"group" gorm:"column:group"`
	Config       string          `json:"config"`
	Inputs       []SoftwareIODef `json:"inputs" gorm:"serializer:json"`
	Outputs      []SoftwareIODef `json:"outputs" gorm:"serializer:json"`
	Options      map[string]any  `json:"options" gorm:"serializer:json"`
	DeploymentID *int64          `json:"deployment_id"`
	CreatedAt    time.Time       `json:"created_at"`
}

// ErrorOutputs names the outputs flagged error_output.
func (c *SoftwareConfig) ErrorOutputs() []string {
	var out []string
	for _, o := range c.Outputs {
		if o.ErrorOutput {
			out = append(out, o.Name)
		}
	}
	return out
}

// SoftwareDeployment binds a config to a node with input values. Each
// action starts a round, run by the workflow WorkflowID.
type SoftwareDeployment struct {
	ID             int64          `json:"id"`
	ConfigID       int64          `json:"config_id"`
	NodeID         int64          `json:"server_id"`
	DeploymentID   *int64         `json:"deployment_id"`
	InputValues    map[string]any `json:"input_values" gorm:"serializer:json"`
	ResolvedInputs map[string]any `json:"resolved_inputs" gorm:"serializer:json"`
	Action         string         `json:"action"`
	Status         string         `json:"status"`
	StatusReason   string         `json:"status_reason"`
	OutputValues   map[string]any `json:"output_values" gorm:"serializer:json"`
	TimeoutSec     int            `json:"timeout_sec"`
	Round          int            `json:"round"`
	SignaledRound  int            `json:"-"`
	Signal         storedSignal   `json:"-" gorm:"serializer:json"`
	WorkflowID     string         `json:"workflow_id"`
	// Deleting: DELETE was asked; the current round is its UNDEPLOY, after
	// which the deployment is removed (kept, FAILED, if UNDEPLOY fails).
	Deleting  bool      `json:"deleting"`
	Version   int64     `json:"-" gorm:"->"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// HeatStatus is Heat's resource status for the action and status:
	// DEPLOY, REDEPLOY, UNDEPLOY map to CREATE, UPDATE, DELETE and
	// WAITING/IN_PROGRESS, COMPLETE, FAILED to IN_PROGRESS, COMPLETE,
	// FAILED (the seed's mapping), e.g. DELETE_IN_PROGRESS.
	HeatStatus string `json:"heat_status" gorm:"-"`

	// Filled by the queries that join them.
	ServerName string          `json:"server_name,omitempty" gorm:"-"`
	Config     *SoftwareConfig `json:"config,omitempty" gorm:"-"`
}

// HeatResourceStatus maps a deployment's action and status to Heat's
// resource status (the seed's table): DEPLOY→CREATE, REDEPLOY→UPDATE,
// UNDEPLOY→DELETE; WAITING and IN_PROGRESS→IN_PROGRESS, COMPLETE→COMPLETE,
// FAILED→FAILED.
func HeatResourceStatus(action, status string) string {
	a := map[string]string{contract.ActionDeploy: "CREATE", contract.ActionRedeploy: "UPDATE", contract.ActionUndeploy: "DELETE"}[action]
	st := map[string]string{contract.SoftwareWaiting: "IN_PROGRESS", contract.SoftwareInProgress: "IN_PROGRESS",
		contract.SoftwareComplete: "COMPLETE", contract.SoftwareFailed: "FAILED"}[status]
	if a == "" || st == "" {
		return ""
	}
	return a + "_" + st
}

// storedSignal is the agent's last signal, as kept in Postgres.
type storedSignal struct {
	Outputs      map[string]any `json:"outputs,omitempty"`
	Stdout       string         `json:"deploy_stdout"`
	Stderr       string         `json:"deploy_stderr"`
	StatusCode   int            `json:"deploy_status_code"`
	StatusReason string         `json:"deploy_status_reason,omitempty"`
}

var (
	softwareGroupRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,99}$`)
	softwareNameRe  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,99}$`)
	softwareTypes   = map[string]string{"string": "String", "number": "Number", "commadelimitedlist": "CommaDelimitedList", "json": "Json", "boolean": "Boolean"}
)

// SoftwareConfigInput creates a config.
type SoftwareConfigInput struct {
	Name    string          `json:"name"`
	Group   string          `json:"group"`
	Config  string          `json:"config"`
	Inputs  []SoftwareIODef `json:"inputs"`
	Outputs []SoftwareIODef `json:"outputs"`
	Options map[string]any  `json:"options"`
	// Deployment (name or id) binds the config to one deployment (cluster).
	Deployment string `json:"deployment"`
}

func checkSchema(field string, defs []SoftwareIODef, outputs bool) ([]SoftwareIODef, error) {
	if err := models.MaxItems(field, len(defs), models.MaxListLen); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	out := make([]SoftwareIODef, 0, len(defs))
	for i, d := range defs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if d.Name == "" {
			return nil, models.Invalid(f+".name", "is required")
		}
		if !softwareNameRe.MatchString(d.Name) {
			return nil, models.Invalid(f+".name", "%q must be a letter or _ then letters, digits or _ (it becomes an environment variable and a file name)", d.Name)
		}
		if strings.HasPrefix(d.Name, "deploy_") {
			return nil, models.Invalid(f+".name", "%q: names starting with deploy_ are reserved (deploy_server_id, deploy_action, deploy_stdout, ...)", d.Name)
		}
		if seen[d.Name] {
			return nil, models.Invalid(f+".name", "%q is declared twice", d.Name)
		}
		seen[d.Name] = true
		if d.Type == "" {
			d.Type = "String"
		}
		// Matched exactly, as Heat spells them.
		if t, ok := softwareTypes[strings.ToLower(d.Type)]; !ok || t != d.Type {
			return nil, models.Invalid(f+".type", "%q is not one of String, Number, CommaDelimitedList, Json, Boolean (exactly, case matters)", models.Clip(d.Type))
		}
		if err := models.ValidLine(f+".description", d.Description, models.MaxLineLen); err != nil {
			return nil, err
		}
		if d.ErrorOutput && !outputs {
			return nil, models.Invalid(f+".error_output", "only outputs can be error outputs")
		}
		if d.Default != nil && outputs {
			return nil, models.Invalid(f+".default", "outputs have no default")
		}
		d.Hidden, d.Sensitive = d.Hidden || d.Sensitive, false
		if d.Hidden && outputs {
			return nil, models.Invalid(f+".hidden", "only inputs can be hidden (outputs are redacted when they hold a secret)")
		}
		if d.Hidden && d.Default != nil {
			return nil, models.Invalid(f+".default", "a hidden input has no default (it would be stored in plain text); deployments give it as {\"get_secret\": \"<name>\"}")
		}
		out = append(out, d)
	}
	return out, nil
}

// CreateSoftwareConfig validates and stores a config. Configs are never
// updated: a change is a new config.
func (s *Store) CreateSoftwareConfig(ctx context.Context, in SoftwareConfigInput) (*SoftwareConfig, error) {
	if err := models.ValidName("name", "software config", in.Name); err != nil {
		return nil, err
	}
	if err := models.ValidText("config", in.Config, models.MaxTextLen); err != nil {
		return nil, err
	}
	if err := models.ValidLine("deployment", in.Deployment, models.MaxLineLen); err != nil {
		return nil, err
	}
	if err := models.ValidateMap("options", in.Options); err != nil {
		return nil, err
	}
	if in.Group == "" {
		in.Group = DefaultSoftwareGroup
	}
	if !softwareGroupRe.MatchString(in.Group) {
		return nil, models.Invalid("group", "%q must be letters, digits and . _ : + - (it names the hook that runs the config)", in.Group)
	}
	inputs, err := checkSchema("inputs", in.Inputs, false)
	if err != nil {
		return nil, err
	}
	outputs, err := checkSchema("outputs", in.Outputs, true)
	if err != nil {
		return nil, err
	}
	if in.Options == nil {
		in.Options = map[string]any{}
	}
	cfg := &SoftwareConfig{Name: in.Name, Group: in.Group, Config: in.Config, Inputs: inputs, Outputs: outputs, Options: in.Options}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if in.Deployment != "" {
			dep, err := models.DeploymentInField(tx, "deployment", in.Deployment)
			if err != nil {
				return err
			}
			cfg.DeploymentID = &dep.ID
		}
		if err := tx.Create(cfg).Error; err != nil {
			return fmt.Errorf("create software config: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// SoftwareConfigs lists the configs.
func (s *Store) SoftwareConfigs(ctx context.Context) ([]SoftwareConfig, error) {
	cfgs := []SoftwareConfig{}
	if err := s.DB.WithContext(ctx).Order("id").Find(&cfgs).Error; err != nil {
		return nil, fmt.Errorf("list software configs: %w", err)
	}
	return cfgs, nil
}

// SoftwareConfig loads a config.
func (s *Store) SoftwareConfig(ctx context.Context, id int64) (*SoftwareConfig, error) {
	var cfg SoftwareConfig
	err := s.DB.WithContext(ctx).Take(&cfg, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("software config", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load software config %d: %w", id, err)
	}
	return &cfg, nil
}

// DeleteSoftwareConfig deletes a config no deployment uses.
func (s *Store) DeleteSoftwareConfig(ctx context.Context, id int64) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var cfg SoftwareConfig
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&cfg, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("software config", id)
		}
		if err != nil {
			return fmt.Errorf("load software config %d: %w", id, err)
		}
		var users []int64
		if err := tx.Model(&SoftwareDeployment{}).Where("config_id = ?", id).Order("id").Limit(20).Pluck("id", &users).Error; err != nil {
			return fmt.Errorf("find deployments of software config %d: %w", id, err)
		}
		if len(users) > 0 {
			return &models.ConflictError{Reason: fmt.Sprintf("software config %d is used by software deployment(s) %s; delete them first", id, joinIDs(users))}
		}
		if err := tx.Delete(&SoftwareConfig{}, id).Error; err != nil {
			return fmt.Errorf("delete software config %d: %w", id, err)
		}
		return nil
	})
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ", ")
}

// SoftwareDeploymentInput creates a software deployment.
type SoftwareDeploymentInput struct {
	ConfigID int64
	// Server is the node's id or name.
	Server      string
	InputValues map[string]any
	Action      string
	TimeoutSec  int
	// Deployment (name or id), optional: the deployment (cluster) on whose
	// behalf the request is made; default the config's, else the node's.
	Deployment string
}

// getAttr recognises {"get_attr": [<deployment id>, "<output>"]}.
func getAttr(v any) (id int64, output string, isRef bool, err error) {
	m, ok := v.(map[string]any)
	if !ok {
		return 0, "", false, nil
	}
	raw, ok := m["get_attr"]
	if !ok {
		return 0, "", false, nil
	}
	if len(m) != 1 {
		return 0, "", true, errors.New(`a reference is {"get_attr": [<deployment id>, "<output name>"]} with no other key`)
	}
	list, ok := raw.([]any)
	if !ok || len(list) != 2 {
		return 0, "", true, errors.New(`get_attr takes [<deployment id>, "<output name>"]`)
	}
	switch n := list[0].(type) {
	case float64:
		id = int64(n)
		if float64(id) != n {
			return 0, "", true, errors.New("get_attr: the deployment id must be an integer")
		}
	case json.Number:
		if id, err = n.Int64(); err != nil {
			return 0, "", true, errors.New("get_attr: the deployment id must be an integer")
		}
	case int64:
		id = n
	case int:
		id = int64(n)
	case string:
		if id, err = strconv.ParseInt(n, 10, 64); err != nil {
			return 0, "", true, errors.New("get_attr: the deployment id must be an integer")
		}
	default:
		return 0, "", true, errors.New("get_attr: the deployment id must be an integer")
	}
	output, ok = list[1].(string)
	if !ok || output == "" {
		return 0, "", true, errors.New("get_attr: the output name must be a non-empty string")
	}
	return id, output, true, nil
}

// checkInputValues validates input values against a config's inputs schema
// and their references against the deployments they name.
//
// A value may be a secret reference, {"get_secret": "<name>"}, to a
// secret of the node's deployment (nodeDeployment), which must be set; a
// hidden input's value must be one.
func checkInputValues(tx *gorm.DB, cfg *SoftwareConfig, values map[string]any, self, nodeDeployment int64) error {
	declared := map[string]bool{}
	hidden := map[string]bool{}
	for _, in := range cfg.Inputs {
		declared[in.Name] = true
		hidden[in.Name] = in.Hidden
	}
	var refs []string
	for name, v := range values {
		if secret, ok := models.SecretRefName(v); ok {
			if err := models.ValidName("input_values."+name+"."+models.GetSecret, "secret", secret); err != nil {
				return err
			}
			refs = append(refs, secret)
		} else if hidden[name] {
			return models.Invalid("input_values."+name, "input %q is hidden: give its value as {\"get_secret\": \"<name>\"}, a secret of the node's deployment", name)
		}
	}
	missing, err := models.MissingSecrets(tx, nodeDeployment, refs)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		var dep models.Deployment
		if err := tx.Select("name").Take(&dep, nodeDeployment).Error; err != nil {
			return fmt.Errorf("load deployment %d: %w", nodeDeployment, err)
		}
		return models.MissingSecretsError("input_values", dep.Name, missing)
	}
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		field := "input_values." + name
		if !declared[name] {
			return models.Invalid(field, "software config %d (%s) declares no input %q", cfg.ID, cfg.Name, name)
		}
		id, output, isRef, err := getAttr(values[name])
		if err != nil {
			return models.Invalid(field, "%v", err)
		}
		if !isRef {
			continue
		}
		if id == self {
			return models.Invalid(field, "get_attr refers to this deployment itself")
		}
		var ref SoftwareDeployment
		err = tx.Take(&ref, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.Invalid(field, "get_attr refers to software deployment %d, which does not exist", id)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		var refCfg SoftwareConfig
		if err := tx.Take(&refCfg, ref.ConfigID).Error; err != nil {
			return fmt.Errorf("load software config %d: %w", ref.ConfigID, err)
		}
		if !hasOutput(&refCfg, output) {
			return models.Invalid(field, "get_attr: software deployment %d (config %s) has no output %q", id, refCfg.Name, output)
		}
	}
	return nil
}

func hasOutput(cfg *SoftwareConfig, name string) bool {
	switch name {
	case protocol.SignalStdout, protocol.SignalStderr, protocol.SignalStatusCode:
		return true
	}
	return slices.ContainsFunc(cfg.Outputs, func(o SoftwareIODef) bool { return o.Name == name })
}

func checkAction(action string, create bool) (string, error) {
	if action == "" && create {
		return contract.ActionDeploy, nil
	}
	// Matched exactly, as documented: "deploy" is not DEPLOY.
	switch a := action; a {
	case contract.ActionDeploy, contract.ActionRedeploy, contract.ActionUndeploy:
		if !create && a == contract.ActionDeploy {
			return "", models.Invalid("action", "a new round is REDEPLOY or UNDEPLOY")
		}
		return a, nil
	}
	return "", models.Invalid("action", "%q is not one of DEPLOY, REDEPLOY, UNDEPLOY", action)
}

func acceptsForeign(n *models.Node) bool {
	v, ok := n.Attributes[AcceptForeignConfigs]
	if !ok {
		return false
	}
	switch t := v.(type) {
	case bool:
		return t
	case string:
		b, _ := strconv.ParseBool(t)
		return b
	}
	return false
}

// CreateSoftwareDeployment validates and records a deployment (WAITING,
// round 1) and calls start (which starts its workflow) inside the same
// database transaction, so nothing is recorded if the start fails.
func (s *Store) CreateSoftwareDeployment(ctx context.Context, in SoftwareDeploymentInput, start func(*SoftwareDeployment) error) (*SoftwareDeployment, error) {
	if in.ConfigID == 0 {
		return nil, models.Invalid("config_id", "is required")
	}
	if in.ConfigID < 0 {
		return nil, models.Invalid("config_id", "is a software config id (1 or more), not %d", in.ConfigID)
	}
	if in.Server == "" {
		return nil, models.Invalid("server_id", "is required (a node id or name)")
	}
	if err := models.ValidLine("server_id", in.Server, models.MaxLineLen); err != nil {
		return nil, err
	}
	if err := models.ValidLine("deployment", in.Deployment, models.MaxLineLen); err != nil {
		return nil, err
	}
	if err := models.ValidateMap("input_values", in.InputValues); err != nil {
		return nil, err
	}
	action, err := checkAction(in.Action, true)
	if err != nil {
		return nil, err
	}
	if in.TimeoutSec == 0 {
		in.TimeoutSec = DefaultSoftwareTimeoutSec
	}
	if in.TimeoutSec < 1 || in.TimeoutSec > 7*24*3600 {
		return nil, models.Invalid("timeout_sec", "must be between 1 and 604800 seconds")
	}
	if in.InputValues == nil {
		in.InputValues = map[string]any{}
	}
	var d *SoftwareDeployment
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var cfg SoftwareConfig
		err := tx.Take(&cfg, in.ConfigID).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.Invalid("config_id", "no software config %d", in.ConfigID)
		}
		if err != nil {
			return fmt.Errorf("load software config %d: %w", in.ConfigID, err)
		}
		node, err := models.FindNode(tx, in.Server)
		if errors.Is(err, models.ErrNotFound) {
			return models.Invalid("server_id", "no node with id or name %q", in.Server)
		}
		if err != nil {
			return err
		}
		origin, err := s.softwareOrigin(tx, in.Deployment, &cfg, node)
		if err != nil {
			return err
		}
		if err := checkInputValues(tx, &cfg, in.InputValues, 0, node.DeploymentID); err != nil {
			return err
		}
		d = &SoftwareDeployment{
			ConfigID: cfg.ID, NodeID: node.ID, DeploymentID: &origin, InputValues: in.InputValues,
			ResolvedInputs: map[string]any{}, OutputValues: map[string]any{}, Action: action,
			Status: contract.SoftwareWaiting, TimeoutSec: in.TimeoutSec, Round: 1,
		}
		if err := tx.Omit("version").Create(d).Error; err != nil {
			return fmt.Errorf("create software deployment: %w", err)
		}
		d.WorkflowID = contract.SoftwareWorkflowID(d.ID)
		d.ServerName, d.Config = node.Name, &cfg
		d.HeatStatus = HeatResourceStatus(d.Action, d.Status)
		if err := start(d); err != nil { // may scope the workflow ID
			return err
		}
		if err := tx.Model(d).Update("workflow_id", d.WorkflowID).Error; err != nil {
			return fmt.Errorf("create software deployment: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// softwareOrigin applies the deployment policy: a node takes software
// deployments only on behalf of its own deployment (cluster), unless its
// attribute accept_foreign_configs is true. The origin is the request's
// deployment, else the config's, else the node's; a config bound to another
// deployment than the request's is refused too.
func (s *Store) softwareOrigin(tx *gorm.DB, ref string, cfg *SoftwareConfig, node *models.Node) (int64, error) {
	origin := node.DeploymentID
	if cfg.DeploymentID != nil {
		origin = *cfg.DeploymentID
	}
	if ref != "" {
		dep, err := models.DeploymentInField(tx, "deployment", ref)
		if err != nil {
			return 0, err
		}
		if cfg.DeploymentID != nil && *cfg.DeploymentID != dep.ID {
			return 0, fmt.Errorf("software config %d belongs to deployment %s, not to deployment %s: %w",
				cfg.ID, deploymentName(tx, *cfg.DeploymentID), dep.Name, models.ErrForbidden)
		}
		origin = dep.ID
	}
	if origin != node.DeploymentID && !acceptsForeign(node) {
		return 0, fmt.Errorf("node %s belongs to deployment %s and accepts software deployments only from it, not from deployment %s (set the node attribute %s to true to allow others): %w",
			node.Name, deploymentName(tx, node.DeploymentID), deploymentName(tx, origin), AcceptForeignConfigs, models.ErrForbidden)
	}
	return origin, nil
}

func deploymentName(tx *gorm.DB, id int64) string {
	var name string
	if err := tx.Model(&models.Deployment{}).Where("id = ?", id).Pluck("name", &name).Error; err != nil || name == "" {
		return strconv.FormatInt(id, 10)
	}
	return strconv.Quote(name)
}

// SoftwareDeploymentUpdate starts a new round of a deployment.
type SoftwareDeploymentUpdate struct {
	Action      string
	InputValues map[string]any // nil: keep
	TimeoutSec  int            // 0: keep
}

// UpdateSoftwareDeployment starts a new round (REDEPLOY or UNDEPLOY): the
// deployment goes back to WAITING under the next round number, and start
// (which starts the round's workflow run) is called inside the transaction.
func (s *Store) UpdateSoftwareDeployment(ctx context.Context, id int64, up SoftwareDeploymentUpdate, start func(*SoftwareDeployment) error) (*SoftwareDeployment, error) {
	action, err := checkAction(up.Action, false)
	if err != nil {
		return nil, err
	}
	if up.Action == "" {
		return nil, models.Invalid("action", "is required: REDEPLOY or UNDEPLOY")
	}
	if err := models.ValidateMap("input_values", up.InputValues); err != nil {
		return nil, err
	}
	if up.TimeoutSec != 0 && (up.TimeoutSec < 1 || up.TimeoutSec > 7*24*3600) {
		return nil, models.Invalid("timeout_sec", "must be between 1 and 604800 seconds")
	}
	var d SoftwareDeployment
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&d, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("software deployment", id)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		if d.Deleting && (d.Status == contract.SoftwareWaiting || d.Status == contract.SoftwareInProgress) {
			return &models.ConflictError{Reason: fmt.Sprintf("software deployment %d is being deleted (its UNDEPLOY round %d is %s); wait for it to end", id, d.Round, d.Status)}
		}
		var cfg SoftwareConfig
		if err := tx.Take(&cfg, d.ConfigID).Error; err != nil {
			return fmt.Errorf("load software config %d: %w", d.ConfigID, err)
		}
		if up.InputValues != nil {
			var nodeDep int64
			if err := tx.Model(&models.Node{}).Select("deployment_id").Where("id = ?", d.NodeID).Scan(&nodeDep).Error; err != nil {
				return fmt.Errorf("load the deployment of node %d: %w", d.NodeID, err)
			}
			if err := checkInputValues(tx, &cfg, up.InputValues, id, nodeDep); err != nil {
				return err
			}
			d.InputValues = up.InputValues
		}
		if up.TimeoutSec != 0 {
			d.TimeoutSec = up.TimeoutSec
		}
		d.Round++
		d.Action, d.Status, d.StatusReason = action, contract.SoftwareWaiting, ""
		// A new round after a failed delete is the operator changing
		// their mind: the deployment stays.
		d.Deleting = false
		err = tx.Exec(`UPDATE software_deployments SET round = ?, action = ?, status = ?, status_reason = '', input_values = ?,
deleting = false, timeout_sec = ?, version = nextval('software_deployment_version_seq'), updated_at = now() WHERE id = ?`,
			d.Round, d.Action, d.Status, swJSON(d.InputValues), d.TimeoutSec, id).Error
		if err != nil {
			return fmt.Errorf("start round %d of software deployment %d: %w", d.Round, id, err)
		}
		d.Config = &cfg
		return start(&d)
	})
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// StartSoftwareDelete starts the UNDEPLOY round of a deletion: the
// deployment gets the next round with action UNDEPLOY, WAITING, marked
// deleting, and start (which starts the round's workflow run, told to
// remove the deployment at its end) is called inside the transaction.
// timeoutSec, when not 0, replaces the deployment's timeout. A deployment
// whose delete is already under way is returned as it is (started false).
func (s *Store) StartSoftwareDelete(ctx context.Context, id int64, timeoutSec int, start func(*SoftwareDeployment) error) (d *SoftwareDeployment, started bool, err error) {
	if timeoutSec != 0 && (timeoutSec < 1 || timeoutSec > 7*24*3600) {
		return nil, false, models.Invalid("timeout_sec", "must be between 1 and 604800 seconds")
	}
	d = &SoftwareDeployment{}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(d, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("software deployment", id)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		if d.Deleting && (d.Status == contract.SoftwareWaiting || d.Status == contract.SoftwareInProgress) {
			return nil
		}
		var cfg SoftwareConfig
		if err := tx.Take(&cfg, d.ConfigID).Error; err != nil {
			return fmt.Errorf("load software config %d: %w", d.ConfigID, err)
		}
		if timeoutSec != 0 {
			d.TimeoutSec = timeoutSec
		}
		d.Round++
		d.Action, d.Status, d.StatusReason, d.Deleting = contract.ActionUndeploy, contract.SoftwareWaiting, "", true
		err = tx.Exec(`UPDATE software_deployments SET round = ?, action = ?, status = ?, status_reason = '', deleting = true,
timeout_sec = ?, version = nextval('software_deployment_version_seq'), updated_at = now() WHERE id = ?`,
			d.Round, d.Action, d.Status, d.TimeoutSec, id).Error
		if err != nil {
			return fmt.Errorf("start the UNDEPLOY round %d of software deployment %d: %w", d.Round, id, err)
		}
		d.Config = &cfg
		started = true
		return start(d)
	})
	if err != nil {
		return nil, false, err
	}
	d.HeatStatus = HeatResourceStatus(d.Action, d.Status)
	return d, started, nil
}

// RemoveDeletedSoftware removes a deployment at the end of the UNDEPLOY
// round of its deletion. It reports false, changing nothing, when the
// deployment is gone, in another round, or no longer being deleted.
func (s *Store) RemoveDeletedSoftware(ctx context.Context, id int64, round int) (bool, error) {
	// The node's agent is woken by the table's trigger (migration 0029).
	var n []int64
	err := s.DB.WithContext(ctx).Raw(`DELETE FROM software_deployments WHERE id = ? AND round = ? AND deleting
RETURNING id`, id, round).Scan(&n).Error
	if err != nil {
		return false, fmt.Errorf("remove deleted software deployment %d: %w", id, err)
	}
	return len(n) > 0, nil
}

// DeleteSoftwareDeployment removes a deployment at once, without UNDEPLOY
// (DELETE ?force=true); the caller stops its workflow.
func (s *Store) DeleteSoftwareDeployment(ctx context.Context, id int64) (*SoftwareDeployment, error) {
	var d SoftwareDeployment
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&d, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("software deployment", id)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		return tx.Exec("DELETE FROM software_deployments WHERE id = ?", id).Error
	})
	if err != nil {
		return nil, err
	}
	return &d, nil
}

func swJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// softwareRow is a deployment joined with its config and node.
type softwareRow struct {
	SoftwareDeployment
	NodeName      string          `gorm:"column:node_name"`
	CName         string          `gorm:"column:c_name"`
	CGroup        string          `gorm:"column:c_group"`
	CConfig       string          `gorm:"column:c_config"`
	CInputs       []SoftwareIODef `gorm:"column:c_inputs;serializer:json"`
	COutputs      []SoftwareIODef `gorm:"column:c_outputs;serializer:json"`
	COptions      map[string]any  `gorm:"column:c_options;serializer:json"`
	CDeploymentID *int64          `gorm:"column:c_deployment_id"`
	CCreatedAt    time.Time       `gorm:"column:c_created_at"`
}

const softwareJoin = `
SELECT d.*, n.name AS node_name, c.name AS c_name, c."group" AS c_group, c.config AS c_config,
       c.inputs AS c_inputs, c.outputs AS c_outputs, c.options AS c_options,
       c.deployment_id AS c_deployment_id, c.created_at AS c_created_at
FROM software_deployments d
JOIN software_configs c ON c.id = d.config_id
JOIN nodes n ON n.id = d.node_id
`

func (r softwareRow) deployment() SoftwareDeployment {
	d := r.SoftwareDeployment
	d.ServerName = r.NodeName
	d.Config = &SoftwareConfig{
		ID: d.ConfigID, Name: r.CName, Group: r.CGroup, Config: r.CConfig, Inputs: r.CInputs,
		Outputs: r.COutputs, Options: r.COptions, DeploymentID: r.CDeploymentID, CreatedAt: r.CCreatedAt,
	}
	if d.InputValues == nil {
		d.InputValues = map[string]any{}
	}
	if d.OutputValues == nil {
		d.OutputValues = map[string]any{}
	}
	d.HeatStatus = HeatResourceStatus(d.Action, d.Status)
	return d
}

func scanSoftware(db *gorm.DB, where string, args ...any) ([]SoftwareDeployment, error) {
	var rows []softwareRow
	if err := db.Raw(softwareJoin+where, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]SoftwareDeployment, len(rows))
	for i, r := range rows {
		out[i] = r.deployment()
	}
	return out, nil
}

// SoftwareDeployment loads a deployment with its config embedded.
func (s *Store) SoftwareDeployment(ctx context.Context, id int64) (*SoftwareDeployment, error) {
	ds, err := scanSoftware(s.DB.WithContext(ctx), "WHERE d.id = ?", id)
	if err != nil {
		return nil, fmt.Errorf("load software deployment %d: %w", id, err)
	}
	if len(ds) == 0 {
		return nil, models.NotFound("software deployment", id)
	}
	return &ds[0], nil
}

// ServerSoftwareDeployments is Heat's deployments index: every deployment of
// the node (id or name) with its config data, in one SQL query. Only an
// empty answer costs a second query, to tell an unknown node (404) from a
// node without deployments.
func (s *Store) ServerSoftwareDeployments(ctx context.Context, server string) ([]SoftwareDeployment, error) {
	db := s.DB.WithContext(ctx)
	var ds []SoftwareDeployment
	var err error
	if id, perr := strconv.ParseInt(server, 10, 64); perr == nil {
		ds, err = scanSoftware(db, "WHERE d.node_id = ? ORDER BY d.id", id)
	} else {
		ds, err = scanSoftware(db, "WHERE n.name = ? ORDER BY d.id", server)
	}
	if err != nil {
		return nil, fmt.Errorf("list software deployments of %s: %w", server, err)
	}
	if len(ds) == 0 {
		if _, err := s.Node(ctx, server); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// SoftwareDeployments lists every deployment with its config (no filter).
func (s *Store) SoftwareDeployments(ctx context.Context) ([]SoftwareDeployment, error) {
	ds, err := scanSoftware(s.DB.WithContext(ctx), "ORDER BY d.id")
	if err != nil {
		return nil, fmt.Errorf("list software deployments: %w", err)
	}
	return ds, nil
}

// AgentSoftwareVersion is the node's software version: it changes whenever
// one of the node's deployments changes.
func (s *Store) AgentSoftwareVersion(ctx context.Context, nodeID int64) (int64, error) {
	var v int64
	err := s.DB.WithContext(ctx).Raw("SELECT COALESCE(MAX(version), 0) FROM software_deployments WHERE node_id = ?", nodeID).Scan(&v).Error
	if err != nil {
		return 0, fmt.Errorf("software version of node %d: %w", nodeID, err)
	}
	return v, nil
}

// AgentSoftwareDeployments lists the node's deployments awaiting its agent:
// in progress and not yet signalled for their round.
func (s *Store) AgentSoftwareDeployments(ctx context.Context, nodeID int64) ([]SoftwareDeployment, error) {
	ds, err := scanSoftware(s.DB.WithContext(ctx),
		"WHERE d.node_id = ? AND d.status = ? AND d.signaled_round < d.round ORDER BY d.id", nodeID, contract.SoftwareInProgress)
	if err != nil {
		return nil, fmt.Errorf("software deployments of node %d: %w", nodeID, err)
	}
	return ds, nil
}

// ErrRoundNotYetVisible means a round's row (or its round number) is not
// in Postgres yet: the transaction that starts the round has not committed,
// or it rolled back. Retrying tells which.
var ErrRoundNotYetVisible = errors.New("not recorded (yet)")

// PrepareSoftwareRound starts a round: it resolves get_attr references
// (a reference to a deployment that is not COMPLETE yet makes the round
// wait; a FAILED one fails it), fills defaults and marks the deployment
// IN_PROGRESS, waking the node's agent. Idempotent.
func (s *Store) PrepareSoftwareRound(ctx context.Context, id int64, round int) (*contract.SoftwarePrepared, error) {
	var p contract.SoftwarePrepared
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var d SoftwareDeployment
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&d, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			// The workflow starts inside the transaction that records the
			// deployment: the row may not be committed yet.
			return fmt.Errorf("software deployment %d: %w", id, ErrRoundNotYetVisible)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		p.Status, p.TimeoutSec = d.Status, d.TimeoutSec
		if d.Round < round {
			return fmt.Errorf("software deployment %d round %d: %w", id, round, ErrRoundNotYetVisible)
		}
		if d.Round > round {
			p.Stale = true
			return nil
		}
		var cfg SoftwareConfig
		if err := tx.Take(&cfg, d.ConfigID).Error; err != nil {
			return fmt.Errorf("load software config %d: %w", d.ConfigID, err)
		}
		var node models.Node
		if err := tx.Select("name").Take(&node, d.NodeID).Error; err != nil {
			return fmt.Errorf("load node %d: %w", d.NodeID, err)
		}
		p.ErrorOutputs, p.Node, p.Config = cfg.ErrorOutputs(), node.Name, cfg.Name
		switch d.Status {
		case contract.SoftwareComplete, contract.SoftwareFailed:
			p.Final = true
			return nil
		case contract.SoftwareInProgress:
			p.Ready = true
			return nil
		}
		resolved := map[string]any{}
		for _, in := range cfg.Inputs {
			if in.Default != nil {
				resolved[in.Name] = in.Default
			}
		}
		names := make([]string, 0, len(d.InputValues))
		for k := range d.InputValues {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, name := range names {
			v := d.InputValues[name]
			refID, output, isRef, err := getAttr(v)
			if err != nil {
				p.Failed = fmt.Sprintf("input %s: %v", name, err)
				return nil
			}
			if !isRef {
				resolved[name] = v
				continue
			}
			var ref SoftwareDeployment
			err = tx.Select("id", "status", "status_reason", "output_values").Take(&ref, refID).Error
			if d.Deleting && (err != nil || ref.Status != contract.SoftwareComplete) {
				// UNDEPLOY of a deleted deployment neither waits for nor
				// fails on its references: the input keeps the value it
				// had, if any.
				if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
					return fmt.Errorf("load software deployment %d: %w", refID, err)
				}
				if v, ok := d.ResolvedInputs[name]; ok {
					resolved[name] = v
				}
				continue
			}
			if errors.Is(err, gorm.ErrRecordNotFound) {
				p.Failed = fmt.Sprintf("input %s: get_attr refers to software deployment %d, which no longer exists", name, refID)
				return nil
			}
			if err != nil {
				return fmt.Errorf("load software deployment %d: %w", refID, err)
			}
			switch ref.Status {
			case contract.SoftwareFailed:
				p.Failed = fmt.Sprintf("input %s: get_attr refers to software deployment %d, which FAILED (%s)", name, refID, ref.StatusReason)
				return nil
			case contract.SoftwareComplete:
			default:
				if !slices.Contains(p.WaitingFor, refID) {
					p.WaitingFor = append(p.WaitingFor, refID)
				}
				continue
			}
			val, ok := ref.OutputValues[output]
			if !ok {
				p.Failed = fmt.Sprintf("input %s: software deployment %d completed without output %q", name, refID, output)
				return nil
			}
			resolved[name] = val
		}
		if len(p.WaitingFor) > 0 {
			reason := fmt.Sprintf("waiting for software deployment(s) %s to complete (get_attr)", joinIDs(p.WaitingFor))
			if d.StatusReason != reason {
				return tx.Model(&SoftwareDeployment{}).Where("id = ?", id).Update("status_reason", reason).Error
			}
			return nil
		}
		// The node's agent is woken by the table's trigger (migration 0029).
		err = tx.Exec(`UPDATE software_deployments SET status = ?, status_reason = '', resolved_inputs = ?,
version = nextval('software_deployment_version_seq'), updated_at = now()
WHERE id = ? AND round = ?`,
			contract.SoftwareInProgress, swJSON(resolved), id, round).Error
		if err != nil {
			return fmt.Errorf("start round %d of software deployment %d: %w", round, id, err)
		}
		p.Ready, p.Status = true, contract.SoftwareInProgress
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// FinishSoftwareRound records how a round ended; the outputs the agent
// signalled for it (with deploy_stdout, deploy_stderr, deploy_status_code)
// become the deployment's output values. It reports false when the round
// had already ended or is not the current one (idempotent).
func (s *Store) FinishSoftwareRound(ctx context.Context, id int64, round int, status, reason string) (bool, error) {
	// The node's agent is woken by the table's trigger (migration 0029).
	var n []int64
	err := s.DB.WithContext(ctx).Raw(`UPDATE software_deployments SET status = ?, status_reason = ?,
output_values = CASE WHEN signaled_round = round THEN
    COALESCE(signal->'outputs', '{}'::jsonb) || jsonb_build_object(
        'deploy_stdout', COALESCE(signal->'deploy_stdout', '""'::jsonb),
        'deploy_stderr', COALESCE(signal->'deploy_stderr', '""'::jsonb),
        'deploy_status_code', COALESCE(signal->'deploy_status_code', '0'::jsonb))
  ELSE output_values END,
version = nextval('software_deployment_version_seq'), updated_at = now()
WHERE id = ? AND round = ? AND status IN ?
RETURNING id`,
		status, models.StripNUL(reason), id, round, []string{contract.SoftwareWaiting, contract.SoftwareInProgress}).Scan(&n).Error
	if err != nil {
		return false, fmt.Errorf("finish round %d of software deployment %d: %w", round, id, err)
	}
	return len(n) > 0, nil
}

// RecordedSignal says what RecordSoftwareSignal did.
type RecordedSignal struct {
	Deployment *SoftwareDeployment
	Summary    contract.SoftwareSignalSummary
	// Fresh is false when this round had been signalled before.
	Fresh bool
}

// SoftwareValueEmpty reports whether a signalled value counts as no value (Heat's
// truthiness: null, "", false, 0, [] and {} are empty).
func SoftwareValueEmpty(v any) bool {
	if v == nil {
		return true
	}
	switch t := v.(type) {
	case string:
		return t == ""
	case bool:
		return !t
	case float64:
		return t == 0
	case int64:
		return t == 0
	case int:
		return t == 0
	case json.Number:
		f, err := t.Float64()
		return err == nil && f == 0
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Map:
		return rv.Len() == 0
	}
	return false
}

func excerpt(v any) string {
	s, ok := v.(string)
	if !ok {
		s = swJSON(v)
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// RecordSoftwareSignal stores the agent's signal for the current round of
// a deployment of its own node. A repeated signal for a round changes
// nothing (Fresh false); a signal for another round, or for a round that is
// not in progress, is a conflict.
func (s *Store) RecordSoftwareSignal(ctx context.Context, nodeID, id int64, sig protocol.SoftwareSignal) (*RecordedSignal, error) {
	var rec RecordedSignal
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var d SoftwareDeployment
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&d, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("software deployment", id)
		}
		if err != nil {
			return fmt.Errorf("load software deployment %d: %w", id, err)
		}
		if d.NodeID != nodeID {
			return fmt.Errorf("software deployment %d belongs to another node: %w", id, models.ErrForbidden)
		}
		rec.Deployment = &d
		round := sig.Round
		if round == 0 {
			round = d.Round
		}
		if round != d.Round {
			return &models.ConflictError{Reason: fmt.Sprintf("software deployment %d is in round %d, not %d; the signal is for an old round", id, d.Round, round)}
		}
		// What the node signals is redacted of its deployment's secrets
		// before it is stored or summarised for the workflow.
		red, err := s.NodeRedactor(tx, nodeID)
		if err != nil {
			return err
		}
		sig.Outputs, _ = red.Value(sig.Outputs).(map[string]any)
		sig.Stdout, sig.Stderr, sig.StatusReason = red.String(sig.Stdout), red.String(sig.Stderr), red.String(sig.StatusReason)
		rec.Summary = summarize(round, sig)
		if d.SignaledRound == round {
			return nil // repeated: the first signal stands
		}
		if d.Status != contract.SoftwareInProgress {
			return &models.ConflictError{Reason: fmt.Sprintf("software deployment %d round %d is %s, not IN_PROGRESS (%s)", id, round, d.Status, d.StatusReason)}
		}
		stored := storedSignal{Outputs: sig.Outputs, Stdout: models.StripNUL(sig.Stdout), Stderr: models.StripNUL(sig.Stderr),
			StatusCode: sig.StatusCode, StatusReason: models.StripNUL(sig.StatusReason)}
		err = tx.Exec("UPDATE software_deployments SET signaled_round = ?, signal = ?, updated_at = now() WHERE id = ?",
			round, models.StripNUL(swJSON(stored)), id).Error
		if err != nil {
			return fmt.Errorf("record signal of software deployment %d: %w", id, err)
		}
		d.SignaledRound = round
		rec.Fresh = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// summarize tells the workflow which outputs were signalled non-empty; the
// values themselves stay in Postgres (contract.Redacted stands for each),
// so that no output value reaches a Temporal payload.
func summarize(round int, sig protocol.SoftwareSignal) contract.SoftwareSignalSummary {
	sum := contract.SoftwareSignalSummary{Round: round, StatusCode: sig.StatusCode, StatusReason: excerpt(sig.StatusReason)}
	if sig.StatusReason == "" {
		sum.StatusReason = ""
	}
	for k, v := range sig.Outputs {
		if !SoftwareValueEmpty(v) {
			if sum.Present == nil {
				sum.Present = map[string]string{}
			}
			sum.Present[k] = contract.Redacted
		}
	}
	return sum
}

// SetAcceptForeignConfigs sets the node's deployment policy attribute.
func (s *Store) SetAcceptForeignConfigs(ctx context.Context, ref string, accept bool) (*models.Node, error) {
	node, err := s.Node(ctx, ref)
	if err != nil {
		return nil, err
	}
	err = s.DB.WithContext(ctx).Exec(`UPDATE nodes SET attributes = jsonb_set(COALESCE(attributes, '{}'::jsonb), ?, to_jsonb(?::boolean)), updated_at = now() WHERE id = ?`,
		"{"+AcceptForeignConfigs+"}", accept, node.ID).Error
	if err != nil {
		return nil, fmt.Errorf("set the software policy of node %s: %w", node.Name, err)
	}
	return s.Node(ctx, strconv.FormatInt(node.ID, 10))
}

// UnfinishedSoftwareRounds lists the software deployments whose current
// round is still WAITING or IN_PROGRESS and was last touched before the
// given age: those a reconciler checks against their workflow.
func (s *Store) UnfinishedSoftwareRounds(ctx context.Context, olderThan time.Duration) ([]SoftwareDeployment, error) {
	var out []SoftwareDeployment
	err := s.DB.WithContext(ctx).Select("id", "round", "status", "workflow_id", "node_id").
		Where("status IN ? AND updated_at < ?", []string{contract.SoftwareWaiting, contract.SoftwareInProgress}, models.Now().Add(-olderThan)).
		Order("id").Limit(1000).Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list unfinished software deployments: %w", err)
	}
	return out, nil
}
