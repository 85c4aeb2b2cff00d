package models

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/workflows/contract"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateNodeName checks that name is a valid lower-case FQDN inside the
// admin DNS domain, as Crowbar requires of node names.
func ValidateNodeName(name, domain string) error {
	if name == "" {
		return Invalid("name", "is required")
	}
	if len(name) > 253 {
		return Invalid("name", "%q is longer than 253 characters", name)
	}
	for _, label := range strings.Split(name, ".") {
		if !dnsLabel.MatchString(label) {
			return Invalid("name", "%q is not a valid FQDN: label %q must be 1-63 lower-case letters, digits or inner hyphens", name, label)
		}
	}
	if domain != "" && !strings.HasSuffix(name, "."+domain) {
		return Invalid("name", "%q is not inside the admin DNS domain %q", name, domain)
	}
	return nil
}

// NodeInput is what an operator or an agent gives to create a node.
type NodeInput struct {
	Name    string
	Admin   bool
	BootID  string
	Address string
	// Deployment is the deployment's name or id; empty means system.
	Deployment string
}

// CreateNode validates and creates a node in one transaction. With
// withCredential it also mints the agent's own token and returns it.
func (s *Store) CreateNode(ctx context.Context, in NodeInput, withCredential bool) (*Node, string, error) {
	return s.CreateNodeThen(ctx, in, withCredential, nil)
}

// CreateNodeThen is CreateNode with then called inside the database
// transaction once the node row exists: the API starts the node's bootstrap
// workflow there, so that a node never exists without it.
func (s *Store) CreateNodeThen(ctx context.Context, in NodeInput, withCredential bool, then func(*Node) error) (*Node, string, error) {
	node, secret, _, err := s.EnrollNodeThen(ctx, in, withCredential, then)
	return node, secret, err
}

// EnrollNodeThen is CreateNodeThen that, with withCredential (an agent
// registering), also enrolls an existing node that has no credential yet
// (created through the API or for a deployable's instance): the node gets
// the credential, then is not called, and enrolled is true. A node that
// already has a credential is a ConflictError saying what to do.
func (s *Store) EnrollNodeThen(ctx context.Context, in NodeInput, withCredential bool, then func(*Node) error) (node *Node, secret string, enrolled bool, err error) {
	if err := ValidateNodeName(in.Name, s.Domain); err != nil {
		return nil, "", false, err
	}
	for _, check := range []error{ValidBootID("boot_id", in.BootID), ValidAddress("address", in.Address), ValidLine("deployment", in.Deployment, MaxLineLen)} {
		if check != nil {
			return nil, "", false, check
		}
	}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		ref := in.Deployment
		if ref == "" {
			ref = SystemDeployment
		}
		dep, err := DeploymentInField(tx, "deployment", ref)
		if err != nil {
			return err
		}
		var existing []Node
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("name = ?", in.Name).Find(&existing).Error; err != nil {
			return fmt.Errorf("check node name: %w", err)
		}
		if len(existing) > 0 {
			if !withCredential {
				return &ConflictError{Reason: fmt.Sprintf("a node named %q already exists", in.Name)}
			}
			// An agent enrolling a node that exists already: one
			// created through the API or for a deployable's instance
			// has no credential yet, and its agent takes it up (its
			// bootstrap started when it was created).
			node = &existing[0]
			if node.AgentTokenHash != nil {
				return &ConflictError{Reason: fmt.Sprintf("node %q already has an agent credential: an agent restarting keeps its credential file "+
					"instead of registering again; to re-provision the machine, restore that file, or delete the node (DELETE /api/v1/nodes/%s) "+
					"and let its agent register afresh", in.Name, in.Name)}
			}
			secret = NewSecret("agt_")
			now := Now()
			set := map[string]any{"agent_token_hash": HashSecret(secret), "boot_id": in.BootID,
				"alive": true, "last_seen_at": now, "updated_at": now}
			if in.Address != "" { // an agent that names no address keeps the known one
				set["address"] = in.Address
			}
			err := tx.Model(node).Updates(set).Error
			if err != nil {
				return fmt.Errorf("enroll node %q: %w", in.Name, err)
			}
			enrolled = true
			return nil
		}
		node = &Node{
			Name: in.Name, Admin: in.Admin, Allocated: true, Available: true,
			Status: NodeDiscover, Progress: 100, Roles: []string{}, Tags: []string{},
			Attributes: map[string]any{}, DeploymentID: dep.ID, BootID: in.BootID, Address: in.Address,
		}
		if withCredential {
			secret = NewSecret("agt_")
			hash := HashSecret(secret)
			node.AgentTokenHash = &hash
			t := Now()
			node.LastSeenAt = &t
			node.Alive = true
		}
		if err := tx.Create(node).Error; err != nil {
			return fmt.Errorf("create node %q: %w", in.Name, UniqueViolation(err, fmt.Sprintf("a node named %q already exists", in.Name)))
		}
		if then != nil {
			return then(node)
		}
		return nil
	})
	if err != nil {
		return nil, "", false, err
	}
	return node, secret, enrolled, nil
}

// TouchNode records an agent heartbeat: the node is alive, with its boot id
// and address as last reported. It answers the node's name; revived says it
// was not alive before (the annealer may now give it work). Every agent
// calls it every few seconds, so the common case (a node already alive) is
// one plain UPDATE and nothing is read back but the name.
func (s *Store) TouchNode(ctx context.Context, nodeID int64, bootID, address string) (name string, revived bool, err error) {
	if err := validHeartbeat(bootID, address); err != nil {
		return "", false, err
	}
	var names []string
	err = s.DB.WithContext(ctx).Raw(`UPDATE nodes SET last_seen_at = now(), boot_id = ?,
			address = CASE WHEN ? <> '' THEN ? ELSE address END, updated_at = now()
		WHERE id = ? AND alive
		RETURNING name`, bootID, address, address, nodeID).Find(&names).Error
	if err != nil {
		return "", false, fmt.Errorf("touch node %d: %w", nodeID, err)
	}
	if len(names) == 1 {
		return names[0], false, nil
	}
	// Not alive (or gone): revive it, and say whether it was dead, since
	// another request may have revived it in between.
	var rows []struct {
		Alive bool
		Name  string
	}
	err = s.DB.WithContext(ctx).Raw(`UPDATE nodes n SET alive = true, last_seen_at = now(), boot_id = ?,
			address = CASE WHEN ? <> '' THEN ? ELSE n.address END, updated_at = now()
		FROM (SELECT id, alive FROM nodes WHERE id = ? FOR UPDATE) old
		WHERE n.id = old.id
		RETURNING old.alive, n.name`, bootID, address, address, nodeID).Find(&rows).Error
	if err != nil {
		return "", false, fmt.Errorf("touch node %d: %w", nodeID, err)
	}
	if len(rows) == 0 {
		return "", false, NotFound("node", nodeID)
	}
	return rows[0].Name, !rows[0].Alive, nil
}

// validHeartbeat checks what a heartbeat reports: the first field wrong.
func validHeartbeat(bootID, address string) error {
	if err := ValidBootID("boot_id", bootID); err != nil {
		return err
	}
	return ValidAddress("address", address)
}

// NodeTouch is one agent heartbeat for TouchNodes.
type NodeTouch struct {
	NodeID          int64
	BootID, Address string
}

// Touched is what TouchNode answers for one heartbeat of TouchNodes.
type Touched struct {
	Name    string
	Revived bool
	Err     error
}

// TouchNodes records several agents' heartbeats as TouchNode does each, in
// one statement for the nodes already alive (the common case): a thousand
// agents heartbeat fifty times a second, most of what an idle site costs
// Postgres. The others (not alive, gone, or an invalid heartbeat) go
// through TouchNode one by one. Its answers are in touches' order; the
// error is one that failed them all.
func (s *Store) TouchNodes(ctx context.Context, touches []NodeTouch) ([]Touched, error) {
	out := make([]Touched, len(touches))
	type row struct {
		ID      int64  `json:"id"`
		BootID  string `json:"boot_id"`
		Address string `json:"address"`
	}
	var rows []row
	for i, t := range touches {
		if err := validHeartbeat(t.BootID, t.Address); err != nil {
			out[i].Err = err
			continue
		}
		rows = append(rows, row{ID: t.NodeID, BootID: t.BootID, Address: t.Address})
	}
	alive := map[int64]string{}
	if len(rows) > 0 {
		batch, err := json.Marshal(rows)
		if err != nil {
			return nil, fmt.Errorf("touch nodes: %w", err)
		}
		var touched []struct {
			ID   int64
			Name string
		}
		// A node heartbeating twice in one batch is updated once.
		err = s.DB.WithContext(ctx).Raw(`UPDATE nodes n SET last_seen_at = now(), boot_id = t.boot_id,
			address = CASE WHEN t.address <> '' THEN t.address ELSE n.address END, updated_at = now()
		FROM (SELECT DISTINCT ON (id) * FROM jsonb_to_recordset(CAST(? AS jsonb)) AS r(id bigint, boot_id text, address text) ORDER BY id) t
		WHERE n.id = t.id AND n.alive
		RETURNING n.id, n.name`, string(batch)).Scan(&touched).Error
		if err != nil {
			return nil, fmt.Errorf("touch %d nodes: %w", len(rows), err)
		}
		for _, t := range touched {
			alive[t.ID] = t.Name
		}
	}
	for i, t := range touches {
		if out[i].Err != nil {
			continue
		}
		if name, ok := alive[t.NodeID]; ok {
			out[i].Name = name
			continue
		}
		out[i].Name, out[i].Revived, out[i].Err = s.TouchNode(ctx, t.NodeID, t.BootID, t.Address)
	}
	return out, nil
}

// Node finds a node by id or name.
func (s *Store) Node(ctx context.Context, ref string) (*Node, error) {
	return FindNode(s.DB.WithContext(ctx), ref)
}

// FindNode finds a node by id or name within tx.
func FindNode(tx *gorm.DB, ref string) (*Node, error) {
	return TakeRef[Node](ByRef(tx, ref), "node", ref)
}

// Nodes lists nodes, optionally only those of one deployment.
func (s *Store) Nodes(ctx context.Context, deploymentID int64) ([]Node, error) {
	var nodes []Node
	q := s.DB.WithContext(ctx).Order("name")
	if deploymentID != 0 {
		q = q.Where("deployment_id = ?", deploymentID)
	}
	if err := q.Find(&nodes).Error; err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return nodes, nil
}

// NodesPage lists one page of nodes (of one deployment when deploymentID
// is not 0) in name order, keyset on the name (bytewise, so that the
// cursor's comparison and the order agree whatever the collation).
func (s *Store) NodesPage(ctx context.Context, deploymentID int64, page Page) (nodes []Node, next string, err error) {
	limit := page.PageLimit()
	q := s.DB.WithContext(ctx).Order(`name COLLATE "C"`).Limit(limit + 1)
	if deploymentID != 0 {
		q = q.Where("deployment_id = ?", deploymentID)
	}
	if page.Cursor != "" {
		var after string
		if err := DecodeCursor(page.Cursor, &after); err != nil {
			return nil, "", err
		}
		q = q.Where(`name COLLATE "C" > ?`, after)
	}
	if err := q.Find(&nodes).Error; err != nil {
		return nil, "", fmt.Errorf("list nodes: %w", err)
	}
	if len(nodes) > limit {
		nodes = nodes[:limit]
		next = EncodeCursor(nodes[limit-1].Name)
	}
	return nodes, next, nil
}

// NodeUpdate changes a node's deployment, role assignment and flags; nil
// fields stay as they are.
type NodeUpdate struct {
	Deployment *string   // name or id
	Roles      *[]string // the complete new role list
	// Available false keeps the annealer from giving the node anything.
	Available *bool
	// Allocated says anneal may manage the node.
	Allocated *bool
	// Attributes are merged into the node's attributes key by key (a
	// JSON merge patch of one level): a key set to nil is removed.
	Attributes map[string]any
}

// UpdateNode moves a node, assigns roles, sets its available and allocated
// flags and patches its attributes in one transaction. Assigning a role adds the role's tags
// and its own name to the node's tags; removing a role removes the tags it
// brought (tags added by hand stay).
func (s *Store) UpdateNode(ctx context.Context, ref string, up NodeUpdate) (*Node, error) {
	if up.Deployment != nil {
		if err := ValidLine("deployment", *up.Deployment, MaxLineLen); err != nil {
			return nil, err
		}
	}
	if up.Roles != nil {
		if err := MaxItems("roles", len(*up.Roles), MaxListLen); err != nil {
			return nil, err
		}
	}
	var out *Node
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, oldDep, err := LockNode(tx, ref)
		if err != nil {
			return err
		}
		oldRoles, err := ReleaseRoles(tx, oldDep)
		if err != nil {
			return err
		}
		dep, newRoles := oldDep, oldRoles
		if up.Deployment != nil {
			dep, err = DeploymentInField(tx, "deployment", *up.Deployment)
			if err != nil {
				return err
			}
			if newRoles, err = ReleaseRoles(tx, dep); err != nil {
				return err
			}
			node.DeploymentID = dep.ID
		}
		roles := up.Roles
		if roles == nil && dep.ID != oldDep.ID {
			// Roles belong to a deployment's release: moving without a new
			// role list leaves the node with none.
			roles = &[]string{}
		}
		if roles != nil {
			for i, name := range *roles {
				if _, ok := newRoles[name]; !ok {
					return Invalid(fmt.Sprintf("roles[%d]", i), "role %q is not in the release of deployment %q", name, dep.Name)
				}
			}
			// Drop what the old roles brought (as their release defined
			// them), then add what the new ones bring.
			node.Tags = reassignRoleTags(reassignRoleTags(node.Tags, node.Roles, nil, oldRoles), nil, *roles, newRoles)
			node.Roles = slices.Clone(*roles)
		}
		if up.Available != nil {
			node.Available = *up.Available
		}
		if up.Allocated != nil {
			node.Allocated = *up.Allocated
		}
		if up.Attributes != nil {
			merged := maps.Clone(node.Attributes)
			if merged == nil {
				merged = map[string]any{}
			}
			for k, v := range stripNULMap(up.Attributes) {
				if v == nil {
					delete(merged, k)
				} else {
					merged[k] = v
				}
			}
			node.Attributes = merged
		}
		node.UpdatedAt = Now()
		if err := tx.Select("deployment_id", "roles", "tags", "available", "allocated", "attributes", "updated_at").Save(node).Error; err != nil {
			return fmt.Errorf("update node %s: %w", ref, err)
		}
		out = node
		return nil
	})
	return out, err
}

// releaseRoles maps the roles of a deployment's release by name.
func ReleaseRoles(tx *gorm.DB, dep *Deployment) (map[string]Role, error) {
	out := map[string]Role{}
	if dep.ReleaseID == nil {
		return out, nil
	}
	var roles []Role
	if err := tx.Where("release_id = ?", *dep.ReleaseID).Find(&roles).Error; err != nil {
		return nil, fmt.Errorf("load roles of deployment %s: %w", dep.Name, err)
	}
	for _, r := range roles {
		out[r.Name] = r
	}
	return out, nil
}

// reassignRoleTags drops the tags brought by roles no longer assigned and
// adds those of the new roles, keeping the user's own tags.
func reassignRoleTags(tags, oldRoles, newRoles []string, roles map[string]Role) []string {
	brought := func(list []string) map[string]bool {
		set := map[string]bool{}
		for _, name := range list {
			set[name] = true
			for _, t := range roles[name].Tags {
				set[t] = true
			}
		}
		return set
	}
	oldSet, newSet := brought(oldRoles), brought(newRoles)
	out := []string{}
	seen := map[string]bool{}
	for _, t := range tags {
		if oldSet[t] && !newSet[t] {
			continue
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, name := range newRoles {
		for _, t := range append([]string{name}, roles[name].Tags...) {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// MarkSilentNodes sets nodes whose agent has not been heard from for
// longer than silence as not alive, so the annealer gives them nothing,
// and returns their names. A heartbeat makes a node alive again.
func (s *Store) MarkSilentNodes(ctx context.Context, silence time.Duration) ([]string, error) {
	var names []string
	err := s.DB.WithContext(ctx).Raw(`
UPDATE nodes SET alive = false, updated_at = now()
WHERE alive AND agent_token_hash IS NOT NULL AND last_seen_at < now() - make_interval(secs => ?)
RETURNING name`, silence.Seconds()).Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("mark silent nodes: %w", err)
	}
	return names, nil
}

// lockNode loads a node (by id or name) locked for update, with its
// deployment: the start of every change to a node's roles or tags.
func LockNode(tx *gorm.DB, ref string) (*Node, *Deployment, error) {
	node, err := TakeRef[Node](ByRef(tx.Clauses(clause.Locking{Strength: "UPDATE"}), ref), "node", ref)
	if err != nil {
		return nil, nil, err
	}
	dep, err := FindDeployment(tx, strconv.FormatInt(node.DeploymentID, 10))
	if err != nil {
		return nil, nil, err
	}
	return node, dep, nil
}

// DeleteNode destroys a node in one transaction, as Crowbar does: its
// on_node_delete hooks run first (on every role that has one), then the
// node goes with its noderoles, tags, software deployments and
// allocations; the runs of its past transactions stay, naming it, for
// their transaction's history. A node with work under way is refused
// (409) with what to wait for or stop: a run in progress, a noderole in
// transition, an unfinished transaction with runs on the node, or a
// software deployment in progress.
func (s *Store) DeleteNode(ctx context.Context, ref string) (*Node, error) {
	var out *Node
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, err := DeleteNodeIn(ctx, tx, ref)
		out = node
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteNodeIn is DeleteNode inside the caller's database transaction:
// a node with work under way is a ConflictError, its on_node_delete hooks
// run first.
func DeleteNodeIn(ctx context.Context, tx *gorm.DB, ref string) (*Node, error) {
	// The lock keeps new work off the node until it is gone: planning a
	// run or starting a noderole needs the node's row.
	node, _, err := LockNode(tx, ref)
	if err != nil {
		return nil, err
	}
	if err := nodeBusy(tx, node); err != nil {
		return nil, err
	}
	if err := RunNodeHooks(ctx, tx, OnNodeDelete, node); err != nil {
		return nil, err
	}
	if err := tx.Delete(&Node{}, node.ID).Error; err != nil {
		return nil, fmt.Errorf("delete node %s: %w", node.Name, err)
	}
	return node, nil
}

// nodeBusy returns a ConflictError saying what to wait for or stop when
// the node has work under way, nil when it may be deleted.
func nodeBusy(tx *gorm.DB, node *Node) error {
	running, err := NodeRunning(tx, node.ID, 0, 0)
	if err != nil {
		return err
	}
	if running != "" {
		return &ConflictError{Reason: fmt.Sprintf("node %s is busy: %s; wait for it to end (or stop its transaction), then delete the node", node.Name, running)}
	}
	// Runs still to come: the transaction's node workflow would look for
	// the node, and its other nodes may wait on these runs.
	txID, err := TransactionWants(tx, node.ID)
	if err != nil {
		return err
	}
	if txID != "" {
		return &ConflictError{Reason: fmt.Sprintf("transaction %s has not finished and has runs to do on node %s: wait for it to end or stop it (POST /api/v1/transactions/%s/stop), then delete the node",
			txID, node.Name, txID)}
	}
	// A deployment in progress has a workflow waiting for the node's agent.
	var swd []struct {
		ID         int64
		TimeoutSec int
	}
	if err := tx.Raw(`SELECT id, timeout_sec FROM software_deployments WHERE node_id = ? AND status = ? ORDER BY id LIMIT 1`,
		node.ID, contract.SoftwareInProgress).Scan(&swd).Error; err != nil {
		return fmt.Errorf("check software deployments of node %s: %w", node.Name, err)
	}
	if len(swd) > 0 {
		return &ConflictError{Reason: fmt.Sprintf("software deployment %d is in progress on node %s: wait for it to complete or fail (it times out after %ds), then delete the node",
			swd[0].ID, node.Name, swd[0].TimeoutSec)}
	}
	return nil
}
