package models_test

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/models/storetest"
)

func TestMigrateIsIdempotent(t *testing.T) {
	store, ctx := storetest.New(t)
	// The test database is a clone of a migrated template: migrating again,
	// twice, must change nothing.
	require.NoError(t, models.Migrate(ctx, store.DB))
	require.NoError(t, models.Migrate(ctx, store.DB))
	var ids []string
	require.NoError(t, store.DB.Table("migrations").Order("id").Pluck("id", &ids).Error)
	files, err := filepath.Glob("migrations/*.sql")
	require.NoError(t, err)
	var want []string
	for _, f := range files {
		want = append(want, strings.TrimSuffix(filepath.Base(f), ".sql"))
	}
	assert.Equal(t, want, ids, "each migration recorded once")
	assert.EqualValues(t, 1, storetest.Count(t, store, &models.Deployment{}, "name = ?", models.SystemDeployment))
}

func TestCreateNodeValidation(t *testing.T) {
	store, ctx := storetest.New(t)
	for _, name := range []string{"", "Upper.anneal.test", "bad_label.anneal.test", "-x.anneal.test",
		"node.example.com", "anneal.test"} {
		node, secret, err := store.CreateNode(ctx, models.NodeInput{Name: name}, true)
		storetest.RequireInput(t, err, "name")
		assert.Nil(t, node, name)
		assert.Empty(t, secret, name)
	}
	_, _, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test", Deployment: "nope"}, false)
	storetest.RequireInput(t, err, "deployment")
	assert.Zero(t, storetest.Count(t, store, &models.Node{}), "a refused node must leave nothing behind")
}

func TestCreateNode(t *testing.T) {
	store, ctx := storetest.New(t)
	node, secret, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test", BootID: "b1", Address: "10.0.0.1"}, false)
	require.NoError(t, err)
	assert.Empty(t, secret)
	assert.False(t, node.Alive, "a node without credential has not phoned home")
	assert.Nil(t, node.AgentTokenHash)
	assert.Equal(t, models.NodeDiscover, node.Status)
	assert.True(t, node.Allocated)

	system, err := store.Deployment(ctx, models.SystemDeployment)
	require.NoError(t, err)
	loaded, err := store.Node(ctx, "n1.anneal.test")
	require.NoError(t, err)
	assert.Equal(t, node.ID, loaded.ID)
	assert.Equal(t, system.ID, loaded.DeploymentID, "new nodes land in the system deployment")
	assert.Equal(t, []string{}, loaded.Tags)
	assert.Equal(t, []string{}, loaded.Roles)
	assert.Equal(t, "10.0.0.1", loaded.Address)
	byID, err := store.Node(ctx, strconv.FormatInt(node.ID, 10))
	require.NoError(t, err)
	assert.Equal(t, "n1.anneal.test", byID.Name)
	_, err = store.Node(ctx, "ghost.anneal.test")
	assert.ErrorIs(t, err, models.ErrNotFound)

	// The node has no credential: its agent registering enrolls it (the
	// same node, alive), and a second registration is refused.
	enrolled, secret, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test", BootID: "b1"}, true)
	require.NoError(t, err)
	assert.Equal(t, node.ID, enrolled.ID)
	assert.NotEmpty(t, secret)
	p, err := store.Authenticate(ctx, secret)
	require.NoError(t, err)
	assert.Equal(t, node.ID, p.NodeID)
	_, again, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test"}, true)
	storetest.RequireConflict(t, err)
	assert.Empty(t, again)
	_, _, err = store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test"}, false)
	storetest.RequireConflict(t, err)
	assert.EqualValues(t, 1, storetest.Count(t, store, &models.Node{}))

	name, _, err := store.TouchNode(ctx, node.ID, "b2", "")
	require.NoError(t, err)
	assert.Equal(t, node.Name, name)
	touched, err := store.Node(ctx, node.Name)
	require.NoError(t, err)
	assert.True(t, touched.Alive)
	assert.Equal(t, "b2", touched.BootID)
	assert.Equal(t, "10.0.0.1", touched.Address, "an empty address keeps the known one")
	assert.NotNil(t, touched.LastSeenAt)
	_, _, err = store.TouchNode(ctx, node.ID+100, "b", "")
	assert.ErrorIs(t, err, models.ErrNotFound)

	nodes, err := store.Nodes(ctx, 0)
	require.NoError(t, err)
	assert.Len(t, nodes, 1)
}

func TestTokens(t *testing.T) {
	store, ctx := storetest.New(t)
	node, agentSecret, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test"}, true)
	require.NoError(t, err)
	require.NotEmpty(t, agentSecret)
	assert.True(t, node.Alive)
	assert.NotNil(t, node.LastSeenAt)

	p, err := store.Authenticate(ctx, agentSecret)
	require.NoError(t, err)
	assert.Equal(t, node.ID, p.NodeID)
	assert.Equal(t, "n1.anneal.test", p.Name)
	assert.Empty(t, p.Scope)
	assert.True(t, p.IsAgent())

	admin, err := store.CreateAPIToken(ctx, "ops", models.ScopeAdmin)
	require.NoError(t, err)
	enroll, err := store.CreateAPIToken(ctx, "pxe", models.ScopeEnroll)
	require.NoError(t, err)
	p, err = store.Authenticate(ctx, admin)
	require.NoError(t, err)
	assert.Equal(t, models.ScopeAdmin, p.Scope)
	assert.Equal(t, "ops", p.Name)
	assert.NotZero(t, p.TokenID)
	assert.False(t, p.IsAgent())
	p, err = store.Authenticate(ctx, enroll)
	require.NoError(t, err)
	assert.Equal(t, models.ScopeEnroll, p.Scope)
	assert.Equal(t, "pxe", p.Name)

	_, err = store.CreateAPIToken(ctx, "root", "superuser")
	storetest.RequireInput(t, err, "scope")

	require.NoError(t, store.ImportAPIToken(ctx, "dev", models.ScopeAdmin, "ann_dev-secret"))
	require.NoError(t, store.ImportAPIToken(ctx, "dev", models.ScopeAdmin, "ann_dev-secret"))
	assert.EqualValues(t, 3, storetest.Count(t, store, &models.APIToken{}), "importing twice stores one token")
	p, err = store.Authenticate(ctx, "ann_dev-secret")
	require.NoError(t, err)
	assert.Equal(t, models.ScopeAdmin, p.Scope)

	var stored models.APIToken
	require.NoError(t, store.DB.Where("name = ?", "ops").Take(&stored).Error)
	assert.Equal(t, models.HashSecret(admin), stored.TokenHash, "only the hash is stored")

	for _, bad := range []string{"", "ann_unknown", "agt_unknown", "whatever", admin + "x"} {
		_, err := store.Authenticate(ctx, bad)
		assert.ErrorIs(t, err, models.ErrForbidden, "%q", bad)
	}
}

func TestImportReleaseRefusesUnknownRequirement(t *testing.T) {
	store, ctx := storetest.New(t)
	spec := storetest.ReleaseSpec(t)
	compute := spec.RolesMetadata["compute"]
	compute.Requires = []string{"controller", "network"}
	spec.RolesMetadata["compute"] = compute
	_, err := store.ImportRelease(ctx, spec)
	storetest.RequireInput(t, err, "roles_metadata.compute.requires[1]")

	spec = storetest.ReleaseSpec(t)
	g := spec.Graphs["deployment"]
	g.Tasks = append(g.Tasks, plan.Task{ID: "broken", Requires: []string{"missing"}})
	spec.Graphs["deployment"] = g
	_, err = store.ImportRelease(ctx, spec)
	storetest.RequireInput(t, err, "graphs.deployment.tasks")

	_, err = store.ImportRelease(ctx, models.ReleaseSpec{Version: "1"})
	storetest.RequireInput(t, err, "name")

	spec = storetest.ReleaseSpec(t)
	compute = spec.RolesMetadata["compute"]
	compute.Flags = []string{"implicit", "discovry"}
	spec.RolesMetadata["compute"] = compute
	_, err = store.ImportRelease(ctx, spec)
	ie := storetest.RequireInput(t, err, "roles_metadata.compute.flags[1]")
	assert.Contains(t, ie.Reason, `"discovry"`)

	assert.Zero(t, storetest.Count(t, store, &models.Release{}))
	assert.Zero(t, storetest.Count(t, store, &models.Role{}))
	assert.Zero(t, storetest.Count(t, store, &fuel.Graph{}))
}

func TestImportReleaseTwiceReplaces(t *testing.T) {
	store, ctx := storetest.New(t)
	first, err := store.ImportRelease(ctx, storetest.ReleaseSpec(t))
	require.NoError(t, err)
	require.Len(t, first.Roles, 2)

	rel, err := store.Release(ctx, "openstack@1.0")
	require.NoError(t, err)
	require.Len(t, rel.Roles, 2)
	ctl := rel.Roles[1]
	assert.Equal(t, "controller", ctl.Name)
	assert.Equal(t, "Controller", ctl.Title)
	assert.Equal(t, "agent", ctl.Jig, "the default jig")
	assert.Equal(t, []string{"api", "db"}, ctl.Tags)
	assert.Equal(t, []string{}, ctl.Requires)
	assert.Equal(t, []string{}, ctl.Flags)
	assert.EqualValues(t, 5000, ctl.Template["port"])
	assert.Equal(t, []string{"controller"}, rel.Roles[0].Requires)
	assert.True(t, rel.TagsMetadata["db"].HasPrimary)

	second, err := store.ImportRelease(ctx, storetest.ReleaseSpec(t))
	require.NoError(t, err)
	assert.Equal(t, first.ID, second.ID, "same name and version: the release is replaced")
	assert.EqualValues(t, 1, storetest.Count(t, store, &models.Release{}))
	assert.EqualValues(t, 2, storetest.Count(t, store, &models.Role{}))
	assert.EqualValues(t, 2, storetest.Count(t, store, &fuel.Graph{}))

	// A changed spec replaces roles and graphs rather than adding to them.
	spec := storetest.ReleaseSpec(t)
	delete(spec.RolesMetadata, "compute")
	delete(spec.Graphs, "provision")
	g := spec.Graphs["deployment"]
	g.Tasks = g.Tasks[:1]
	spec.Graphs["deployment"] = g
	_, err = store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	assert.EqualValues(t, 1, storetest.Count(t, store, &models.Role{}))
	assert.EqualValues(t, 1, storetest.Count(t, store, &fuel.Graph{}))
	var graph fuel.Graph
	require.NoError(t, store.DB.Take(&graph).Error)
	assert.Equal(t, fuel.OwnerRelease, graph.OwnerKind)
	require.Len(t, graph.Tasks, 1)
	assert.Equal(t, "setup", graph.Tasks[0].ID)

	// Another version is another release; a bare name finds the newest.
	spec = storetest.ReleaseSpec(t)
	spec.Version = "2.0"
	v2, err := store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	assert.NotEqual(t, first.ID, v2.ID)
	newest, err := store.Release(ctx, "openstack")
	require.NoError(t, err)
	assert.Equal(t, v2.ID, newest.ID)
	byID, err := store.Release(ctx, strconv.FormatInt(first.ID, 10))
	require.NoError(t, err)
	assert.Equal(t, "1.0", byID.Version)
	_, err = store.Release(ctx, "openstack@9")
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestUpdateNodeRoles(t *testing.T) {
	store, ctx := storetest.New(t)
	_, err := store.ImportRelease(ctx, storetest.ReleaseSpec(t))
	require.NoError(t, err)
	dep, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: "openstack"})
	require.NoError(t, err)
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test"}, true)
	require.NoError(t, err)

	// The system deployment has no release: no roles to assign.
	roles := []string{"controller"}
	_, err = store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Roles: &roles})
	storetest.RequireInput(t, err, "roles[0]")
	ghost := "ghost"
	_, err = store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Deployment: &ghost})
	storetest.RequireInput(t, err, "deployment")
	_, err = store.UpdateNode(ctx, "ghost.anneal.test", models.NodeUpdate{Roles: &roles})
	assert.ErrorIs(t, err, models.ErrNotFound)

	prod := "prod"
	updated, err := store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Deployment: &prod, Roles: &roles})
	require.NoError(t, err)
	assert.Equal(t, dep.ID, updated.DeploymentID)
	assert.Equal(t, []string{"controller"}, updated.Roles)
	assert.Equal(t, []string{"controller", "api", "db"}, updated.Tags)

	// A tag added by hand survives role changes.
	require.NoError(t, store.DB.Model(&models.Node{}).Where("id = ?", node.ID).
		Update("tags", `["controller","api","db","rack1"]`).Error)
	roles = []string{"compute"}
	updated, err = store.UpdateNode(ctx, strconv.FormatInt(node.ID, 10), models.NodeUpdate{Roles: &roles})
	require.NoError(t, err)
	assert.Equal(t, []string{"rack1", "compute", "hypervisor"}, updated.Tags)

	// An unknown role is refused, naming its position, and changes nothing.
	roles = []string{"network", "controller"}
	_, err = store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Roles: &roles})
	storetest.RequireInput(t, err, "roles[0]")
	roles = []string{"controller", "network"}
	_, err = store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Deployment: &prod, Roles: &roles})
	storetest.RequireInput(t, err, "roles[1]")
	loaded, err := store.Node(ctx, "n1.anneal.test")
	require.NoError(t, err)
	assert.Equal(t, []string{"compute"}, loaded.Roles)
	assert.Equal(t, []string{"rack1", "compute", "hypervisor"}, loaded.Tags)
	assert.Equal(t, dep.ID, loaded.DeploymentID)

	roles = []string{}
	updated, err = store.UpdateNode(ctx, "n1.anneal.test", models.NodeUpdate{Roles: &roles})
	require.NoError(t, err)
	assert.Equal(t, []string{}, updated.Roles)
	assert.Equal(t, []string{"rack1"}, updated.Tags)
	loaded, err = store.Node(ctx, "n1.anneal.test")
	require.NoError(t, err)
	assert.Equal(t, []string{"rack1"}, loaded.Tags)
	assert.True(t, loaded.Alive, "UpdateNode writes only deployment, roles and tags")
}

func TestCreateDeployment(t *testing.T) {
	store, ctx := storetest.New(t)
	rel, err := store.ImportRelease(ctx, storetest.ReleaseSpec(t))
	require.NoError(t, err)
	system, err := store.Deployment(ctx, models.SystemDeployment)
	require.NoError(t, err)

	dep, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: strconv.FormatInt(rel.ID, 10)})
	require.NoError(t, err)
	require.NotNil(t, dep.ParentID)
	assert.Equal(t, system.ID, *dep.ParentID, "the default parent is system")
	require.NotNil(t, dep.ReleaseID)
	assert.Equal(t, rel.ID, *dep.ReleaseID)

	child, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod-eu", Parent: "prod"})
	require.NoError(t, err)
	assert.Equal(t, dep.ID, *child.ParentID)
	assert.Nil(t, child.ReleaseID)

	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: "openstack"})
	storetest.RequireConflict(t, err)
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "42"})
	storetest.RequireInput(t, err, "name")
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{})
	storetest.RequireInput(t, err, "name")
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "x", Parent: "nope"})
	storetest.RequireInput(t, err, "parent")
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "x", Release: "nope"})
	storetest.RequireInput(t, err, "release")

	deps, err := store.Deployments(ctx)
	require.NoError(t, err)
	names := []string{}
	for _, d := range deps {
		names = append(names, d.Name)
	}
	assert.Equal(t, []string{"system", "prod", "prod-eu"}, names)
	byID, err := store.Deployment(ctx, strconv.FormatInt(dep.ID, 10))
	require.NoError(t, err)
	assert.Equal(t, "prod", byID.Name)
	_, err = store.Deployment(ctx, "nope")
	assert.ErrorIs(t, err, models.ErrNotFound)
}
