package crowbar_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/attrs"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// annealYAML: os and dns are discovery roles (dns requires os, and sorts
// before it by name), puppet-thing is a discovery role on an inactive jig,
// admin-os the bootstrap role; db and app are bound by hand.
const annealYAML = `
name: annealed
version: "1"
roles_metadata:
  os: {flags: [discovery], template: {os: {name: linux, pkgs: [a]}}, script: "true"}
  dns: {flags: [discovery], requires: [os], template: {dns: {servers: [1.1.1.1]}}, script: "true"}
  puppet-thing: {flags: [discovery], jig: puppet}
  admin-os: {flags: [bootstrap]}
  db: {requires: [os], template: {db: {port: 5432}}, script: "true"}
  app: {requires: [db], template: {app: {workers: 2}}, script: "true"}
`

type m = map[string]any

func newAnnealed(t *testing.T) *env {
	t.Helper()
	return newCrowbarOf(t, annealYAML)
}

func (c *env) reloadID(t *testing.T, id int64) *crowbar.NodeRole {
	t.Helper()
	return c.reload(t, &crowbar.NodeRole{ID: id})
}

func (c *env) annealedDeployment(t *testing.T, name string) {
	t.Helper()
	_, err := c.store.CreateDeployment(c.ctx, models.DeploymentInput{Name: name, Release: "annealed"})
	require.NoError(t, err)
}

// bootstrapped creates a node in system and gives it its default roles.
func (c *env) bootstrapped(t *testing.T, name string, admin bool) (*models.Node, *contract.BootstrapResult) {
	t.Helper()
	node, _, err := c.store.CreateNode(c.ctx, models.NodeInput{Name: name + ".anneal.test", Admin: admin}, true)
	require.NoError(t, err)
	res, err := c.store.BootstrapNode(c.ctx, node.ID)
	require.NoError(t, err)
	return node, res
}

// handBack says what a run's jig hands back, given what it was sent.
type handBack func(sent map[string]any) map[string]any

// merged hands back what was sent with changes merged in, as the agent
// does with what a script writes to $ANNEAL_ATTRS_OUT.
func merged(changes map[string]any) handBack {
	return func(sent map[string]any) map[string]any { return attrs.DeepMerge(sent, changes) }
}

// exactly hands back blob, whatever was sent.
func exactly(blob map[string]any) handBack {
	return func(map[string]any) map[string]any { return blob }
}

// run takes a todo noderole through one run as the annealer and an agent
// would: transition, prepare (the attributes it sees), dispatch, the
// agent's report with what back hands back (nil: nothing), finish. It
// returns the attributes the run was sent.
func (c *env) run(t *testing.T, id int64, back handBack, ok bool) map[string]any {
	t.Helper()
	nr, err := c.store.TransitionNodeRole(c.ctx, id)
	require.NoError(t, err)
	plan, err := c.store.PrepareNodeRoleRun(c.ctx, id, nr.RunCount+1)
	require.NoError(t, err)
	require.Empty(t, plan.Skip)
	again, err := c.store.PrepareNodeRoleRun(c.ctx, id, nr.RunCount+1)
	require.NoError(t, err)
	require.Equal(t, plan.RunID, again.RunID, "preparing twice gives the same run")
	run, err := c.store.DispatchRun(c.ctx, plan.RunID, []byte("token"))
	require.NoError(t, err)
	var sent models.TaskRun
	require.NoError(t, c.store.DB.Take(&sent, plan.RunID).Error)
	res := protocol.RunResult{Attempt: run.Attempt}
	if !ok {
		res.ExitCode = 3
	}
	if back != nil {
		res.Attrs, err = json.Marshal(back(sent.AttrsIn))
		require.NoError(t, err)
	}
	_, err = c.store.RecordRunResult(c.ctx, nr.NodeID, plan.RunID, res)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRoleRun(c.ctx, id, nr.RunCount+1, ok, "")
	require.NoError(t, err)
	var row models.TaskRun
	require.NoError(t, c.store.DB.Take(&row, plan.RunID).Error)
	require.NotNil(t, row.NodeRoleID)
	assert.Equal(t, id, *row.NodeRoleID)
	return row.AttrsIn
}

func TestBootstrapNode(t *testing.T) {
	c := newAnnealed(t)
	n1, res := c.bootstrapped(t, "n1", false)
	// Dependency order, not name order; the inactive jig's role left out.
	assert.Equal(t, []string{"os", "dns"}, res.Roles)
	assert.Equal(t, models.FlagDiscovery, res.Flag)
	sys := c.committedByKey(t, models.SystemDeployment)
	assert.Equal(t, contract.NodeRoleTodo, sys["os@n1"].State, "recommitted: no parents")
	assert.Equal(t, contract.NodeRoleBlocked, sys["dns@n1"].State, "recommitted: waits for os")
	assert.Equal(t, []int64{sys["os@n1"].ID}, sys["dns@n1"].Parents)

	// Idempotent: the same bindings.
	again, err := c.store.BootstrapNode(c.ctx, n1.ID)
	require.NoError(t, err)
	assert.Equal(t, res.NodeRoles, again.NodeRoles)
	assert.Len(t, c.committedByKey(t, models.SystemDeployment), 2)

	// An admin node gets the bootstrap roles instead.
	_, admin := c.bootstrapped(t, "a1", true)
	assert.Equal(t, models.FlagBootstrap, admin.Flag)
	assert.Equal(t, []string{"admin-os"}, admin.Roles)

	// The annealer sees both nodes' first roles.
	next, err := c.store.NextNodeRoles(c.ctx, 0, 0)
	require.NoError(t, err)
	var names []string
	for _, nr := range next {
		names = append(names, nr.RoleName+"@"+nr.NodeName)
	}
	assert.Equal(t, []string{"os@n1.anneal.test", "admin-os@a1.anneal.test"}, names)
	limited, err := c.store.NextNodeRoles(c.ctx, 0, 1)
	require.NoError(t, err)
	assert.Len(t, limited, 1)
}

func TestAnnealAttributesAndWall(t *testing.T) {
	c := newAnnealed(t)
	c.bootstrapped(t, "n1", false)
	c.bootstrapped(t, "n2", false)
	c.annealedDeployment(t, "prod")
	sys := c.committedByKey(t, models.SystemDeployment)

	// os@n1 hands back a new key: that is its wall.
	sent := c.run(t, sys["os@n1"].ID, merged(m{"os": m{"kernel": "6.1"}}), true)
	assert.Equal(t, m{"os": m{"name": "linux", "pkgs": []any{"a"}}}, sent)
	osN1 := c.reloadID(t, sys["os@n1"].ID)
	assert.Equal(t, contract.NodeRoleActive, osN1.State)
	assert.Equal(t, m{"os": m{"kernel": "6.1"}}, osN1.Wall)
	dnsN1 := c.reloadID(t, sys["dns@n1"].ID)
	assert.Equal(t, contract.NodeRoleTodo, dnsN1.State, "its parent is active")

	// dns@n1 sees os (with os's wall) from the node and as its parent, its
	// own template last; it hands back a removal and a change.
	sent = c.run(t, dnsN1.ID, exactly(m{"os": m{"name": "linux", "kernel": "6.1"}, "dns": m{"servers": []any{"9.9.9.9"}}}), true)
	assert.Equal(t, m{"os": m{"name": "linux", "pkgs": []any{"a"}, "kernel": "6.1"}, "dns": m{"servers": []any{"1.1.1.1"}}}, sent)
	assert.Equal(t, m{"os": m{"pkgs": m{"$deleted": true}}, "dns": m{"servers": []any{"9.9.9.9"}}}, c.reload(t, dnsN1).Wall)

	// os@n2 says another kernel; it is active on n2 before app runs there.
	c.run(t, sys["os@n2"].ID, merged(m{"os": m{"kernel": "5.10"}}), true)

	// Grow prod: db on n1 and app on n2, both still in system: the commit
	// moves them. db's parent os is found on its own node in system.
	snap := c.propose(t, "prod")
	db := c.bind(t, snap, "n1", "db")
	assert.Equal(t, []int64{osN1.ID}, db.Parents, "the parent on the same node, in the parent deployment")
	_, err := c.store.UpdateNodeRole(c.ctx, db.ID, m{"db": m{"port": float64(6432)}})
	require.NoError(t, err)
	app := c.bind(t, snap, "n2", "app")
	assert.Equal(t, []int64{db.ID}, app.Parents, "the parent anywhere in the deployment")
	committed, err := c.store.CommitSnapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"n1.anneal.test", "n2.anneal.test"}, committed.MovedNodes)
	n1, err := c.store.Node(c.ctx, "n1.anneal.test")
	require.NoError(t, err)
	prod, err := c.store.Deployment(c.ctx, "prod")
	require.NoError(t, err)
	assert.Equal(t, prod.ID, n1.DeploymentID)

	prodNR := c.committedByKey(t, "prod")
	assert.Equal(t, contract.NodeRoleTodo, prodNR["db@n1"].State)
	assert.Equal(t, contract.NodeRoleBlocked, prodNR["app@n2"].State)
	c.run(t, prodNR["db@n1"].ID, merged(m{"db": m{"url": "pg://n1"}}), false)
	dbN1 := c.reloadID(t, prodNR["db@n1"].ID)
	assert.Equal(t, contract.NodeRoleError, dbN1.State)
	assert.Equal(t, m{}, dbN1.Wall, "a failed run keeps the wall it had")
	_, err = c.store.RetryNodeRole(c.ctx, dbN1.ID)
	require.NoError(t, err)
	c.run(t, dbN1.ID, merged(m{"db": m{"url": "pg://n1"}}), true)
	assert.Equal(t, m{"db": m{"url": "pg://n1"}}, c.reload(t, dbN1).Wall)

	// app@n2 sees, lowest first: os@n2 active on its node (kernel 5.10);
	// its grandparent os@n1 (kernel 6.1, beats the node); its parent db@n1
	// after db's deployment role (the noderole's port 6432 beats the
	// template's 5432; its wall adds the url); its own template.
	sent = c.run(t, prodNR["app@n2"].ID, nil, true)
	assert.Equal(t, m{
		"os":  m{"name": "linux", "pkgs": []any{"a"}, "kernel": "6.1"},
		"db":  m{"port": float64(6432), "url": "pg://n1"},
		"app": m{"workers": float64(2)},
	}, sent)
	appN2 := c.reloadID(t, prodNR["app@n2"].ID)
	assert.Equal(t, contract.NodeRoleActive, appN2.State)
	assert.Equal(t, m{}, appN2.Wall, "nothing handed back: no wall")
	assert.Equal(t, 1, appN2.RunCount)

	// Finishing a run again changes nothing; preparing a run that is not
	// awaited says so.
	_, err = c.store.FinishNodeRoleRun(c.ctx, appN2.ID, 1, false, "late")
	require.NoError(t, err)
	assert.Equal(t, contract.NodeRoleActive, c.reload(t, appN2).State)
	plan, err := c.store.PrepareNodeRoleRun(c.ctx, appN2.ID, 2)
	require.NoError(t, err)
	assert.Contains(t, plan.Skip, "not awaited")
}

func TestFailedRunRecordsTheReason(t *testing.T) {
	c := newAnnealed(t)
	c.bootstrapped(t, "n1", false)
	os := c.committedByKey(t, models.SystemDeployment)["os@n1"]
	_, err := c.store.TransitionNodeRole(c.ctx, os.ID)
	require.NoError(t, err)
	plan, err := c.store.PrepareNodeRoleRun(c.ctx, os.ID, 1)
	require.NoError(t, err)
	// The agent never reported: the workflow ends the run with a reason.
	_, err = c.store.FinishNodeRoleRun(c.ctx, os.ID, 1, false, "no result from the node's agent")
	require.NoError(t, err)
	var row models.TaskRun
	require.NoError(t, c.store.DB.Take(&row, plan.RunID).Error)
	assert.Equal(t, contract.RunFailed, row.State)
	assert.Equal(t, "no result from the node's agent", row.Error)
	reloaded := c.reload(t, &os)
	assert.Equal(t, contract.NodeRoleError, reloaded.State)
	assert.Equal(t, contract.NodeRoleBlocked, c.committedByKey(t, models.SystemDeployment)["dns@n1"].State)
}

func TestCommitRefusesANodeThatLeftTheChain(t *testing.T) {
	c := newAnnealed(t)
	c.bootstrapped(t, "n1", false)
	c.annealedDeployment(t, "prod")
	c.annealedDeployment(t, "other")
	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "db")
	// Meanwhile the node went to a sibling deployment.
	other := "other"
	_, err := c.store.UpdateNode(c.ctx, "n1.anneal.test", models.NodeUpdate{Deployment: &other})
	require.NoError(t, err)
	_, err = c.store.CommitSnapshot(c.ctx, snap.ID)
	var conflict *models.ConflictError
	require.ErrorAs(t, err, &conflict)
	assert.Contains(t, conflict.Reason, "n1.anneal.test")
	cur, err := c.store.Snapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	assert.Equal(t, crowbar.SnapshotProposed, cur.State, "nothing committed")
}

func TestCommitCarriesOverResultsOfUneditedCopies(t *testing.T) {
	c := newAnnealed(t)
	c.bootstrapped(t, "n1", false)
	c.bootstrapped(t, "n2", false)
	c.annealedDeployment(t, "prod")
	sys := c.committedByKey(t, models.SystemDeployment)
	c.run(t, sys["os@n1"].ID, nil, true)
	c.run(t, sys["os@n2"].ID, nil, true)
	first := c.propose(t, "prod")
	c.bind(t, first, "n1", "db")
	c.commit(t, first)

	// Propose again while db@n1 is still todo; it then runs to active in
	// the committed snapshot. Committing the copy keeps that result, and
	// an edited binding does not.
	second := c.propose(t, "prod")
	app := c.bind(t, second, "n2", "app")
	c.run(t, c.committedByKey(t, "prod")["db@n1"].ID, merged(m{"db": m{"url": "pg://n1"}}), true)
	c.commit(t, second)
	prod := c.committedByKey(t, "prod")
	assert.Equal(t, contract.NodeRoleActive, prod["db@n1"].State, "the copy took over its original's run")
	assert.Equal(t, 1, prod["db@n1"].RunCount)
	assert.Equal(t, m{"db": m{"url": "pg://n1"}}, prod["db@n1"].Wall)
	assert.Equal(t, contract.NodeRoleTodo, prod["app@n2"].State, "its parent is active")
	assert.Equal(t, app.ID, prod["app@n2"].ID)

	third := c.propose(t, "prod")
	var dbCopy int64
	for _, nr := range mustSnapshot(t, c, third.ID).NodeRoles {
		if nr.RoleName == "db" {
			dbCopy = nr.ID
		}
	}
	_, err := c.store.UpdateNodeRole(c.ctx, dbCopy, m{"db": m{"port": float64(7000)}})
	require.NoError(t, err)
	c.commit(t, third)
	assert.Equal(t, contract.NodeRoleTodo, c.committedByKey(t, "prod")["db@n1"].State, "an edited binding runs again")
}

func mustSnapshot(t *testing.T, c *env, id int64) *crowbar.Snapshot {
	t.Helper()
	snap, err := c.store.Snapshot(c.ctx, id)
	require.NoError(t, err)
	return snap
}

func TestBootstrapAlsoBindsInAProposalOfSystem(t *testing.T) {
	c := newAnnealed(t)
	c.bootstrapped(t, "n1", false)
	prop := c.propose(t, models.SystemDeployment)
	c.bootstrapped(t, "n2", false)
	inProp := map[string]string{}
	for _, nr := range mustSnapshot(t, c, prop.ID).NodeRoles {
		inProp[nr.RoleName+"@"+nr.NodeName] = nr.State
	}
	assert.Equal(t, contract.NodeRoleProposed, inProp["os@n2.anneal.test"], "the proposal got the new node's roles")
	assert.Equal(t, contract.NodeRoleProposed, inProp["dns@n2.anneal.test"])
	c.commit(t, prop)
	sys := c.committedByKey(t, models.SystemDeployment)
	assert.Equal(t, contract.NodeRoleTodo, sys["os@n2"].State, "committing the proposal kept them")
	assert.Equal(t, contract.NodeRoleBlocked, sys["dns@n2"].State)
}

// TestBootstrapRacingACommitOfSystem: a node bootstrapped while a proposal
// of system is being committed ends up with its default roles in the
// committed snapshot, and neither side deadlocks.
func TestBootstrapRacingACommitOfSystem(t *testing.T) {
	c := newAnnealed(t)
	for i := range 8 {
		name := fmt.Sprintf("race%d", i)
		node, _, err := c.store.CreateNode(c.ctx, models.NodeInput{Name: name + ".anneal.test"}, true)
		require.NoError(t, err)
		prop := c.propose(t, models.SystemDeployment)
		var wg sync.WaitGroup
		var bootErr, commitErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, bootErr = c.store.BootstrapNode(c.ctx, node.ID) }()
		go func() { defer wg.Done(); _, commitErr = c.store.CommitSnapshot(c.ctx, prop.ID) }()
		wg.Wait()
		require.NoError(t, bootErr, "round %d", i)
		require.NoError(t, commitErr, "round %d", i)
		sys := c.committedByKey(t, models.SystemDeployment)
		require.Contains(t, sys, "os@"+name, "round %d: the default roles are in the committed snapshot", i)
		require.Contains(t, sys, "dns@"+name, "round %d", i)
	}
}
