package crowbar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/attrs"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// NodeRole binds a role to a node in a snapshot.
type NodeRole struct {
	ID         int64          `json:"id"`
	SnapshotID int64          `json:"snapshot_id"`
	NodeID     int64          `json:"node_id"`
	RoleID     int64          `json:"role_id"`
	State      string         `json:"state"`
	UserData   map[string]any `json:"user_data" gorm:"serializer:json"`
	SystemData map[string]any `json:"system_data" gorm:"serializer:json"`
	Wall       map[string]any `json:"wall" gorm:"serializer:json"`
	RunCount   int            `json:"run_count"`
	CreatedAt  time.Time      `json:"created_at"`
	UpdatedAt  time.Time      `json:"updated_at"`
	// Filled when loaded through the Store (not columns).
	NodeName string  `json:"node" gorm:"-"`
	RoleName string  `json:"role" gorm:"-"`
	Parents  []int64 `json:"parents" gorm:"-"`
	Children []int64 `json:"children" gorm:"-"`
	// LastRun is the noderole's newest run (its state, exit code, error,
	// output tails, times, and the attributes it was sent and handed
	// back), filled when one noderole is loaded; nil when it never ran.
	LastRun *models.TaskRun `json:"last_run,omitempty" gorm:"-"`
}

// TableName is the noderoles table.
func (NodeRole) TableName() string { return "noderoles" }

// NodeRoleEdge orders two noderoles: the parent must be active before the
// child runs.
type NodeRoleEdge struct {
	ParentID int64
	ChildID  int64
}

// TableName is the noderole_edges table.
func (NodeRoleEdge) TableName() string { return "noderole_edges" }

// Role events (hooks registered by role name).
const (
	OnProposed   = "on_proposed"
	OnTodo       = "on_todo"
	OnBlocked    = "on_blocked"
	OnTransition = "on_transition"
	OnError      = "on_error"
	OnActive     = "on_active"
)

// NodeRoleHook reacts to a noderole event inside the transaction that made
// the transition. Hooks run synchronously, so they must be fast, and must be
// idempotent; an error aborts the transaction.
type NodeRoleHook func(ctx context.Context, tx *gorm.DB, nr *NodeRole) error

var (
	hooksMu   sync.RWMutex
	roleHooks = map[string]map[string][]NodeRoleHook{}
)

// RegisterRoleHook registers h for the event of every role named role (in
// any release). Several hooks for one role and event run in registration
// order.
func RegisterRoleHook(role, event string, h NodeRoleHook) {
	if event == models.OnNodeCreate || event == models.OnNodeDelete {
		panic("RegisterRoleHook: " + event + " is a node event; use RegisterNodeHook")
	}
	hooksMu.Lock()
	defer hooksMu.Unlock()
	if roleHooks[role] == nil {
		roleHooks[role] = map[string][]NodeRoleHook{}
	}
	roleHooks[role][event] = append(roleHooks[role][event], h)
}

// RunRoleHooks runs the hooks registered for the role's event on nr.
func RunRoleHooks(ctx context.Context, tx *gorm.DB, role, event string, nr *NodeRole) error {
	hooksMu.RLock()
	hooks := slices.Clone(roleHooks[role][event])
	hooksMu.RUnlock()
	for _, h := range hooks {
		if err := h(ctx, tx, nr); err != nil {
			return fmt.Errorf("%s hook of role %s: %w", event, role, err)
		}
	}
	return nil
}

// stateEvents names the event of each state a noderole can enter.
var stateEvents = map[string]string{
	contract.NodeRoleTodo: OnTodo, contract.NodeRoleBlocked: OnBlocked, contract.NodeRoleTransition: OnTransition,
	contract.NodeRoleError: OnError, contract.NodeRoleActive: OnActive,
}

// announce runs, for each noderole (in the order given), the hooks of the
// event of the state it is now in. The seed calls them after the noderole
// and its children have been updated, so callers announce the noderole
// itself first and then the children they changed.
func announce(ctx context.Context, tx *gorm.DB, ids ...int64) error {
	for _, id := range ids {
		nr, err := loadNodeRole(tx, id, false)
		if err != nil {
			return err
		}
		if event, ok := stateEvents[nr.State]; ok {
			if err := RunRoleHooks(ctx, tx, nr.RoleName, event, nr); err != nil {
				return err
			}
		}
	}
	return nil
}

// ActiveJigs are the jigs that can run roles now.
var ActiveJigs = map[string]bool{"agent": true, "local": true, "noop": true, "ssh": true}

// JigActive reports whether a jig can run roles.
func JigActive(jig string) bool { return ActiveJigs[jig] }

func activeJigList() []string {
	out := make([]string, 0, len(ActiveJigs))
	for j, ok := range ActiveJigs {
		if ok {
			out = append(out, j)
		}
	}
	slices.Sort(out)
	return out
}

// deploymentChain returns the deployment and its ancestors up to system,
// nearest first.
func deploymentChain(tx *gorm.DB, dep *models.Deployment) ([]models.Deployment, error) {
	chain := []models.Deployment{*dep}
	seen := map[int64]bool{dep.ID: true}
	for cur := dep; cur.ParentID != nil; {
		var parent models.Deployment
		if err := tx.Take(&parent, *cur.ParentID).Error; err != nil {
			return nil, fmt.Errorf("load parent of deployment %s: %w", cur.Name, err)
		}
		if seen[parent.ID] {
			break
		}
		seen[parent.ID] = true
		chain = append(chain, parent)
		cur = &chain[len(chain)-1]
	}
	return chain, nil
}

// resolveRole finds a role by name or id for a deployment: in the release of
// the deployment or of its nearest ancestor that has one; with no release on
// the chain, among all roles (a name must then be unambiguous).
func resolveRole(tx *gorm.DB, chain []models.Deployment, ref string) (*models.Role, error) {
	q := tx.Model(&models.Role{})
	id, idErr := strconv.ParseInt(ref, 10, 64)
	if idErr == nil {
		q = q.Where("id = ?", id)
	} else {
		q = q.Where("name = ?", ref)
	}
	for _, d := range chain {
		if d.ReleaseID != nil {
			q = q.Where("release_id = ?", *d.ReleaseID)
			break
		}
	}
	var roles []models.Role
	if err := q.Order("id").Limit(2).Find(&roles).Error; err != nil {
		return nil, fmt.Errorf("load role %s: %w", ref, err)
	}
	switch len(roles) {
	case 0:
		return nil, models.Invalid("role", "no role %q in the release of deployment %q (or of its parents)", ref, chain[0].Name)
	case 1:
		return &roles[0], nil
	}
	return nil, models.Invalid("role", "role name %q is ambiguous: deployment %q has no release and several releases define it; use the role's id", ref, chain[0].Name)
}

// BindInput binds a role to a node in a proposed snapshot.
type BindInput struct {
	Node string // name or id
	Role string // name or id
}

// BindRole runs Crowbar's add_to_node_in_snapshot in one transaction: it
// returns the noderole and whether it was created (false: the binding
// already existed).
func (s *Store) BindRole(ctx context.Context, snapshotID int64, in BindInput) (*NodeRole, bool, error) {
	if err := models.ValidLine("node", in.Node, models.MaxLineLen); err != nil {
		return nil, false, err
	}
	if err := models.ValidLine("role", in.Role, models.MaxLineLen); err != nil {
		return nil, false, err
	}
	if in.Node == "" {
		return nil, false, models.Invalid("node", "is required")
	}
	if in.Role == "" {
		return nil, false, models.Invalid("role", "is required")
	}
	var out *NodeRole
	var created bool
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		snap, err := lockSnapshot(tx, snapshotID)
		if err != nil {
			return err
		}
		if err := requireProposed(snap); err != nil {
			return err
		}
		dep, err := models.FindDeployment(tx, strconv.FormatInt(snap.DeploymentID, 10))
		if err != nil {
			return err
		}
		node, err := models.FindNode(tx, in.Node)
		if errors.Is(err, models.ErrNotFound) {
			return models.Invalid("node", "no node named or numbered %q", in.Node)
		}
		if err != nil {
			return err
		}
		chain, err := deploymentChain(tx, dep)
		if err != nil {
			return err
		}
		// A node of an ancestor deployment (a discovered node in system)
		// moves into this one when the snapshot is committed.
		if !slices.ContainsFunc(chain, func(d models.Deployment) bool { return d.ID == node.DeploymentID }) {
			return models.Invalid("node", "node %s belongs to deployment %d, which is neither %q nor one of its parents; a node moves only down from a parent deployment",
				node.Name, node.DeploymentID, dep.Name)
		}
		role, err := resolveRole(tx, chain, in.Role)
		if err != nil {
			return err
		}
		b := &binder{ctx: ctx, tx: tx, snap: snap, chain: chain, node: node}
		out, created, err = b.add(role, nil)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	loaded, err := s.NodeRole(ctx, out.ID)
	if err != nil {
		return nil, false, err
	}
	return loaded, created, nil
}

// binder carries one add_to_node_in_snapshot call and its recursion.
type binder struct {
	ctx   context.Context
	tx    *gorm.DB
	snap  *Snapshot
	chain []models.Deployment // the snapshot's deployment, then its ancestors
	node  *models.Node
}

// add is add_to_node_in_snapshot for role on the binder's node; path holds
// the roles being bound implicitly above this call (for the error message).
func (b *binder) add(role *models.Role, path []string) (*NodeRole, bool, error) {
	tx := b.tx
	// 1: the role's jig must be active.
	if !JigActive(role.Jig) {
		return nil, false, &models.InputError{Field: "role", Reason: fmt.Sprintf("role %q uses jig %q, which is not active (active jigs: %v)", role.Name, role.Jig, activeJigList()),
			Details: map[string]any{"role": role.Name, "jig": role.Jig}}
	}
	// 2: the deployment role, created once.
	dr, err := ensureDeploymentRole(tx, b.snap.DeploymentID, role)
	if err != nil {
		return nil, false, err
	}
	// 3: an existing binding of this role on this node is the answer.
	var existing []NodeRole
	if err := tx.Where("snapshot_id = ? AND node_id = ? AND role_id = ?", b.snap.ID, b.node.ID, role.ID).
		Limit(1).Find(&existing).Error; err != nil {
		return nil, false, fmt.Errorf("look for role %s on node %s: %w", role.Name, b.node.Name, err)
	}
	if len(existing) > 0 {
		return &existing[0], false, nil
	}
	// 4: each parent role: on this node, else anywhere visible, else bound
	// implicitly here, else an error.
	var parents []int64
	for _, parentName := range role.Requires {
		var prole models.Role
		err := tx.Where("release_id = ? AND name = ?", role.ReleaseID, parentName).Take(&prole).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, false, models.Invalid("role", "role %q requires %q, which is not in its release", role.Name, parentName)
		}
		if err != nil {
			return nil, false, fmt.Errorf("load role %s: %w", parentName, err)
		}
		pid, err := b.findParent(&prole)
		if err != nil {
			return nil, false, err
		}
		if pid == 0 {
			if !slices.Contains(prole.Flags, models.FlagImplicit) {
				return nil, false, &models.InputError{Field: "role",
					Reason: fmt.Sprintf("role %q requires role %q, which is bound neither on node %s nor anywhere in deployment %q or its parents, and is not implicit; bind %q first",
						role.Name, prole.Name, b.node.Name, b.chain[0].Name, prole.Name),
					Details: map[string]any{"missing_role": prole.Name, "node": b.node.Name, "path": append(slices.Clone(path), role.Name)}}
			}
			pnr, _, err := b.add(&prole, append(slices.Clone(path), role.Name))
			if err != nil {
				return nil, false, err
			}
			pid = pnr.ID
		}
		if !slices.Contains(parents, pid) {
			parents = append(parents, pid)
		}
	}
	// 5: the new noderole, proposed, with its edges.
	nr := &NodeRole{
		SnapshotID: b.snap.ID, NodeID: b.node.ID, RoleID: role.ID, State: contract.NodeRoleProposed,
		UserData: attrs.Clone(dr.Data), SystemData: map[string]any{}, Wall: map[string]any{},
	}
	if err := tx.Create(nr).Error; err != nil {
		return nil, false, fmt.Errorf("bind role %s to node %s: %w", role.Name, b.node.Name,
			models.UniqueViolation(err, fmt.Sprintf("role %q is being bound to node %s by another request", role.Name, b.node.Name)))
	}
	for _, pid := range parents {
		if err := tx.Create(&NodeRoleEdge{ParentID: pid, ChildID: nr.ID}).Error; err != nil {
			return nil, false, fmt.Errorf("link noderole %d to parent %d: %w", nr.ID, pid, err)
		}
	}
	nr.NodeName, nr.RoleName, nr.Parents, nr.Children = b.node.Name, role.Name, parents, []int64{}
	// 6: on_proposed.
	if err := RunRoleHooks(b.ctx, tx, role.Name, OnProposed, nr); err != nil {
		return nil, false, err
	}
	// 7: done.
	return nr, true, nil
}

// findParent looks for a binding of prole visible from the snapshot — in
// the snapshot itself or in the committed snapshots of the ancestor
// deployments (siblings are not visible): on the same node first (this
// snapshot before the ancestors), else on any node (this snapshot, then the
// ancestors nearest first). It returns 0 when there is none.
func (b *binder) findParent(prole *models.Role) (int64, error) {
	ancestors := make([]int64, 0, len(b.chain)-1)
	for _, anc := range b.chain[1:] {
		ancestors = append(ancestors, anc.ID)
	}
	if len(ancestors) == 0 {
		ancestors = append(ancestors, 0) // IN () is not SQL
	}
	var ids []int64
	err := b.tx.Raw(`SELECT nr.id FROM noderoles nr JOIN snapshots s ON s.id = nr.snapshot_id
		WHERE nr.role_id = @role AND (nr.snapshot_id = @snap OR (s.deployment_id IN @anc AND s.state = 'committed'))
		ORDER BY nr.node_id = @node DESC, nr.snapshot_id = @snap DESC, array_position(CAST(@depth AS bigint[]), s.deployment_id), nr.id
		LIMIT 1`, map[string]any{"role": prole.ID, "snap": b.snap.ID, "anc": ancestors, "node": b.node.ID,
		"depth": pgArray(ancestors)}).Scan(&ids).Error
	if err != nil {
		return 0, fmt.Errorf("look for role %s: %w", prole.Name, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	return ids[0], nil
}

// pgArray writes ids as a Postgres array literal.
func pgArray(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// ensureDeploymentRole returns the deployment's role defaults, creating
// them from the role's template the first time.
func ensureDeploymentRole(tx *gorm.DB, deploymentID int64, role *models.Role) (*DeploymentRole, error) {
	dr := &DeploymentRole{DeploymentID: deploymentID, RoleID: role.ID, Data: attrs.Clone(role.Template)}
	if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(dr).Error; err != nil {
		return nil, fmt.Errorf("create deployment role %s: %w", role.Name, err)
	}
	var out DeploymentRole
	if err := tx.Where("deployment_id = ? AND role_id = ?", deploymentID, role.ID).Take(&out).Error; err != nil {
		return nil, fmt.Errorf("load deployment role %s: %w", role.Name, err)
	}
	if out.Data == nil {
		out.Data = map[string]any{}
	}
	return &out, nil
}

// jsonb is a JSON object as an SQL expression, for map updates (which do
// not go through the fields' serializer).
func jsonb(v map[string]any) clause.Expr { return jsonValue(v) }

// decorateNodeRoles fills the node and role names and the edges.
func decorateNodeRoles(db *gorm.DB, nrs []NodeRole) error {
	if len(nrs) == 0 {
		return nil
	}
	ids := make([]int64, len(nrs))
	nodeIDs, roleIDs := []int64{}, []int64{}
	for i, nr := range nrs {
		ids[i] = nr.ID
		nodeIDs = append(nodeIDs, nr.NodeID)
		roleIDs = append(roleIDs, nr.RoleID)
	}
	var nodes []models.Node
	if err := db.Select("id", "name").Where("id IN ?", nodeIDs).Find(&nodes).Error; err != nil {
		return fmt.Errorf("load noderole nodes: %w", err)
	}
	var roles []models.Role
	if err := db.Select("id", "name").Where("id IN ?", roleIDs).Find(&roles).Error; err != nil {
		return fmt.Errorf("load noderole roles: %w", err)
	}
	var edges []NodeRoleEdge
	if err := db.Where("parent_id IN ? OR child_id IN ?", ids, ids).Order("parent_id, child_id").Find(&edges).Error; err != nil {
		return fmt.Errorf("load noderole edges: %w", err)
	}
	nodeNames, roleNames := map[int64]string{}, map[int64]string{}
	for _, n := range nodes {
		nodeNames[n.ID] = n.Name
	}
	for _, r := range roles {
		roleNames[r.ID] = r.Name
	}
	for i := range nrs {
		nr := &nrs[i]
		nr.NodeName, nr.RoleName = nodeNames[nr.NodeID], roleNames[nr.RoleID]
		nr.Parents, nr.Children = []int64{}, []int64{}
		for _, e := range edges {
			if e.ChildID == nr.ID {
				nr.Parents = append(nr.Parents, e.ParentID)
			}
			if e.ParentID == nr.ID {
				nr.Children = append(nr.Children, e.ChildID)
			}
		}
	}
	return nil
}

// NodeRole loads a noderole with its names, edges and last run, as the
// API shows it.
func (s *Store) NodeRole(ctx context.Context, id int64) (*NodeRole, error) {
	db := s.DB.WithContext(ctx)
	nr, err := loadNodeRole(db, id, false)
	if err != nil {
		return nil, err
	}
	if nr.LastRun, err = lastNodeRoleRun(db, id); err != nil {
		return nil, err
	}
	return nr, nil
}

func loadNodeRole(tx *gorm.DB, id int64, lock bool) (*NodeRole, error) {
	q := tx
	if lock {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var nr NodeRole
	err := q.Take(&nr, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("noderole", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load noderole %d: %w", id, err)
	}
	list := []NodeRole{nr}
	if err := decorateNodeRoles(tx, list); err != nil {
		return nil, err
	}
	return &list[0], nil
}

// UpdateNodeRole replaces a noderole's user data; only in a proposed
// snapshot. An edited noderole goes back to proposed, so that committing
// runs it again.
func (s *Store) UpdateNodeRole(ctx context.Context, id int64, userData map[string]any) (*NodeRole, error) {
	if err := models.ValidateMap("user_data", userData); err != nil {
		return nil, err
	}
	if userData == nil {
		return nil, models.Invalid("user_data", "is required (a JSON object)")
	}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var nr NodeRole
		err := tx.Take(&nr, id).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return models.NotFound("noderole", id)
		}
		if err != nil {
			return fmt.Errorf("load noderole %d: %w", id, err)
		}
		snap, err := lockSnapshot(tx, nr.SnapshotID)
		if err != nil {
			return err
		}
		if err := requireProposed(snap); err != nil {
			return err
		}
		if err := tx.Model(&NodeRole{}).Where("id = ?", id).Updates(map[string]any{
			"user_data": jsonb(userData), "state": contract.NodeRoleProposed, "updated_at": models.Now(),
		}).Error; err != nil {
			return fmt.Errorf("update noderole %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.NodeRole(ctx, id)
}

// NextNodeRoles returns what the annealer may start now in a deployment (all
// deployments with 0): todo noderoles of committed snapshots whose role's
// jig is active and whose node is alive, available and allocated (anneal
// may manage it) and has no noderole
// in transition — at most one per node, the first in dependency order
// (creation order: a noderole is always created after its parents).
//
// A node on which an unfinished transaction still has runs to do is busy
// too: the annealer looks at it again when that transaction ends. At most limit noderoles
// are returned (0: no limit), oldest first.
func (s *Store) NextNodeRoles(ctx context.Context, deploymentID int64, limit int) ([]NodeRole, error) {
	if limit <= 0 {
		limit = math.MaxInt32
	}
	q := s.DB.WithContext(ctx).Raw(`SELECT * FROM (
			SELECT DISTINCT ON (nr.node_id) nr.*
			FROM noderoles nr
			JOIN snapshots s ON s.id = nr.snapshot_id AND s.state = 'committed'
			JOIN roles r ON r.id = nr.role_id AND r.jig IN ?
			-- the ssh jig reaches a node without an agent: "alive" (its
			-- agent phoning home) does not apply to it
			JOIN nodes n ON n.id = nr.node_id AND (n.alive OR r.jig = 'ssh') AND n.available AND n.allocated
			WHERE nr.state = 'todo' AND (? = 0 OR s.deployment_id = ?)
			  AND NOT EXISTS (SELECT 1 FROM noderoles t WHERE t.node_id = nr.node_id AND t.state = 'transition')
			  AND NOT EXISTS (SELECT 1 FROM task_runs b JOIN transactions x ON x.id = b.transaction_id
			                  WHERE b.node_id = nr.node_id AND b.state IN ('pending', 'running') AND x.status IN ('pending', 'running'))
			ORDER BY nr.node_id, nr.id) x
		ORDER BY id LIMIT ?`, activeJigList(), deploymentID, deploymentID, limit)
	var out []NodeRole
	if err := q.Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("find noderoles to run: %w", err)
	}
	if err := decorateNodeRoles(s.DB.WithContext(ctx), out); err != nil {
		return nil, err
	}
	return out, nil
}

// lockForTransition loads and locks a noderole of a committed snapshot.
func lockForTransition(tx *gorm.DB, id int64) (*NodeRole, error) {
	nr, err := loadNodeRole(tx, id, true)
	if err != nil {
		return nil, err
	}
	// Shared lock: a commit archiving the snapshot waits for us, or we see
	// it archived.
	var snap Snapshot
	if err := tx.Clauses(clause.Locking{Strength: "SHARE"}).Take(&snap, nr.SnapshotID).Error; err != nil {
		return nil, fmt.Errorf("load snapshot %d: %w", nr.SnapshotID, err)
	}
	if snap.State != SnapshotCommitted {
		return nil, &models.ConflictError{Reason: fmt.Sprintf("noderole %d belongs to snapshot %d, which is %s; only noderoles of the committed snapshot change state", id, snap.ID, snap.State)}
	}
	return nr, nil
}

// TransitionNodeRole moves a todo noderole to transition: the annealer is
// about to run it. Its node must have nothing else in transition.
//
// It is the manual step (tools, tests); the annealer uses StartNodeRole,
// which also requires the node to be alive, available and allocated.
func (s *Store) TransitionNodeRole(ctx context.Context, id int64) (*NodeRole, error) {
	return s.startNodeRole(ctx, id, false, nil)
}

// StartNodeRole is TransitionNodeRole with start called inside the database
// transaction, after the noderole went to transition (and its on_transition
// hooks ran): the annealer starts the run's workflow there, so that either
// both happen or neither does.
func (s *Store) StartNodeRole(ctx context.Context, id int64, start func(nr *NodeRole) error) (*NodeRole, error) {
	return s.startNodeRole(ctx, id, true, start)
}

func (s *Store) startNodeRole(ctx context.Context, id int64, annealer bool, start func(nr *NodeRole) error) (*NodeRole, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var nodeID []int64
		if err := tx.Model(&NodeRole{}).Where("id = ?", id).Pluck("node_id", &nodeID).Error; err != nil {
			return fmt.Errorf("load noderole %d: %w", id, err)
		}
		if len(nodeID) == 0 {
			return models.NotFound("noderole", id)
		}
		// The node's row serializes transitions on one node; under its lock
		// the node must still be one the annealer may give work.
		var node models.Node
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Select("id", "name", "alive", "available", "allocated").
			Take(&node, nodeID[0]).Error; err != nil {
			return fmt.Errorf("lock node %d: %w", nodeID[0], err)
		}
		// The ssh jig reaches a node without an agent: "alive" does not
		// apply to its roles.
		var jig []string
		if err := tx.Raw("SELECT r.jig FROM noderoles nr JOIN roles r ON r.id = nr.role_id WHERE nr.id = ?", id).Scan(&jig).Error; err != nil {
			return fmt.Errorf("load the jig of noderole %d: %w", id, err)
		}
		alive := node.Alive || (len(jig) == 1 && jig[0] == contract.RoleJigSSH)
		if annealer && (!alive || !node.Available || !node.Allocated) {
			return &models.ConflictError{Reason: fmt.Sprintf("node %s is not alive, available and allocated (alive %t, available %t, allocated %t)",
				node.Name, node.Alive, node.Available, node.Allocated)}
		}
		nr, err := lockForTransition(tx, id)
		if err != nil {
			return err
		}
		if nr.State != contract.NodeRoleTodo {
			return &models.ConflictError{Reason: fmt.Sprintf("noderole %d is %s; only a todo noderole can start", id, nr.State)}
		}
		var busy []int64
		if err := tx.Model(&NodeRole{}).Where("node_id = ? AND state = ? AND id <> ?", nr.NodeID, contract.NodeRoleTransition, id).
			Limit(1).Pluck("id", &busy).Error; err != nil {
			return fmt.Errorf("check node %s: %w", nr.NodeName, err)
		}
		if len(busy) > 0 {
			return &models.ConflictError{Reason: fmt.Sprintf("node %s already has noderole %d in transition", nr.NodeName, busy[0])}
		}
		// A node runs one thing at a time, and a transaction that still has
		// work on the node goes first; its end wakes the annealer.
		running, err := models.NodeRunning(tx, nr.NodeID, 0, id)
		if err != nil {
			return err
		}
		if running != "" {
			return &models.ConflictError{Reason: fmt.Sprintf("node %s is busy: %s", nr.NodeName, running)}
		}
		txID, err := models.TransactionWants(tx, nr.NodeID)
		if err != nil {
			return err
		}
		if txID != "" {
			return &models.ConflictError{Reason: fmt.Sprintf("node %s is busy: transaction %s has work on it", nr.NodeName, txID)}
		}
		if err := setState(tx, id, contract.NodeRoleTransition, nil); err != nil {
			return err
		}
		if err := announce(ctx, tx, id); err != nil {
			return err
		}
		if start == nil {
			return nil
		}
		nr.State = contract.NodeRoleTransition
		return start(nr)
	})
	if err != nil {
		return nil, err
	}
	return s.NodeRole(ctx, id)
}

// FinishNodeRole ends a run: with ok the noderole goes active and its
// blocked children whose parents are now all active go todo; otherwise it
// goes to error and its descendants (but those in transition) go blocked.
// wall (what the run returned, as a diff) is stored either way.
func (s *Store) FinishNodeRole(ctx context.Context, id int64, ok bool, wall map[string]any) (*NodeRole, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		nr, err := lockForTransition(tx, id)
		if err != nil {
			return err
		}
		return finishNodeRole(ctx, tx, nr, ok, wall)
	})
	if err != nil {
		return nil, err
	}
	return s.NodeRole(ctx, id)
}

// finishNodeRole is FinishNodeRole on a noderole locked by the caller.
func finishNodeRole(ctx context.Context, tx *gorm.DB, nr *NodeRole, ok bool, wall map[string]any) error {
	id := nr.ID
	if nr.State != contract.NodeRoleTransition {
		return &models.ConflictError{Reason: fmt.Sprintf("noderole %d is %s; only a noderole in transition can finish", id, nr.State)}
	}
	if wall == nil {
		wall = map[string]any{}
	}
	state := contract.NodeRoleError
	if ok {
		state = contract.NodeRoleActive
	}
	if err := tx.Model(&NodeRole{}).Where("id = ?", id).Updates(map[string]any{
		"state": state, "wall": jsonb(wall), "run_count": gorm.Expr("run_count + 1"), "updated_at": models.Now(),
	}).Error; err != nil {
		return fmt.Errorf("finish noderole %d: %w", id, err)
	}
	var changed []int64
	var err error
	if ok {
		changed, err = unblockChildren(tx, id)
	} else {
		changed, err = blockDescendants(tx, id)
	}
	if err != nil {
		return err
	}
	return announce(ctx, tx, append([]int64{id}, changed...)...)
}

// RetryNodeRole sends an errored noderole back to todo (or blocked if one
// of its parents is not active).
func (s *Store) RetryNodeRole(ctx context.Context, id int64) (*NodeRole, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		nr, err := lockForTransition(tx, id)
		if err != nil {
			return err
		}
		if nr.State != contract.NodeRoleError {
			return &models.ConflictError{Reason: fmt.Sprintf("noderole %d is %s; only a noderole in error can be retried", id, nr.State)}
		}
		if _, err := schedule(tx, "n.id = ?", id); err != nil {
			return fmt.Errorf("retry noderole %d: %w", id, err)
		}
		return announce(ctx, tx, id)
	})
	if err != nil {
		return nil, err
	}
	return s.NodeRole(ctx, id)
}

// schedule sets the noderoles matching where (a condition on n) to todo,
// or blocked when one of their parents is not active, and returns their
// ids in creation order, which is dependency order: parents announce
// first.
func schedule(tx *gorm.DB, where string, args ...any) ([]int64, error) {
	var ids []int64
	err := tx.Raw(`UPDATE noderoles n SET updated_at = now(), state = CASE WHEN EXISTS (
			SELECT 1 FROM noderole_edges e JOIN noderoles p ON p.id = e.parent_id
			WHERE e.child_id = n.id AND p.state <> 'active') THEN 'blocked' ELSE 'todo' END
		WHERE `+where+` RETURNING n.id`, args...).Scan(&ids).Error
	slices.Sort(ids)
	return ids, err
}

func setState(tx *gorm.DB, id int64, state string, extra map[string]any) error {
	updates := map[string]any{"state": state, "updated_at": models.Now()}
	for k, v := range extra {
		updates[k] = v
	}
	if err := tx.Model(&NodeRole{}).Where("id = ?", id).Updates(updates).Error; err != nil {
		return fmt.Errorf("set noderole %d %s: %w", id, state, err)
	}
	return nil
}

// unblockChildren sets the blocked children (in committed snapshots) of an
// active noderole to todo when all their parents are active. Children are
// locked in id order, so concurrent finishes do not deadlock.
func unblockChildren(tx *gorm.DB, id int64) ([]int64, error) {
	var children []int64
	if err := tx.Raw(`SELECT c.id FROM noderoles c
		JOIN noderole_edges e ON e.child_id = c.id AND e.parent_id = ?
		JOIN snapshots s ON s.id = c.snapshot_id AND s.state = 'committed'
		WHERE c.state = 'blocked' ORDER BY c.id FOR UPDATE OF c`, id).Scan(&children).Error; err != nil {
		return nil, fmt.Errorf("lock children of noderole %d: %w", id, err)
	}
	if len(children) == 0 {
		return nil, nil
	}
	var changed []int64
	if err := tx.Raw(`UPDATE noderoles c SET state = 'todo', updated_at = now()
		WHERE c.id IN ? AND c.state = 'blocked' AND NOT EXISTS (
			SELECT 1 FROM noderole_edges e JOIN noderoles p ON p.id = e.parent_id
			WHERE e.child_id = c.id AND p.state <> 'active')
		RETURNING c.id`, children).Scan(&changed).Error; err != nil {
		return nil, fmt.Errorf("unblock children of noderole %d: %w", id, err)
	}
	slices.Sort(changed)
	return changed, nil
}

// blockDescendants sets every descendant (in committed snapshots) of an
// errored noderole to blocked, as the seed has it ("all of its children to
// BLOCKED if they were not already blocked"): todo ones, and active and
// errored ones too, which run again once the error is fixed and their
// parents are active (unblockChildren). A descendant in transition is left
// to finish its run: its workflow ends it, and it is blocked only if it
// fails.
func blockDescendants(tx *gorm.DB, id int64) ([]int64, error) {
	var changed []int64
	if err := tx.Raw(`WITH RECURSIVE d(id) AS (
			SELECT child_id FROM noderole_edges WHERE parent_id = @id
			UNION SELECT e.child_id FROM noderole_edges e JOIN d ON e.parent_id = d.id)
		UPDATE noderoles n SET state = 'blocked', updated_at = now()
		FROM d, snapshots s
		WHERE n.id = d.id AND s.id = n.snapshot_id AND s.state = 'committed' AND n.state IN ('todo', 'active', 'error')
		RETURNING n.id`,
		map[string]any{"id": id}).Scan(&changed).Error; err != nil {
		return nil, fmt.Errorf("block descendants of noderole %d: %w", id, err)
	}
	slices.Sort(changed)
	return changed, nil
}
