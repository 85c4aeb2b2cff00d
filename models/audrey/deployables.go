package audrey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey/aeolus"
)

// Deployable is an imported Audrey deployable (seed 003).
type Deployable struct {
	ID           int64                     `json:"id"`
	UUID         uuid.UUID                 `json:"uuid"`
	Name         string                    `json:"name"`
	DeploymentID int64                     `json:"deployment_id"`
	Format       string                    `json:"format"`
	Document     aeolus.Document           `json:"document" gorm:"serializer:json"`
	ServiceMap   map[string]ServiceMapping `json:"service_map" gorm:"serializer:json"`
	CreatedAt    time.Time                 `json:"created_at"`
}

// ServiceMapping says where a service is configured: the role name it maps
// to (the service's name; a release may define a role of that name to run
// the scripts with its own jig), the configuration engine scripts (puppet
// classes...) and the instances (by assembly name) that carry it.
type ServiceMapping struct {
	Role      string   `json:"role"`
	Scripts   []string `json:"scripts"`
	Instances []string `json:"instances"`
}

// DeployableInstance is one assembly instance of a deployable: a node-to-be
// with its instance config and what it reported to the config server.
type DeployableInstance struct {
	ID               int64                   `json:"-"`
	UUID             uuid.UUID               `json:"uuid"`
	DeployableID     int64                   `json:"-"`
	Position         int                     `json:"position"`
	Name             string                  `json:"name"`
	AssemblyType     string                  `json:"assembly_type"`
	HWP              string                  `json:"hwp" gorm:"column:hwp"`
	NodeID           *int64                  `json:"node_id"`
	Config           aeolus.InstanceConfig   `json:"-" gorm:"serializer:json"`
	TokenHash        string                  `json:"-"`
	Replies          map[string]aeolus.Reply `json:"replies" gorm:"serializer:json"`
	LastConfigStatus *int                    `json:"last_config_status"`
	ConfigFetchedAt  *time.Time              `json:"config_fetched_at"`
	RepliedAt        *time.Time              `json:"replied_at"`
	CreatedAt        time.Time               `json:"created_at"`
	UpdatedAt        time.Time               `json:"updated_at"`
}

// Instance statuses, computed from the config server's state.
const (
	InstanceWaiting    = "waiting"    // has not fetched its config yet
	InstancePartial    = "partial"    // got 202/204: references unresolved
	InstanceConfigured = "configured" // got its complete config; provided parameters pending
	InstanceComplete   = "complete"   // complete config and every provided parameter reported
)

// Status is the instance's status given its pending provided parameters.
func (in *DeployableInstance) Status() string {
	switch {
	case in.LastConfigStatus == nil:
		return InstanceWaiting
	case *in.LastConfigStatus != http.StatusOK:
		return InstancePartial
	case len(aeolus.PendingProvided(&in.Config, in.replies())) > 0:
		return InstanceConfigured
	default:
		return InstanceComplete
	}
}

func (in *DeployableInstance) replies() aeolus.Replies {
	return aeolus.Replies{in.Config.ID: in.Replies}
}

// AudreyInputError turns the audrey package's errors into the API's: a
// syntax error is a 400 with the line, validation errors a 422 naming the
// first element/field, with all of them (and a cycle) in the details.
// status overrides the validation status when not 0.
func AudreyInputError(err error, status int) error {
	var se *aeolus.SyntaxError
	var es aeolus.Errors
	switch {
	case errors.As(err, &se):
		ie := &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "malformed document: " + se.Error()}
		if se.Line > 0 {
			ie.Details = map[string]any{"line": se.Line}
		}
		return ie
	case errors.As(err, &es) && len(es) > 0:
		ie := &models.InputError{Status: status, Field: es[0].Field, Reason: es[0].Reason, Details: map[string]any{"errors": es}}
		if len(es) > 1 {
			ie.Reason += fmt.Sprintf(" (and %d more problems, see details.errors)", len(es)-1)
		}
		if es[0].Cycle != nil {
			ie.Details["cycle"] = es[0].Cycle
		}
		return ie
	}
	return err
}

// DeployableImport is what ImportDeployable created; Tokens are the
// instances' credentials, shown once.
type DeployableImport struct {
	Deployable *Deployable
	Instances  []DeployableInstance
	Nodes      map[int64]*models.Node
	Tokens     map[uuid.UUID]string
}

var nonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// dnsLabelOf makes a DNS label of an Audrey name ("FirstAssembly" →
// "firstassembly", "app_server 1" → "app-server-1").
func dnsLabelOf(name string) string {
	l := strings.Trim(nonLabel.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(l) > 63 {
		l = strings.Trim(l[:63], "-")
	}
	if l == "" {
		l = "x"
	}
	return l
}

// InstanceNodeName is the node name of a deployable's instance:
// <assembly>.<deployable>.<domain>, each made a DNS label.
func InstanceNodeName(instance, deployable, domain string) string {
	name := dnsLabelOf(instance) + "." + dnsLabelOf(deployable)
	if domain != "" {
		name += "." + domain
	}
	return name
}

// ImportDeployable parses (format "xml" or "yaml"), validates completely and
// then, in one transaction, creates the deployable, one node per assembly
// instance (named by InstanceNodeName, in deployment ref, default system)
// with its instance config and own credential, and the service map.
func (s *Store) ImportDeployable(ctx context.Context, body []byte, format, deploymentRef string) (*DeployableImport, error) {
	var doc *aeolus.Document
	var err error
	switch format {
	case "xml":
		doc, err = aeolus.ParseXML(body)
	case "yaml":
		doc, err = aeolus.ParseYAML(body)
	default:
		return nil, models.Invalid("format", "must be xml or yaml, not %q", format)
	}
	if err != nil {
		return nil, AudreyInputError(err, 0)
	}
	if err := validateDocumentLimits(doc); err != nil {
		return nil, err
	}
	if err := models.ValidLine("deployment", deploymentRef, models.MaxLineLen); err != nil {
		return nil, err
	}
	if errs := aeolus.Validate(doc); len(errs) > 0 {
		return nil, AudreyInputError(errs, 0)
	}
	depUUID := uuid.New()
	configs := aeolus.BuildInstances(doc, depUUID.String(), uuid.NewString)
	if errs := aeolus.ValidateInstances(configs); len(errs) > 0 {
		return nil, AudreyInputError(errs, 0)
	}
	nodeNames := map[string]string{}
	for i, ic := range configs {
		name := InstanceNodeName(ic.Name, doc.Deployable.Name, s.Domain)
		if err := models.ValidateNodeName(name, s.Domain); err != nil {
			var ie *models.InputError
			if errors.As(err, &ie) {
				return nil, models.Invalid(fmt.Sprintf("deployable.assemblies[%d].name", i), "node name %s", ie.Reason)
			}
			return nil, err
		}
		if other, dup := nodeNames[name]; dup {
			return nil, models.Invalid(fmt.Sprintf("deployable.assemblies[%d].name", i), "assemblies %q and %q would both be node %q; rename one", other, ic.Name, name)
		}
		nodeNames[name] = ic.Name
	}
	serviceMap := map[string]ServiceMapping{}
	for _, ic := range configs {
		for _, svc := range ic.Services {
			m := serviceMap[svc.Name]
			m.Role, m.Scripts = svc.Name, svc.Scripts
			if m.Scripts == nil {
				m.Scripts = []string{}
			}
			m.Instances = append(m.Instances, ic.Name)
			serviceMap[svc.Name] = m
		}
	}

	out := &DeployableImport{Nodes: map[int64]*models.Node{}, Tokens: map[uuid.UUID]string{}}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		ref := deploymentRef
		if ref == "" {
			ref = models.SystemDeployment
		}
		dep, err := models.DeploymentInField(tx, "deployment", ref)
		if err != nil {
			return err
		}
		var count int64
		if err := tx.Model(&Deployable{}).Where("name = ?", doc.Deployable.Name).Count(&count).Error; err != nil {
			return fmt.Errorf("check deployable name: %w", err)
		}
		if count > 0 {
			return &models.ConflictError{Reason: fmt.Sprintf("a deployable named %q already exists", doc.Deployable.Name)}
		}
		d := &Deployable{UUID: depUUID, Name: doc.Deployable.Name, DeploymentID: dep.ID, Format: format, Document: *doc, ServiceMap: serviceMap}
		if err := tx.Create(d).Error; err != nil {
			return fmt.Errorf("create deployable %q: %w", d.Name, models.UniqueViolation(err, fmt.Sprintf("a deployable named %q already exists", d.Name)))
		}
		out.Deployable = d
		inner := &models.Store{DB: tx, Domain: s.Domain, Keys: s.Keys}
		for i, ic := range configs {
			da := doc.Deployable.Assemblies[i]
			node, _, err := inner.CreateNode(ctx, models.NodeInput{Name: InstanceNodeName(ic.Name, d.Name, s.Domain), Deployment: dep.Name}, false)
			if err != nil {
				return err
			}
			services := make([]string, len(ic.Services))
			for j, svc := range ic.Services {
				services[j] = svc.Name
			}
			node.Attributes = map[string]any{"audrey": map[string]any{
				"deployable": d.Name, "deployable_uuid": d.UUID.String(), "instance_uuid": ic.ID,
				"assembly": ic.Name, "assembly_type": ic.Type, "hwp": da.HWP, "services": services,
			}}
			if err := tx.Model(&models.Node{}).Where("id = ?", node.ID).Update("attributes", node.Attributes).Error; err != nil {
				return fmt.Errorf("set node %s attributes: %w", node.Name, err)
			}
			out.Nodes[node.ID] = node
			secret := models.NewSecret("aud_")
			id := uuid.MustParse(ic.ID)
			nodeID := node.ID
			inst := DeployableInstance{UUID: id, DeployableID: d.ID, Position: i, Name: ic.Name, AssemblyType: ic.Type,
				HWP: da.HWP, NodeID: &nodeID, Config: ic, TokenHash: models.HashSecret(secret), Replies: map[string]aeolus.Reply{}}
			if err := tx.Create(&inst).Error; err != nil {
				return fmt.Errorf("create instance %s: %w", ic.Name, err)
			}
			out.Instances = append(out.Instances, inst)
			out.Tokens[id] = secret
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func findDeployable(tx *gorm.DB, ref string) (*Deployable, error) {
	var d Deployable
	q := tx
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		q = q.Where("id = ?", id)
	} else if u, err := uuid.Parse(ref); err == nil {
		q = q.Where("uuid = ?", u)
	} else {
		q = q.Where("name = ?", ref)
	}
	err := q.Take(&d).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("deployable", ref)
	}
	if err != nil {
		return nil, fmt.Errorf("load deployable %s: %w", ref, err)
	}
	return &d, nil
}

func deployableInstances(tx *gorm.DB, deployableID int64) ([]DeployableInstance, error) {
	var out []DeployableInstance
	if err := tx.Where("deployable_id = ?", deployableID).Order("position").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("load instances of deployable %d: %w", deployableID, err)
	}
	return out, nil
}

// Deployable loads a deployable (by id, uuid or name) with its instances in
// deployable order.
func (s *Store) Deployable(ctx context.Context, ref string) (*Deployable, []DeployableInstance, error) {
	db := s.DB.WithContext(ctx)
	d, err := findDeployable(db, ref)
	if err != nil {
		return nil, nil, err
	}
	insts, err := deployableInstances(db, d.ID)
	if err != nil {
		return nil, nil, err
	}
	return d, insts, nil
}

// Deployables lists every deployable, without instances.
func (s *Store) Deployables(ctx context.Context) ([]Deployable, error) {
	var out []Deployable
	if err := s.DB.WithContext(ctx).Order("id").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list deployables: %w", err)
	}
	return out, nil
}

// Instance finds an instance by its UUID.
func (s *Store) Instance(ctx context.Context, id uuid.UUID) (*DeployableInstance, error) {
	var in DeployableInstance
	err := s.DB.WithContext(ctx).Where("uuid = ?", id).Take(&in).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("instance", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load instance %s: %w", id, err)
	}
	return &in, nil
}

// InstanceTokenExists reports whether secret is some instance's credential.
func (s *Store) InstanceTokenExists(ctx context.Context, secret string) (bool, error) {
	var count int64
	err := s.DB.WithContext(ctx).Model(&DeployableInstance{}).Where("token_hash = ?", models.HashSecret(secret)).Count(&count).Error
	if err != nil {
		return false, fmt.Errorf("check instance token: %w", err)
	}
	return count > 0, nil
}

// InstanceConfigs returns the configs of instances, in order.
func InstanceConfigs(insts []DeployableInstance) []aeolus.InstanceConfig {
	out := make([]aeolus.InstanceConfig, len(insts))
	for i := range insts {
		out[i] = insts[i].Config
	}
	return out
}

// InstanceReplies returns every instance's replies by instance UUID.
func InstanceReplies(insts []DeployableInstance) aeolus.Replies {
	out := aeolus.Replies{}
	for _, in := range insts {
		out[in.Config.ID] = in.Replies
	}
	return out
}

// FetchConfig answers GET /configs/:uuid: the instance's config resolved
// against its deployable's replies so far, and the status code (200
// complete, 202 partial, 204 partial but not allowed), which it records.
func (s *Store) FetchConfig(ctx context.Context, id uuid.UUID) (aeolus.Resolution, int, error) {
	db := s.DB.WithContext(ctx)
	in, err := s.Instance(ctx, id)
	if err != nil {
		return aeolus.Resolution{}, 0, err
	}
	insts, err := deployableInstances(db, in.DeployableID)
	if err != nil {
		return aeolus.Resolution{}, 0, err
	}
	idx := -1
	for i := range insts {
		if insts[i].ID == in.ID {
			idx = i
		}
	}
	configs := InstanceConfigs(insts)
	res := aeolus.Resolve(configs, idx, InstanceReplies(insts))
	res.Config = &configs[idx]
	status := http.StatusOK
	switch {
	case res.Complete:
	case res.PartialAllowed:
		status = http.StatusAccepted
	default:
		status = http.StatusNoContent
	}
	t := models.Now()
	if err := db.Model(&DeployableInstance{}).Where("id = ?", in.ID).
		Updates(map[string]any{"last_config_status": status, "config_fetched_at": t, "updated_at": t}).Error; err != nil {
		return res, 0, fmt.Errorf("record config fetch of %s: %w", id, err)
	}
	return res, status, nil
}

// PendingParams answers GET /params/:uuid: the provided parameters the
// instance has not reported yet.
func (s *Store) PendingParams(ctx context.Context, id uuid.UUID) ([]string, error) {
	in, err := s.Instance(ctx, id)
	if err != nil {
		return nil, err
	}
	return aeolus.PendingProvided(&in.Config, in.replies()), nil
}

// StoreReply answers PUT /reply/:uuid: it stores the reported values of
// provided parameters (a value reported again is overwritten but keeps the
// time it was first reported, which decides match-type first). A parameter
// the instance does not provide is refused (400); a reply before the
// instance ever fetched its config is out of turn (404, the seed's code for
// a uuid the config server does not know as configuring), and changes
// nothing.
func (s *Store) StoreReply(ctx context.Context, id uuid.UUID, values map[string]string, order []string) (*DeployableInstance, error) {
	var out *DeployableInstance
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var in DeployableInstance
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("uuid = ?", id).Take(&in).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("instance", id)
		}
		if err != nil {
			return fmt.Errorf("lock instance %s: %w", id, err)
		}
		if in.LastConfigStatus == nil {
			// Out of turn: the seed's PUT knows only 200 and 404, and an
			// instance that never fetched its config is not configuring yet.
			return fmt.Errorf("instance %s (%s) has not fetched its configuration yet (GET /configs/%s first), so a reply is out of turn: %w",
				id, in.Name, id, models.ErrNotFound)
		}
		for i, name := range order {
			if !in.Config.Provides(name) {
				return &models.InputError{Status: http.StatusBadRequest, Field: fmt.Sprintf("provided-parameters[%d]", i),
					Reason: fmt.Sprintf("instance %s (%s) provides no parameter %q; it provides %v", id, in.Name, name, in.Config.Provided)}
			}
		}
		if in.Replies == nil {
			in.Replies = map[string]aeolus.Reply{}
		}
		t := models.Now()
		for _, name := range order {
			r, ok := in.Replies[name]
			if !ok {
				r.At = t
			}
			r.Value = values[name]
			in.Replies[name] = r
		}
		in.RepliedAt, in.UpdatedAt = &t, t
		if err := tx.Select("replies", "replied_at", "updated_at").Save(&in).Error; err != nil {
			return fmt.Errorf("store reply of %s: %w", id, err)
		}
		out = &in
		return nil
	})
	return out, err
}

// ReplaceInstanceConfig answers POST /configs/:uuid: it replaces a known
// instance's config with the posted document after checking it (its id is
// the uuid, its deployable is the instance's, its name and type unchanged,
// its references resolvable in the deployable and free of cycles). Every
// problem is an invalid document (400).
func (s *Store) ReplaceInstanceConfig(ctx context.Context, id uuid.UUID, ic *aeolus.InstanceConfig) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var in DeployableInstance
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("uuid = ?", id).Take(&in).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("instance", id)
		}
		if err != nil {
			return fmt.Errorf("lock instance %s: %w", id, err)
		}
		bad := func(field, format string, args ...any) error {
			return &models.InputError{Status: http.StatusBadRequest, Field: field, Reason: fmt.Sprintf(format, args...)}
		}
		if !strings.EqualFold(ic.ID, id.String()) {
			return bad("instance-config.id", "is %q, not the uuid of the URL %s", ic.ID, id)
		}
		ic.ID = id.String()
		if ic.Name != in.Name || ic.Type != in.AssemblyType {
			return bad("instance-config.name", "the instance is %q of type %q; a posted config cannot rename it or change its type", in.Name, in.AssemblyType)
		}
		if ic.DeployableID != "" && !strings.EqualFold(ic.DeployableID, in.Config.DeployableID) {
			return bad("instance-config.deployable.id", "is %q, but the instance belongs to deployable %s", ic.DeployableID, in.Config.DeployableID)
		}
		ic.DeployableID, ic.DeployableName = in.Config.DeployableID, in.Config.DeployableName
		insts, err := deployableInstances(tx, in.DeployableID)
		if err != nil {
			return err
		}
		configs := InstanceConfigs(insts)
		for i := range insts {
			if insts[i].ID == in.ID {
				configs[i] = *ic
			}
		}
		if errs := aeolus.ValidateInstances(configs); len(errs) > 0 {
			return AudreyInputError(errs, http.StatusBadRequest)
		}
		t := models.Now()
		in.Config, in.UpdatedAt = *ic, t
		if err := tx.Select("config", "updated_at").Save(&in).Error; err != nil {
			return fmt.Errorf("replace config of %s: %w", id, err)
		}
		return nil
	})
}

// DeployableView is GET /api/v1/deployables/:id: the deployable, its
// instances with status, and the ordering edges its references define.
type DeployableView struct {
	*Deployable
	Instances []InstanceView `json:"instances"`
	Edges     []aeolus.Edge  `json:"edges"`
}

// InstanceView is an instance as the API shows it.
type InstanceView struct {
	DeployableInstance
	Status          string   `json:"status"`
	NodeName        string   `json:"node_name,omitempty"`
	MissingInputs   []string `json:"missing_inputs"`
	PendingProvided []string `json:"pending_provided"`
	Token           string   `json:"token,omitempty"` // only in the import answer
	// ConfigXML is the instance's <instance-config> document, only in the
	// import answer: with Token, what the instance is launched with (its
	// agent POSTs it to /configs/:uuid).
	ConfigXML string `json:"config_xml,omitempty"`
}

// ViewDeployable assembles the API view; nodes maps node ids to nodes
// (missing ones are loaded) and tokens is set only after an import.
func (s *Store) ViewDeployable(ctx context.Context, d *Deployable, insts []DeployableInstance, tokens map[uuid.UUID]string) (*DeployableView, error) {
	var ids []int64
	for _, in := range insts {
		if in.NodeID != nil {
			ids = append(ids, *in.NodeID)
		}
	}
	names := map[int64]string{}
	if len(ids) > 0 {
		var nodes []models.Node
		if err := s.DB.WithContext(ctx).Select("id", "name").Where("id IN ?", ids).Find(&nodes).Error; err != nil {
			return nil, fmt.Errorf("load instance nodes: %w", err)
		}
		for _, n := range nodes {
			names[n.ID] = n.Name
		}
	}
	configs := InstanceConfigs(insts)
	replies := InstanceReplies(insts)
	view := &DeployableView{Deployable: d, Edges: aeolus.Edges(configs)}
	if view.Edges == nil {
		view.Edges = []aeolus.Edge{}
	}
	for i, in := range insts {
		res := aeolus.Resolve(configs, i, replies)
		iv := InstanceView{DeployableInstance: in, Status: in.Status(), MissingInputs: res.Missing,
			PendingProvided: aeolus.PendingProvided(&configs[i], replies), Token: tokens[in.UUID]}
		if tokens != nil {
			iv.ConfigXML = string(aeolus.InstanceConfigXML(&configs[i]))
		}
		if iv.MissingInputs == nil {
			iv.MissingInputs = []string{}
		}
		if in.NodeID != nil {
			iv.NodeName = names[*in.NodeID]
		}
		view.Instances = append(view.Instances, iv)
	}
	return view, nil
}

// DeletedDeployable says what deleting a deployable removed: the
// deployable with its instances (their credentials stop working), the
// instances' nodes that never came alive, and the nodes it kept.
type DeletedDeployable struct {
	Deployable   *Deployable `json:"deployable"`
	DeletedNodes []string    `json:"deleted_nodes"`
	KeptNodes    []string    `json:"kept_nodes"`
}

// DeleteDeployable deletes a deployable and its instances. An instance's
// node that never came alive (no agent ever enrolled it) existed only for
// the deployable and is deleted too; a node an agent enrolled is a machine
// now, kept with what it runs (delete it through DELETE /nodes/:id). A node
// with work under way refuses the whole deletion (a ConflictError).
func (s *Store) DeleteDeployable(ctx context.Context, ref string) (*DeletedDeployable, error) {
	out := &DeletedDeployable{DeletedNodes: []string{}, KeptNodes: []string{}}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		d, err := findDeployable(tx, ref)
		if err != nil {
			return err
		}
		out.Deployable = d
		insts, err := deployableInstances(tx, d.ID)
		if err != nil {
			return err
		}
		if err := tx.Delete(&Deployable{}, d.ID).Error; err != nil { // instances cascade
			return fmt.Errorf("delete deployable %s: %w", d.Name, err)
		}
		for _, in := range insts {
			if in.NodeID == nil {
				continue
			}
			var node models.Node
			err := tx.Select("id", "name", "agent_token_hash", "last_seen_at").Take(&node, *in.NodeID).Error
			if errors.Is(err, gorm.ErrRecordNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("load the node of instance %s: %w", in.Name, err)
			}
			if node.AgentTokenHash != nil || node.LastSeenAt != nil {
				out.KeptNodes = append(out.KeptNodes, node.Name)
				continue
			}
			if _, err := models.DeleteNodeIn(ctx, tx, strconv.FormatInt(node.ID, 10)); err != nil {
				return err
			}
			out.DeletedNodes = append(out.DeletedNodes, node.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// validateDocumentLimits applies the validation vocabulary to a deployable
// document before its Aeolus checks: the deployable's, templates' and
// assemblies' names and instance names follow the name grammar (they name
// nodes and URLs); other strings are one line; values are bounded texts;
// every list is capped.
func validateDocumentLimits(doc *aeolus.Document) error {
	line := func(field, s string) error { return models.ValidLine(field, s, models.MaxLineLen) }
	name := func(field, kind, s string) error {
		if s == "" {
			return nil // aeolus.Validate says what is required
		}
		return models.ValidName(field, kind, s)
	}
	if err := name("deployable.name", "deployable", doc.Deployable.Name); err != nil {
		return err
	}
	for _, l := range []struct {
		field string
		n     int
	}{{"templates", len(doc.Templates)}, {"assemblies", len(doc.Assemblies)}, {"deployable.assemblies", len(doc.Deployable.Assemblies)}} {
		if err := models.MaxItems(l.field, l.n, models.MaxListLen); err != nil {
			return err
		}
	}
	for i, t := range doc.Templates {
		f := fmt.Sprintf("templates[%d]", i)
		if err := name(f+".name", "template", t.Name); err != nil {
			return err
		}
		for _, v := range []struct{ field, s string }{{".os.name", t.OS.Name}, {".os.version", t.OS.Version}, {".description", t.Description}} {
			if err := line(f+v.field, v.s); err != nil {
				return err
			}
		}
		if err := models.MaxItems(f+".services", len(t.Services), models.MaxListLen); err != nil {
			return err
		}
		for j, svc := range t.Services {
			sf := fmt.Sprintf("%s.services[%d]", f, j)
			if err := line(sf+".name", svc.Name); err != nil {
				return err
			}
			if err := models.MaxItems(sf+".scripts", len(svc.Scripts), models.MaxListLen); err != nil {
				return err
			}
			for k, sc := range svc.Scripts {
				if err := line(fmt.Sprintf("%s.scripts[%d]", sf, k), sc); err != nil {
					return err
				}
			}
			if err := models.MaxItems(sf+".parameters", len(svc.Parameters), models.MaxListLen); err != nil {
				return err
			}
			for k, p := range svc.Parameters {
				if err := line(fmt.Sprintf("%s.parameters[%d].name", sf, k), p.Name); err != nil {
					return err
				}
			}
		}
	}
	for i, a := range doc.Assemblies {
		f := fmt.Sprintf("assemblies[%d]", i)
		if err := name(f+".name", "assembly", a.Name); err != nil {
			return err
		}
		if err := line(f+".template", a.Template); err != nil {
			return err
		}
		if err := models.MaxItems(f+".services", len(a.Services), models.MaxListLen); err != nil {
			return err
		}
		for j, svc := range a.Services {
			sf := fmt.Sprintf("%s.services[%d]", f, j)
			if err := line(sf+".name", svc.Name); err != nil {
				return err
			}
			if err := models.MaxItems(sf+".parameters", len(svc.Parameters), models.MaxListLen); err != nil {
				return err
			}
			for k, p := range svc.Parameters {
				pf := fmt.Sprintf("%s.parameters[%d]", sf, k)
				if err := line(pf+".name", p.Name); err != nil {
					return err
				}
				if p.Value != nil {
					if err := models.ValidText(pf+".value", *p.Value, models.MaxTextLen); err != nil {
						return err
					}
				}
				if r := p.Reference; r != nil {
					for _, v := range []struct{ field, s string }{{".assembly", r.Assembly}, {".assembly_type", r.AssemblyType},
						{".service", r.Service}, {".match_type", r.MatchType}, {".provided_parameter", r.ProvidedParameter}} {
						if err := line(pf+".reference"+v.field, v.s); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	for i, a := range doc.Deployable.Assemblies {
		f := fmt.Sprintf("deployable.assemblies[%d]", i)
		if err := name(f+".name", "instance", a.Name); err != nil {
			return err
		}
		if err := line(f+".type", a.Type); err != nil {
			return err
		}
		if err := line(f+".hwp", a.HWP); err != nil {
			return err
		}
	}
	return nil
}
