package crowbar_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// requireInvalid asserts err is bad input naming field.
func requireInvalid(t *testing.T, err error, field string) *models.InputError {
	t.Helper()
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, field, ie.Field, "%v", err)
	assert.False(t, errors.Is(err, models.ErrNotFound), "a filter's unknown value is not a missing resource")
	return ie
}

// noderoleKeys names each noderole "role@node" (short node names), in order.
func noderoleKeys(nrs []crowbar.NodeRole) []string {
	out := make([]string, len(nrs))
	for i, nr := range nrs {
		out[i] = nr.RoleName + "@" + strings.TrimSuffix(nr.NodeName, ".anneal.test")
	}
	return out
}

func TestCrowbarAPIRoles(t *testing.T) {
	c := newCrowbar(t)
	// A second release with a role of the same name as one of crowbar's.
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte("name: other\nversion: \"3\"\nroles_metadata:\n  base: {}\n  alpha: {}\n"), &spec))
	other, err := c.store.ImportRelease(c.ctx, spec)
	require.NoError(t, err)
	crowbar, err := c.store.Release(c.ctx, "crowbar")
	require.NoError(t, err)
	require.Less(t, crowbar.ID, other.ID)

	all, err := c.store.Roles(c.ctx, "")
	require.NoError(t, err)
	var names []string
	for _, r := range all {
		if r.ReleaseID == crowbar.ID || r.ReleaseID == other.ID {
			names = append(names, r.Name)
		}
	}
	// By release id, then name.
	assert.Equal(t, []string{"api", "base", "cache", "db", "front", "hooked", "odd", "alpha", "base"}, names)

	for _, ref := range []string{"other", "other@3", strconv.FormatInt(other.ID, 10)} {
		roles, err := c.store.Roles(c.ctx, ref)
		require.NoError(t, err, ref)
		require.Len(t, roles, 2, ref)
		assert.Equal(t, "alpha", roles[0].Name)
		assert.Equal(t, other.ID, roles[1].ReleaseID)
	}
	_, err = c.store.Roles(c.ctx, "nosuch")
	requireInvalid(t, err, "release")
	_, err = c.store.Roles(c.ctx, "other@9")
	requireInvalid(t, err, "release")

	role, err := c.store.Role(c.ctx, all[0].ID)
	require.NoError(t, err)
	assert.Equal(t, all[0].Name, role.Name)
	_, err = c.store.Role(c.ctx, 1<<40)
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestCrowbarAPINodeRoleFilters(t *testing.T) {
	c := newCrowbar(t)
	prod := c.deployment(t, "prod", "")
	c.deployment(t, "staging", "")
	c.deployment(t, "empty", "")
	n1 := c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	c.node(t, "s1", "staging")
	first, err := c.store.EnsureSnapshot(c.ctx, "prod")
	require.NoError(t, err)

	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "db") // base bound implicitly first
	c.bind(t, snap, "n2", "api")
	c.bind(t, snap, "n2", "cache")
	c.commit(t, snap)
	stSnap := c.propose(t, "staging")
	c.bind(t, stSnap, "s1", "cache")
	c.commit(t, stSnap)
	// A proposed copy of prod: not in the default list.
	proposed := c.propose(t, "prod")

	list := func(f crowbar.NodeRoleFilter) []crowbar.NodeRole {
		t.Helper()
		nrs, err := c.store.NodeRoles(c.ctx, f)
		require.NoError(t, err, "%+v", f)
		require.NotNil(t, nrs, "an empty answer is [], not null")
		return nrs
	}

	// No filter: the committed snapshots of every deployment, by id.
	all := list(crowbar.NodeRoleFilter{})
	assert.Equal(t, []string{"base@n1", "db@n1", "api@n2", "cache@n2", "cache@s1"}, noderoleKeys(all))
	for i := 1; i < len(all); i++ {
		assert.Less(t, all[i-1].ID, all[i].ID)
	}
	// Decorated: names and edges.
	assert.Equal(t, []int64{all[0].ID}, all[1].Parents)
	assert.Equal(t, []int64{all[2].ID}, all[1].Children)
	assert.Equal(t, []int64{}, all[3].Parents)
	assert.Nil(t, all[0].LastRun, "lists do not carry runs")

	byDep := list(crowbar.NodeRoleFilter{Deployment: "prod"})
	assert.Equal(t, []string{"base@n1", "db@n1", "api@n2", "cache@n2"}, noderoleKeys(byDep))
	assert.Equal(t, snap.ID, byDep[0].SnapshotID)
	assert.Equal(t, byDep, list(crowbar.NodeRoleFilter{Deployment: strconv.FormatInt(prod.ID, 10)}))

	// snapshot=: that snapshot, whatever its state.
	copies := list(crowbar.NodeRoleFilter{Deployment: "prod", Snapshot: proposed.ID})
	assert.Equal(t, []string{"base@n1", "db@n1", "api@n2", "cache@n2"}, noderoleKeys(copies))
	assert.Equal(t, proposed.ID, copies[0].SnapshotID)
	assert.Empty(t, list(crowbar.NodeRoleFilter{Snapshot: first.ID}), "the archived first snapshot was empty")
	assert.Len(t, list(crowbar.NodeRoleFilter{Snapshot: stSnap.ID}), 1)

	assert.Equal(t, []string{"api@n2", "cache@n2"}, noderoleKeys(list(crowbar.NodeRoleFilter{Node: "n2.anneal.test"})))
	assert.Equal(t, []string{"base@n1", "db@n1"}, noderoleKeys(list(crowbar.NodeRoleFilter{Node: strconv.FormatInt(n1.ID, 10)})))
	assert.Equal(t, []string{"cache@n2", "cache@s1"}, noderoleKeys(list(crowbar.NodeRoleFilter{Role: "cache"})))
	assert.Equal(t, []string{"cache@s1"}, noderoleKeys(list(crowbar.NodeRoleFilter{Role: "cache", Deployment: "staging"})))
	assert.Equal(t, []string{"base@n1", "cache@n2", "cache@s1"}, noderoleKeys(list(crowbar.NodeRoleFilter{State: contract.NodeRoleTodo})))
	assert.Equal(t, []string{"db@n1", "api@n2"}, noderoleKeys(list(crowbar.NodeRoleFilter{State: contract.NodeRoleBlocked})))
	assert.Equal(t, []string{"db@n1"}, noderoleKeys(list(crowbar.NodeRoleFilter{Deployment: "prod", Node: "n1.anneal.test", State: contract.NodeRoleBlocked})))
	assert.Empty(t, list(crowbar.NodeRoleFilter{State: contract.NodeRoleActive}))
	assert.Empty(t, list(crowbar.NodeRoleFilter{Role: "odd"}), "a role nobody bound")

	// A deployment never committed has no noderoles, and reading does not
	// create its first snapshot.
	assert.Empty(t, list(crowbar.NodeRoleFilter{Deployment: "empty"}))
	var snaps int64
	require.NoError(t, c.store.DB.Model(&crowbar.Snapshot{}).Where("deployment_id = (SELECT id FROM deployments WHERE name = 'empty')").Count(&snaps).Error)
	assert.Zero(t, snaps)

	// Bad filters: 422 naming the filter.
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{State: "running"})
	ie := requireInvalid(t, err, "state")
	assert.Contains(t, ie.Reason, "proposed, todo, blocked, transition, active, error")
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{Deployment: "ghost"})
	requireInvalid(t, err, "deployment")
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{Node: "ghost.anneal.test"})
	requireInvalid(t, err, "node")
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{Role: "nosuch"})
	requireInvalid(t, err, "role")
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{Snapshot: 1 << 40})
	requireInvalid(t, err, "snapshot")
	_, err = c.store.NodeRoles(c.ctx, crowbar.NodeRoleFilter{Deployment: "prod", Snapshot: stSnap.ID})
	ie = requireInvalid(t, err, "snapshot")
	assert.Contains(t, ie.Reason, `"prod"`)
}

func TestCrowbarAPILastRun(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	snap := c.propose(t, "prod")
	// base: no parents (todo once committed) and a template, so its run
	// sees attributes.
	c.bind(t, snap, "n1", "base")
	c.commit(t, snap)
	nr := c.committedByKey(t, "prod")["base@n1"]
	require.Equal(t, contract.NodeRoleTodo, nr.State)

	fresh := c.reload(t, &nr)
	assert.Nil(t, fresh.LastRun)
	raw, err := json.Marshal(fresh)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), `"last_run"`, "omitted before the first run")

	_, err = c.store.TransitionNodeRole(c.ctx, nr.ID)
	require.NoError(t, err)
	plan, err := c.store.PrepareNodeRoleRun(c.ctx, nr.ID, 1)
	require.NoError(t, err)
	require.Empty(t, plan.Skip)
	got := c.reload(t, &nr)
	require.NotNil(t, got.LastRun)
	assert.Equal(t, plan.RunID, got.LastRun.ID)
	assert.Equal(t, 1, got.LastRun.Position)
	require.NotNil(t, got.LastRun.NodeRoleID)
	assert.Equal(t, nr.ID, *got.LastRun.NodeRoleID)
	assert.Equal(t, contract.RunPending, got.LastRun.State)
	assert.Equal(t, "pool", got.LastRun.AttrsIn["ntp"], "what the run saw: %v", got.LastRun.AttrsIn)
	assert.Nil(t, got.LastRun.AttrsOut, "nothing handed back yet")
	raw, err = json.Marshal(got)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Contains(t, doc, "last_run")
	lastRun := doc["last_run"].(map[string]any)
	assert.Contains(t, lastRun, "attrs_in")
	assert.Equal(t, "pending", lastRun["state"])
	assert.Equal(t, float64(nr.ID), lastRun["noderole_id"])

	// A failed run: its error and end show; a retry's run is the last one.
	_, err = c.store.FinishNodeRoleRun(c.ctx, nr.ID, 1, false, "jig said no")
	require.NoError(t, err)
	got = c.reload(t, &nr)
	require.NotNil(t, got.LastRun)
	assert.Equal(t, contract.RunFailed, got.LastRun.State)
	assert.Equal(t, "jig said no", got.LastRun.Error)
	assert.NotNil(t, got.LastRun.FinishedAt)
	_, err = c.store.RetryNodeRole(c.ctx, nr.ID)
	require.NoError(t, err)
	_, err = c.store.TransitionNodeRole(c.ctx, nr.ID)
	require.NoError(t, err)
	plan2, err := c.store.PrepareNodeRoleRun(c.ctx, nr.ID, 2)
	require.NoError(t, err)
	require.Empty(t, plan2.Skip)
	got = c.reload(t, &nr)
	require.NotNil(t, got.LastRun)
	assert.Equal(t, plan2.RunID, got.LastRun.ID)
	assert.Equal(t, 2, got.LastRun.Position)
	assert.Equal(t, contract.RunPending, got.LastRun.State)
}

func TestCrowbarAPIDeploymentRoles(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	// A deployment without a release of its own takes its parent's roles.
	_, err := c.store.CreateDeployment(c.ctx, models.DeploymentInput{Name: "child", Parent: "prod"})
	require.NoError(t, err)
	c.node(t, "n1", "prod")
	rel, err := c.store.Release(c.ctx, "crowbar")
	require.NoError(t, err)

	drs, err := c.store.DeploymentRoles(c.ctx, "prod")
	require.NoError(t, err)
	assert.NotNil(t, drs)
	assert.Empty(t, drs)

	// Binding seeds the defaults of the role and its implicit parent from
	// their templates.
	snap := c.propose(t, "prod")
	db := c.bind(t, snap, "n1", "db")
	drs, err = c.store.DeploymentRoles(c.ctx, "prod")
	require.NoError(t, err)
	require.Len(t, drs, 2)
	assert.Equal(t, "base", drs[0].Role)
	assert.Equal(t, map[string]any{"ntp": "pool"}, drs[0].Data)
	assert.Equal(t, "db", drs[1].Role)
	assert.Equal(t, rel.ID, drs[1].ReleaseID)
	assert.Equal(t, map[string]any{"port": float64(5432), "opts": map[string]any{"pool": float64(5)}}, drs[1].Data)

	one, err := c.store.DeploymentRole(c.ctx, "prod", "db")
	require.NoError(t, err)
	assert.Equal(t, drs[1], *one)
	byID, err := c.store.DeploymentRole(c.ctx, "prod", strconv.FormatInt(one.RoleID, 10))
	require.NoError(t, err)
	assert.Equal(t, one.ID, byID.ID)
	_, err = c.store.DeploymentRole(c.ctx, "prod", "cache")
	assert.ErrorIs(t, err, models.ErrNotFound, "a role never bound has no defaults yet")
	_, err = c.store.DeploymentRole(c.ctx, "prod", "nosuch")
	requireInvalid(t, err, "role")
	_, err = c.store.DeploymentRole(c.ctx, "ghost", "db")
	assert.ErrorIs(t, err, models.ErrNotFound)

	// Create, then replace (not merge).
	set, created, err := c.store.SetDeploymentRole(c.ctx, "prod", "cache", map[string]any{"size": 1, "mode": "lru"})
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "cache", set.Role)
	set2, created, err := c.store.SetDeploymentRole(c.ctx, "prod", "cache", map[string]any{"size": 2})
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, set.ID, set2.ID)
	assert.Equal(t, map[string]any{"size": float64(2)}, set2.Data)
	got, err := c.store.DeploymentRole(c.ctx, "prod", "cache")
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"size": float64(2)}, got.Data)
	// Replacing defaults that binding seeded.
	_, created, err = c.store.SetDeploymentRole(c.ctx, "prod", "db", map[string]any{})
	require.NoError(t, err)
	assert.False(t, created)

	// New bindings are seeded from the defaults; existing noderoles keep
	// their user data.
	cache := c.bind(t, snap, "n1", "cache")
	assert.Equal(t, map[string]any{"size": float64(2)}, cache.UserData)
	assert.Equal(t, db.UserData, c.reload(t, db).UserData)

	// Roles of the parent's release, in a deployment without one.
	_, created, err = c.store.SetDeploymentRole(c.ctx, "child", "front", map[string]any{"x": true})
	require.NoError(t, err)
	assert.True(t, created)
	childDRs, err := c.store.DeploymentRoles(c.ctx, "child")
	require.NoError(t, err)
	require.Len(t, childDRs, 1)
	assert.Equal(t, "front", childDRs[0].Role)

	// Bad input and missing deployments.
	_, _, err = c.store.SetDeploymentRole(c.ctx, "prod", "cache", nil)
	requireInvalid(t, err, "data")
	_, _, err = c.store.SetDeploymentRole(c.ctx, "prod", "nosuch", map[string]any{})
	requireInvalid(t, err, "role")
	_, _, err = c.store.SetDeploymentRole(c.ctx, "ghost", "cache", map[string]any{})
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = c.store.DeploymentRoles(c.ctx, "ghost")
	assert.ErrorIs(t, err, models.ErrNotFound)
	got, err = c.store.DeploymentRole(c.ctx, "prod", "cache")
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"size": float64(2)}, got.Data, "failed writes changed nothing")
}
