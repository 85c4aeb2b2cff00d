package crowbar_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/storetest"
)

// An error blocks every descendant, as the seed has it: todo, active and
// errored ones alike; one in transition finishes its run. Fixing the error
// runs them again in order.
func TestErrorBlocksAllDescendants(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "db")  // base@n1 (implicit) → db@n1
	c.bind(t, snap, "n1", "api") // db@n1 → api@n1
	c.bind(t, snap, "n2", "api") // db@n1 → api@n2 (found on another node)
	c.commit(t, snap)
	nrs := c.committedByKey(t, "prod")
	state := func(key string) string { return c.reload(t, &crowbar.NodeRole{ID: nrs[key].ID}).State }
	set := func(key, st string) {
		require.NoError(t, c.store.DB.Exec(`UPDATE noderoles SET state = ? WHERE id = ?`, st, nrs[key].ID).Error)
	}
	// base@n1 and base@n2 ran; db@n1 runs again (say, after a retry)
	// while api@n1 is active, api@n2 errored earlier.
	set("base@n1", "active")
	set("db@n1", "todo")
	set("api@n1", "active")
	set("api@n2", "error")
	_, err := c.store.TransitionNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	fin, err := c.store.FinishNodeRole(c.ctx, nrs["db@n1"].ID, false, nil)
	require.NoError(t, err)
	assert.Equal(t, "error", fin.State)
	assert.Equal(t, "blocked", state("api@n1"), "an active child is blocked")
	assert.Equal(t, "blocked", state("api@n2"), "an errored child is blocked")
	assert.Equal(t, "active", state("base@n1"), "parents are untouched")

	// Retry and success: every blocked child whose parents are active
	// goes todo and runs again.
	_, err = c.store.RetryNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	_, err = c.store.TransitionNodeRole(c.ctx, nrs["db@n1"].ID)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRole(c.ctx, nrs["db@n1"].ID, true, nil)
	require.NoError(t, err)
	assert.Equal(t, "todo", state("api@n1"))
	assert.Equal(t, "todo", state("api@n2"))

	// A descendant in transition is left to finish; a grandchild is
	// blocked through it.
	set("api@n1", "transition")
	set("base@n1", "transition")
	set("db@n1", "active")
	set("api@n2", "active")
	// base@n1 fails: db@n1 (active) and api@n2 (active, grandchild) block;
	// api@n1, in transition, is left alone.
	_, err = c.store.FinishNodeRole(c.ctx, nrs["base@n1"].ID, false, nil)
	require.NoError(t, err)
	assert.Equal(t, "blocked", state("db@n1"))
	assert.Equal(t, "blocked", state("api@n2"), "descendants, not only children")
	assert.Equal(t, "transition", state("api@n1"))
}

// A binding leaves a proposed snapshot with its descendants when cascade
// is asked, else the removal is refused naming them; committed and
// archived snapshots refuse.
func TestRemoveNodeRole(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	snap := c.propose(t, "prod")
	c.bind(t, snap, "n1", "db")
	api := c.bind(t, snap, "n1", "api")
	c.bind(t, snap, "n2", "cache")
	full, err := c.store.Snapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	byKey := map[string]crowbar.NodeRole{}
	for _, nr := range full.NodeRoles {
		byKey[nr.RoleName+"@"+nr.NodeName[:2]] = nr
	}
	require.Len(t, byKey, 4, "base, db, api on n1; cache on n2")

	// db is needed by api: refused, naming api.
	_, err = c.store.RemoveNodeRole(c.ctx, byKey["db@n1"].ID, false)
	ce := storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, fmt.Sprintf("api on n1.anneal.test (noderole %d)", api.ID))
	assert.Contains(t, ce.Reason, "cascade=true")
	// Nothing was removed.
	full, err = c.store.Snapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	assert.Len(t, full.NodeRoles, 4)

	// A leaf goes alone.
	removed, err := c.store.RemoveNodeRole(c.ctx, byKey["cache@n2"].ID, false)
	require.NoError(t, err)
	require.Len(t, removed, 1)
	assert.Equal(t, "cache", removed[0].RoleName)

	// base with cascade takes db and api.
	removed, err = c.store.RemoveNodeRole(c.ctx, byKey["base@n1"].ID, true)
	require.NoError(t, err)
	var names []string
	for _, nr := range removed {
		names = append(names, nr.RoleName)
	}
	assert.Equal(t, []string{"base", "db", "api"}, names)
	full, err = c.store.Snapshot(c.ctx, snap.ID)
	require.NoError(t, err)
	assert.Empty(t, full.NodeRoles)
	var edges int64
	require.NoError(t, c.store.DB.Model(&crowbar.NodeRoleEdge{}).Count(&edges).Error)
	assert.Zero(t, edges, "edges went with them")

	_, err = c.store.RemoveNodeRole(c.ctx, api.ID, true)
	require.ErrorIs(t, err, models.ErrNotFound)

	// Committed, then archived: refused.
	again := c.bind(t, snap, "n2", "cache")
	c.commit(t, snap)
	_, err = c.store.RemoveNodeRole(c.ctx, again.ID, false)
	ce = storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "committed")
	c.commit(t, c.propose(t, "prod"))
	_, err = c.store.RemoveNodeRole(c.ctx, again.ID, true)
	ce = storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "archived")
}

// A proposal's diff against the committed snapshot: bindings added and
// removed, and changed user data, system data and parents.
func TestDiffSnapshot(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "prod", "")
	c.node(t, "n1", "prod")
	c.node(t, "n2", "prod")
	first := c.propose(t, "prod")
	c.bind(t, first, "n1", "db")
	c.bind(t, first, "n2", "cache")
	d, err := c.store.DiffSnapshot(c.ctx, first.ID)
	require.NoError(t, err)
	assert.Len(t, d.Added, 3, "against the empty committed snapshot: base, db, cache")
	assert.Empty(t, d.Removed)
	c.commit(t, first)
	d, err = c.store.DiffSnapshot(c.ctx, first.ID)
	require.NoError(t, err)
	assert.Equal(t, first.ID, d.Against)
	assert.Empty(t, d.Added, "the committed snapshot against itself")
	assert.Empty(t, d.Removed)
	assert.Empty(t, d.Changed)

	prop := c.propose(t, "prod")
	nrs, err := c.store.Snapshot(c.ctx, prop.ID)
	require.NoError(t, err)
	byRole := map[string]crowbar.NodeRole{}
	for _, nr := range nrs.NodeRoles {
		byRole[nr.RoleName] = nr
	}
	_, err = c.store.UpdateNodeRole(c.ctx, byRole["db"].ID, map[string]any{"port": 6543, "opts": map[string]any{"pool": 5}, "tls": true})
	require.NoError(t, err)
	_, err = c.store.RemoveNodeRole(c.ctx, byRole["cache"].ID, false)
	require.NoError(t, err)
	api := c.bind(t, prop, "n1", "api")

	d, err = c.store.DiffSnapshot(c.ctx, prop.ID)
	require.NoError(t, err)
	require.Len(t, d.Added, 1)
	assert.Equal(t, crowbar.DiffItem{Role: "api", Node: "n1.anneal.test", NodeRole: api.ID, State: "proposed"}, d.Added[0])
	require.Len(t, d.Removed, 1)
	assert.Equal(t, "cache", d.Removed[0].Role)
	assert.Equal(t, "n2.anneal.test", d.Removed[0].Node)
	require.Len(t, d.Changed, 1)
	ch := d.Changed[0]
	assert.Equal(t, "db", ch.Role)
	assert.Equal(t, byRole["db"].ID, ch.NodeRole)
	assert.NotZero(t, ch.Committed)
	assert.Equal(t, []crowbar.DataChange{
		{Field: "user_data", Path: "port", Old: float64(5432), New: float64(6543)},
		{Field: "user_data", Path: "tls", New: true},
	}, ch.Changes, "opts.pool is the same; port changed; tls is new")
	assert.Equal(t, "user_data.port: 5432 → 6543", ch.Changes[0].String())

	_, err = c.store.DiffSnapshot(c.ctx, 999999)
	require.ErrorIs(t, err, models.ErrNotFound)
}
