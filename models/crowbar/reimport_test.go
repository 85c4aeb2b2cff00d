package crowbar_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/storetest"
)

// bindings is the crowbar release (noderoles_test.go) deployed as "d" with
// db (which binds base, implicit, with it) and api bound to node n1.
type bindings struct {
	*env
	snap    *crowbar.Snapshot
	api     *crowbar.NodeRole
	roleIDs map[string]int64
}

func newBindings(t *testing.T) *bindings {
	t.Helper()
	c := newCrowbar(t)
	c.deployment(t, "d", "")
	c.node(t, "n1", "d")
	b := &bindings{env: c, snap: c.propose(t, "d")}
	c.bind(t, b.snap, "n1", "db")
	b.api = c.bind(t, b.snap, "n1", "api")
	b.roleIDs = b.ids(t)
	require.Len(t, b.roleIDs, 7)
	require.EqualValues(t, 3, storetest.Count(t, c.store, &crowbar.NodeRole{}), "api, db and base")
	return b
}

// ids maps the release's stored roles by name to their ids.
func (b *bindings) ids(t *testing.T) map[string]int64 {
	t.Helper()
	rel, err := b.store.Release(b.ctx, "crowbar@2.0")
	require.NoError(t, err)
	out := map[string]int64{}
	for _, r := range rel.Roles {
		out[r.Name] = r.ID
	}
	return out
}

func crowbarSpec(t *testing.T) models.ReleaseSpec {
	t.Helper()
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(crowbarYAML), &spec))
	return spec
}

func TestReimportReleaseKeepsBindings(t *testing.T) {
	b := newBindings(t)
	spec := crowbarSpec(t)
	api := spec.RolesMetadata["api"]
	api.Name = "API server"
	api.Tags = []string{"http"}
	spec.RolesMetadata["api"] = api
	spec.RolesMetadata["extra"] = models.RoleSpec{Requires: []string{"base"}}

	out, err := b.store.ImportReleaseWithWarnings(b.ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, []string{}, out.Warnings)
	require.Len(t, out.Roles, 8)
	for _, r := range out.Roles {
		if r.Name == "extra" {
			assert.NotZero(t, r.ID)
			continue
		}
		assert.Equal(t, b.roleIDs[r.Name], r.ID, "role %s keeps its id", r.Name)
	}

	// The bindings survive, and the role is updated in place.
	nr := b.reload(t, b.api)
	assert.Equal(t, b.roleIDs["api"], nr.RoleID)
	assert.Equal(t, "api", nr.RoleName)
	assert.EqualValues(t, 3, storetest.Count(t, b.store, &crowbar.NodeRole{}))
	assert.EqualValues(t, 3, storetest.Count(t, b.store, &crowbar.DeploymentRole{}))
	rel, err := b.store.Release(b.ctx, "crowbar@2.0")
	require.NoError(t, err)
	var stored models.Role
	for _, r := range rel.Roles {
		if r.Name == "api" {
			stored = r
		}
	}
	assert.Equal(t, "API server", stored.Title)
	assert.Equal(t, []string{"http"}, stored.Tags)
	assert.True(t, stored.UpdatedAt.After(stored.CreatedAt), "updated, not recreated")
}

func TestReimportReleaseRefusesDroppingBoundRole(t *testing.T) {
	b := newBindings(t)
	before, err := b.store.Release(b.ctx, "crowbar@2.0")
	require.NoError(t, err)
	spec := crowbarSpec(t)
	delete(spec.RolesMetadata, "api")    // bound
	delete(spec.RolesMetadata, "hooked") // not bound
	db := spec.RolesMetadata["db"]
	db.Name = "changed"
	spec.RolesMetadata["db"] = db

	_, err = b.store.ImportRelease(b.ctx, spec)
	ce := storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, `"api"`)
	assert.Contains(t, ce.Reason, "n1.anneal.test")
	assert.Contains(t, ce.Reason, "unbind")
	assert.NotContains(t, ce.Reason, "hooked")

	// Nothing written.
	after, err := b.store.Release(b.ctx, "crowbar@2.0")
	require.NoError(t, err)
	assert.Equal(t, before.UpdatedAt, after.UpdatedAt)
	assert.Equal(t, before.Roles, after.Roles)
	assert.EqualValues(t, 3, storetest.Count(t, b.store, &crowbar.NodeRole{}))
	b.reload(t, b.api)

	// A binding in a snapshot that is no longer the proposal counts too.
	b.commit(t, b.snap)
	_, err = b.store.ImportRelease(b.ctx, spec)
	storetest.RequireConflict(t, err)
	assert.Equal(t, b.roleIDs, b.ids(t))
}

func TestReimportReleaseDropsUnboundRole(t *testing.T) {
	b := newBindings(t)
	spec := crowbarSpec(t)
	delete(spec.RolesMetadata, "odd")
	delete(spec.RolesMetadata, "hooked")

	rel, err := b.store.ImportRelease(b.ctx, spec)
	require.NoError(t, err)
	require.Len(t, rel.Roles, 5)
	want := b.roleIDs
	delete(want, "odd")
	delete(want, "hooked")
	assert.Equal(t, want, b.ids(t))
	assert.EqualValues(t, 5, storetest.Count(t, b.store, &models.Role{}))
	b.reload(t, b.api)

	// A release with no roles at all drops every one, when none is bound.
	other := crowbarSpec(t)
	other.Version = "3.0"
	_, err = b.store.ImportRelease(b.ctx, other)
	require.NoError(t, err)
	other.RolesMetadata = nil
	rel, err = b.store.ImportRelease(b.ctx, other)
	require.NoError(t, err)
	assert.Empty(t, rel.Roles)
	assert.EqualValues(t, 5, storetest.Count(t, b.store, &models.Role{}), "only 2.0's roles left")
}

func TestImportReleaseReportsRedundantRequirements(t *testing.T) {
	store, ctx := storetest.New(t)
	spec := crowbarSpec(t)
	api := spec.RolesMetadata["api"]
	api.Requires = []string{"db", "base"} // db already requires base
	spec.RolesMetadata["api"] = api

	out, err := store.ImportReleaseWithWarnings(ctx, spec)
	require.NoError(t, err, "a redundant requirement is a warning, not an error")
	assert.Equal(t, []string{`role "api" requires "base", which it already requires through "db"`}, out.Warnings)
	assert.Equal(t, "crowbar", out.Name)
	assert.Len(t, out.Roles, 7)
}
