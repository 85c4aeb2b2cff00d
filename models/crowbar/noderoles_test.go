package crowbar_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// crowbarYAML is a Crowbar-style release: base is implicit, db requires
// it, api requires db; front requires cache (not implicit); odd runs on a
// jig that is not active; hooked has an on_proposed hook.
const crowbarYAML = `
name: crowbar
version: "2.0"
roles_metadata:
  base: {flags: [implicit], template: {ntp: pool}}
  db: {requires: [base], template: {port: 5432, opts: {pool: 5}}}
  api: {requires: [db]}
  cache: {}
  front: {requires: [cache]}
  odd: {jig: puppet}
  hooked: {}
`

// hookCalls counts on_proposed calls of role "hooked" by noderole id.
var hookCalls sync.Map

func init() {
	crowbar.RegisterRoleHook("hooked", crowbar.OnProposed, func(_ context.Context, tx *gorm.DB, nr *crowbar.NodeRole) error {
		n, _ := hookCalls.LoadOrStore(nr.ID, new(int))
		*n.(*int)++
		return tx.Exec(`UPDATE noderoles SET system_data = '{"hooked": true}' WHERE id = ?`, nr.ID).Error
	})
}

type env struct {
	store *storetest.Stores
	ctx   context.Context
}

func newCrowbar(t *testing.T) *env {
	t.Helper()
	return newCrowbarOf(t, crowbarYAML)
}

// newCrowbarOf is a fresh store with the release given as YAML imported.
func newCrowbarOf(t *testing.T, release string) *env {
	t.Helper()
	store, ctx := storetest.New(t)
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(release), &spec))
	_, err := store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	return &env{store: store, ctx: ctx}
}

// deployment creates a deployment of the release under parent ("" = system).
func (c *env) deployment(t *testing.T, name, parent string) *models.Deployment {
	t.Helper()
	dep, err := c.store.CreateDeployment(c.ctx, models.DeploymentInput{Name: name, Parent: parent, Release: "crowbar"})
	require.NoError(t, err)
	return dep
}

// node registers an alive node in the deployment.
func (c *env) node(t *testing.T, name, dep string) *models.Node {
	t.Helper()
	_, _, err := c.store.CreateNode(c.ctx, models.NodeInput{Name: name + ".anneal.test", Deployment: dep}, true)
	require.NoError(t, err)
	n, err := c.store.Node(c.ctx, name+".anneal.test")
	require.NoError(t, err)
	return n
}

func (c *env) propose(t *testing.T, dep string) *crowbar.Snapshot {
	t.Helper()
	snap, err := c.store.ProposeSnapshot(c.ctx, dep)
	require.NoError(t, err)
	require.Equal(t, crowbar.SnapshotProposed, snap.State)
	return snap
}

func (c *env) commit(t *testing.T, snap *crowbar.Snapshot) {
	t.Helper()
	_, err := c.store.CommitSnapshot(c.ctx, snap.ID)
	require.NoError(t, err)
}

func (c *env) bind(t *testing.T, snap *crowbar.Snapshot, node, role string) *crowbar.NodeRole {
	t.Helper()
	nr, _, err := c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: node + ".anneal.test", Role: role})
	require.NoError(t, err)
	return nr
}

func (c *env) reload(t *testing.T, nr *crowbar.NodeRole) *crowbar.NodeRole {
	t.Helper()
	out, err := c.store.NodeRole(c.ctx, nr.ID)
	require.NoError(t, err)
	return out
}

// committedByKey maps the committed snapshot's noderoles by "role@node".
func (c *env) committedByKey(t *testing.T, dep string) map[string]crowbar.NodeRole {
	t.Helper()
	cur, err := c.store.EnsureSnapshot(c.ctx, dep)
	require.NoError(t, err)
	snap, err := c.store.Snapshot(c.ctx, cur.ID)
	require.NoError(t, err)
	out := map[string]crowbar.NodeRole{}
	for _, nr := range snap.NodeRoles {
		out[nr.RoleName+"@"+strings.TrimSuffix(nr.NodeName, ".anneal.test")] = nr
	}
	return out
}

func TestBindRoleSteps(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	c.deployment(t, "staging", "")
	c.node(t, "out", "staging")
	c.node(t, "spare", "")
	snap := c.propose(t, "prod")

	// Implicit parent bound on the same node, first; user data seeded from
	// the deployment role, seeded from the template.
	db, created, err := c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "db"})
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, contract.NodeRoleProposed, db.State)
	assert.Equal(t, map[string]any{"port": float64(5432), "opts": map[string]any{"pool": float64(5)}}, db.UserData)
	require.Len(t, db.Parents, 1)
	base := c.reload(t, &crowbar.NodeRole{ID: db.Parents[0]})
	assert.Equal(t, "base", base.RoleName)
	assert.Equal(t, "n1.anneal.test", base.NodeName)
	assert.Equal(t, []int64{db.ID}, base.Children)
	assert.EqualValues(t, 2, storetest.Count(t, c.store, &crowbar.DeploymentRole{}))

	// The existing binding is returned, nothing created.
	again, created, err := c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "db"})
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, db.ID, again.ID)
	assert.EqualValues(t, 2, storetest.Count(t, c.store, &crowbar.NodeRole{}))
	assert.EqualValues(t, 2, storetest.Count(t, c.store, &crowbar.DeploymentRole{}), "deployment roles are created once")

	// A parent elsewhere in the snapshot: api on n2 hangs under db on n1.
	api2 := c.bind(t, snap, "n2", "api")
	assert.Equal(t, []int64{db.ID}, api2.Parents)

	// A parent on the same node wins over one elsewhere.
	db2 := c.bind(t, snap, "n2", "db")
	api2b := c.bind(t, snap, "n2", "api")
	assert.Equal(t, api2.ID, api2b.ID)
	c.node(t, "n3", "prod")
	c.bind(t, snap, "n3", "db")
	api3 := c.bind(t, snap, "n3", "api")
	require.Len(t, api3.Parents, 1)
	assert.NotEqual(t, db.ID, api3.Parents[0])
	assert.NotEqual(t, db2.ID, api3.Parents[0], "the db on n3 itself")

	// A missing non-implicit parent: 422 naming the role and the node.
	_, _, err = c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "front"})
	ie := storetest.RequireInput(t, err, "role")
	assert.Contains(t, ie.Reason, `"cache"`)
	assert.Contains(t, ie.Reason, "n1.anneal.test")
	assert.Equal(t, "cache", ie.Details["missing_role"])

	// An inactive jig.
	_, _, err = c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "odd"})
	ie = storetest.RequireInput(t, err, "role")
	assert.Contains(t, ie.Reason, `"puppet"`)

	// A node of a sibling deployment, an unknown role.
	_, _, err = c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "out.anneal.test", Role: "db"})
	storetest.RequireInput(t, err, "node")
	_, _, err = c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "nope"})
	storetest.RequireInput(t, err, "role")

	// on_proposed ran once, for the new binding only, inside the transaction.
	h := c.bind(t, snap, "n1", "hooked")
	c.bind(t, snap, "n1", "hooked")
	n, ok := hookCalls.Load(h.ID)
	require.True(t, ok)
	assert.Equal(t, 1, *n.(*int))
	assert.Equal(t, map[string]any{"hooked": true}, h.SystemData)
}

func TestBindRoleDeploymentScoping(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "parent", "")
	c.deployment(t, "child", "parent")
	c.deployment(t, "sibling", "parent")
	c.node(t, "p1", "parent")
	c.node(t, "c1", "child")
	c.node(t, "s1", "sibling")

	snap := c.propose(t, "parent")
	pdb := c.bind(t, snap, "p1", "db")
	c.commit(t, snap)
	snap = c.propose(t, "sibling")
	c.bind(t, snap, "s1", "cache")
	c.commit(t, snap)

	// The parent deployment's committed db is visible to the child.
	snap = c.propose(t, "child")
	api := c.bind(t, snap, "c1", "api")
	assert.Equal(t, []int64{pdb.ID}, api.Parents)
	// The sibling's cache is not.
	_, _, err := c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "c1.anneal.test", Role: "front"})
	ie := storetest.RequireInput(t, err, "role")
	assert.Equal(t, "cache", ie.Details["missing_role"])

	// The parent proposing and committing again moves the child's edge to
	// the new binding.
	snap2 := c.propose(t, "parent")
	c.commit(t, snap2)
	newDB := c.committedByKey(t, "parent")["db@p1"]
	assert.NotEqual(t, pdb.ID, newDB.ID)
	assert.Equal(t, []int64{newDB.ID}, c.reload(t, api).Parents)
}

func TestSnapshotLifecycle(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")

	hist, err := c.store.Snapshots(c.ctx, "prod")
	require.NoError(t, err)
	require.Len(t, hist, 1, "a deployment starts with an empty committed snapshot")
	first := hist[0]
	assert.Equal(t, crowbar.SnapshotCommitted, first.State)

	// Edits of a committed snapshot are refused, saying to propose first.
	_, _, err = c.store.BindRole(c.ctx, first.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "db"})
	assert.Contains(t, storetest.RequireConflict(t, err).Reason, "propose")

	snap := c.propose(t, "prod")
	_, err = c.store.ProposeSnapshot(c.ctx, "prod")
	storetest.RequireConflict(t, err)
	db := c.bind(t, snap, "n1", "db")
	c.commit(t, snap)
	_, err = c.store.CommitSnapshot(c.ctx, snap.ID)
	storetest.RequireConflict(t, err)

	hist, err = c.store.Snapshots(c.ctx, "prod")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	assert.Equal(t, crowbar.SnapshotArchived, hist[0].State)
	assert.NotNil(t, hist[0].ArchivedAt)
	assert.Equal(t, crowbar.SnapshotCommitted, hist[1].State)

	_, err = c.store.UpdateNodeRole(c.ctx, db.ID, map[string]any{"port": 1})
	assert.Contains(t, storetest.RequireConflict(t, err).Reason, "propose")
	_, _, err = c.store.BindRole(c.ctx, snap.ID, crowbar.BindInput{Node: "n1.anneal.test", Role: "api"})
	storetest.RequireConflict(t, err)

	// Proposing copies the committed snapshot: bindings, data, state, edges.
	require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET system_data = '{"ip": "10.0.0.5"}' WHERE id = ?`, db.ID).Error)
	committed, err := c.store.Snapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	prop := c.propose(t, "prod")
	copied, err := c.store.Snapshot(c.ctx, prop.ID)
	require.NoError(t, err)
	require.Len(t, copied.NodeRoles, len(committed.NodeRoles))
	ids := map[int64]int64{}
	for i, nr := range copied.NodeRoles {
		old := committed.NodeRoles[i]
		assert.NotEqual(t, old.ID, nr.ID)
		assert.Equal(t, old.RoleName, nr.RoleName)
		assert.Equal(t, old.NodeName, nr.NodeName)
		assert.Equal(t, old.State, nr.State)
		assert.Equal(t, old.UserData, nr.UserData)
		assert.Equal(t, old.SystemData, nr.SystemData)
		ids[old.ID] = nr.ID
	}
	for i, nr := range copied.NodeRoles {
		var want []int64
		for _, p := range committed.NodeRoles[i].Parents {
			want = append(want, ids[p])
		}
		assert.ElementsMatch(t, want, nr.Parents)
	}

	// Edits of the proposed copy leave the committed one alone.
	var dbCopy crowbar.NodeRole
	for _, nr := range copied.NodeRoles {
		if nr.RoleName == "db" {
			dbCopy = nr
		}
	}
	edited, err := c.store.UpdateNodeRole(c.ctx, dbCopy.ID, map[string]any{"port": 6543})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"port": float64(6543)}, edited.UserData)
	assert.Equal(t, float64(5432), c.reload(t, db).UserData["port"])
	c.commit(t, prop)
	hist, err = c.store.Snapshots(c.ctx, "prod")
	require.NoError(t, err)
	require.Len(t, hist, 3)
	assert.Equal(t, []string{"archived", "archived", "committed"}, []string{hist[0].State, hist[1].State, hist[2].State})
}

func TestNodeRoleStateMachine(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "db")
	c.bind(t, snap, "n2", "api")
	c.bind(t, snap, "n2", "cache")

	// The annealer ignores a proposed snapshot.
	next, err := c.store.NextNodeRoles(c.ctx, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, next)

	c.commit(t, snap)
	nrs := c.committedByKey(t, "prod")
	state := func(key string) string { return c.reload(t, &crowbar.NodeRole{ID: nrs[key].ID}).State }
	assert.Equal(t, "todo", state("base@n1"), "no parents")
	assert.Equal(t, "todo", state("cache@n2"))
	assert.Equal(t, "blocked", state("db@n1"))
	assert.Equal(t, "blocked", state("api@n2"))

	// Transition: only a todo noderole; one per node.
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["db@n1"].ID)
	storetest.RequireConflict(t, err)
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["base@n1"].ID)
	require.NoError(t, err)
	assert.Equal(t, "transition", state("base@n1"))

	// Active unblocks the children whose parents are all active.
	fin, err := c.store.FinishNodeRole(c.ctx, nrs["base@n1"].ID, true, map[string]any{"done": true})
	require.NoError(t, err)
	assert.Equal(t, "active", fin.State)
	assert.Equal(t, 1, fin.RunCount)
	assert.Equal(t, map[string]any{"done": true}, fin.Wall)
	assert.Equal(t, "todo", state("db@n1"))
	assert.Equal(t, "blocked", state("api@n2"))

	// Error blocks the todo descendants.
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET state = 'todo' WHERE id = ?`, nrs["api@n2"].ID).Error)
	fin, err = c.store.FinishNodeRole(c.ctx, nrs["db@n1"].ID, false, nil)
	require.NoError(t, err)
	assert.Equal(t, "error", fin.State)
	assert.Equal(t, "blocked", state("api@n2"))
	_, err = c.store.FinishNodeRole(c.ctx, nrs["db@n1"].ID, true, nil)
	storetest.RequireConflict(t, err)

	// Retry: error → todo (parents active), then success unblocks api.
	_, err = c.store.RetryNodeRole(c.ctx, nrs["api@n2"].ID)
	storetest.RequireConflict(t, err)
	ret, err := c.store.RetryNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	assert.Equal(t, "todo", ret.State)
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	fin, err = c.store.FinishNodeRole(c.ctx, nrs["db@n1"].ID, true, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, fin.RunCount)
	assert.Equal(t, "todo", state("api@n2"))

	// Retry of an error whose parent is not active goes blocked.
	require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET state = 'error' WHERE id = ?`, nrs["api@n2"].ID).Error)
	require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET state = 'error' WHERE id = ?`, nrs["db@n1"].ID).Error)
	ret, err = c.store.RetryNodeRole(c.ctx, nrs["api@n2"].ID)
	require.NoError(t, err)
	assert.Equal(t, "blocked", ret.State)

	// Committing a new snapshot keeps active noderoles active.
	require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET state = 'active' WHERE id = ?`, nrs["db@n1"].ID).Error)
	snap2 := c.propose(t, "prod")
	c.commit(t, snap2)
	nrs2 := c.committedByKey(t, "prod")
	assert.Equal(t, "active", nrs2["base@n1"].State)
	assert.Equal(t, "active", nrs2["db@n1"].State)
	assert.Equal(t, "todo", nrs2["api@n2"].State, "blocked, with all parents active now")
}

func TestNextNodeRoles(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.deployment(t, "other", "")
	n1 := c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	c.node(t, "n3", "prod")
	c.node(t, "o1", "other")
	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "base")
	c.bind(t, snap, "n1", "cache")
	c.bind(t, snap, "n2", "cache")
	c.bind(t, snap, "n3", "cache")
	c.commit(t, snap)
	snap = c.propose(t, "other")
	c.bind(t, snap, "o1", "cache")
	c.commit(t, snap)
	nrs := c.committedByKey(t, "prod")

	keys := func(dep int64) []string {
		next, err := c.store.NextNodeRoles(c.ctx, dep, 0)
		require.NoError(t, err)
		var out []string
		for _, nr := range next {
			out = append(out, nr.RoleName+"@"+strings.TrimSuffix(nr.NodeName, ".anneal.test"))
		}
		return out
	}
	prod, err := c.store.Deployment(c.ctx, "prod")
	require.NoError(t, err)
	// One per node, the first in dependency (creation) order.
	assert.Equal(t, []string{"base@n1", "cache@n2", "cache@n3"}, keys(prod.ID))
	assert.Len(t, keys(0), 4, "all deployments")

	// A dead node and an unavailable one get nothing.
	require.NoError(t, c.store.DB.Model(&models.Node{}).Where("name = ?", "n2.anneal.test").Update("alive", false).Error)
	require.NoError(t, c.store.DB.Model(&models.Node{}).Where("name = ?", "n3.anneal.test").Update("available", false).Error)
	assert.Equal(t, []string{"base@n1"}, keys(prod.ID))

	// A node with a noderole in transition gets nothing more.
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["base@n1"].ID)
	require.NoError(t, err)
	assert.Empty(t, keys(prod.ID))
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["cache@n1"].ID)
	assert.Contains(t, storetest.RequireConflict(t, err).Reason, n1.Name)
	_, err = c.store.FinishNodeRole(c.ctx, nrs["base@n1"].ID, true, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"cache@n1"}, keys(prod.ID))
}
