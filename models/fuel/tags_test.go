package fuel_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/models/storetest"
)

// tagsByName lists the tags of a scope keyed by name.
func tagsByName(t *testing.T, f *storetest.Fixture, scope fuel.TagScope) map[string]fuel.Tag {
	t.Helper()
	tags, err := f.Store.Tags(f.Ctx, scope)
	require.NoError(t, err)
	out := map[string]fuel.Tag{}
	for _, tag := range tags {
		out[tag.OwnerKind+":"+tag.Name] = tag
	}
	return out
}

// nodeTagsOf loads a node's stored tags.
func nodeTagsOf(t *testing.T, f *storetest.Fixture, name string) []string {
	t.Helper()
	node, err := f.Store.Node(f.Ctx, name)
	require.NoError(t, err)
	return node.Tags
}

func TestImportReleaseCreatesTags(t *testing.T) {
	f := storetest.NewFixture(t)
	tags := tagsByName(t, f, fuel.TagScope{Release: "openstack@1.0"})
	require.Len(t, tags, 3, "api and db (controller), hypervisor (compute); db is also in tags_metadata")
	db := tags["release:db"]
	assert.True(t, db.ReadOnly, "produced by a role: stuck to it")
	assert.True(t, db.HasPrimary, "from tags_metadata")
	assert.True(t, db.Declared)
	assert.Equal(t, map[string]any{"name": "db"}, db.Metadata)
	assert.Equal(t, []string{"controller"}, db.Roles)
	assert.Equal(t, f.Release.ID, db.OwnerID)
	assert.True(t, tags["release:api"].ReadOnly)
	assert.False(t, tags["release:api"].HasPrimary)
	assert.Equal(t, []string{"compute"}, tags["release:hypervisor"].Roles)

	// A user tag of the release survives a re-import; declared tags follow
	// the new release: api is no longer produced, extra is declared only in
	// tags_metadata (so not read only), db loses has_primary.
	_, err := f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Release: "openstack@1.0", Metadata: map[string]any{"by": "user"}})
	require.NoError(t, err)
	spec := storetest.ReleaseSpec(t)
	ctl := spec.RolesMetadata["controller"]
	ctl.Tags = []string{"db"}
	spec.RolesMetadata["controller"] = ctl
	spec.TagsMetadata = map[string]models.TagMetadata{"extra": {Name: "Extra", HasPrimary: true}}
	_, err = f.Store.ImportRelease(f.Ctx, spec)
	require.NoError(t, err)
	tags = tagsByName(t, f, fuel.TagScope{Release: "openstack@1.0"})
	assert.ElementsMatch(t, []string{"release:db", "release:hypervisor", "release:extra", "release:swift"}, keys(tags))
	assert.Equal(t, db.ID, tags["release:db"].ID, "a tag still declared keeps its id")
	assert.False(t, tags["release:db"].HasPrimary)
	assert.False(t, tags["release:extra"].ReadOnly)
	assert.True(t, tags["release:extra"].HasPrimary)
	assert.Equal(t, map[string]any{"name": "Extra"}, tags["release:extra"].Metadata)
	assert.False(t, tags["release:swift"].Declared)
	assert.Equal(t, map[string]any{"by": "user"}, tags["release:swift"].Metadata)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestMigrationBackfillsReleaseTags runs the backfill of 0002_tags.sql on a
// release whose tags are missing, as for a release imported before it.
func TestMigrationBackfillsReleaseTags(t *testing.T) {
	f := storetest.NewFixture(t)
	before := tagsByName(t, f, fuel.TagScope{Release: "openstack@1.0"})
	require.NoError(t, f.Store.DB.Exec("DELETE FROM tags").Error)
	sql, err := os.ReadFile("../migrations/0002_tags.sql")
	require.NoError(t, err)
	_, backfill, ok := strings.Cut(string(sql), "-- Releases imported before")
	require.True(t, ok)
	require.NoError(t, f.Store.DB.Exec("-- "+backfill).Error)
	after := tagsByName(t, f, fuel.TagScope{Release: "openstack@1.0"})
	require.Equal(t, len(before), len(after))
	for name, tag := range before {
		got := after[name]
		assert.Equal(t, []any{tag.ReadOnly, tag.HasPrimary, tag.Declared, tag.Metadata},
			[]any{got.ReadOnly, got.HasPrimary, got.Declared, got.Metadata}, name)
	}
}

func TestTagCRUD(t *testing.T) {
	f := storetest.NewFixture(t)
	for _, name := range []string{"", "two words", "mysql:1", "primary-db", "/db/", "*", "tab\there"} {
		_, err := f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: name, Deployment: "prod"})
		storetest.RequireInput(t, err, "name")
	}
	_, err := f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift"})
	storetest.RequireInput(t, err, "release")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Release: "openstack", Deployment: "prod"})
	storetest.RequireInput(t, err, "deployment")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "nope"})
	storetest.RequireInput(t, err, "deployment")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Release: "nope"})
	storetest.RequireInput(t, err, "release")
	assert.Zero(t, storetest.Count(t, f.Store, &fuel.Tag{}, "name = ?", "swift"))

	swift, err := f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "prod", HasPrimary: true,
		Metadata: map[string]any{"color": "blue"}})
	require.NoError(t, err)
	assert.Equal(t, fuel.OwnerDeployment, swift.OwnerKind)
	assert.Equal(t, f.Dep.ID, swift.OwnerID)
	assert.False(t, swift.ReadOnly)

	// Duplicates in the scope, or clashing with the release, conflict.
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "prod"})
	assert.Contains(t, storetest.RequireConflict(t, err).Reason, "deployment prod")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "db", Deployment: "prod"})
	assert.Contains(t, storetest.RequireConflict(t, err).Reason, "release openstack@1.0")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Release: "openstack"})
	storetest.RequireConflict(t, err)

	got, err := f.Store.Tag(f.Ctx, swift.ID)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"color": "blue"}, got.Metadata)
	_, err = f.Store.Tag(f.Ctx, swift.ID+1000)
	assert.ErrorIs(t, err, models.ErrNotFound)

	off := false
	up, err := f.Store.UpdateTag(f.Ctx, swift.ID, fuel.TagUpdate{HasPrimary: &off})
	require.NoError(t, err)
	assert.False(t, up.HasPrimary)
	assert.Equal(t, map[string]any{"color": "blue"}, up.Metadata, "metadata not given stays")
	md := map[string]any{"color": "red"}
	up, err = f.Store.UpdateTag(f.Ctx, swift.ID, fuel.TagUpdate{Metadata: &md})
	require.NoError(t, err)
	assert.Equal(t, md, up.Metadata)
	_, err = f.Store.UpdateTag(f.Ctx, swift.ID, fuel.TagUpdate{})
	storetest.RequireInput(t, err, "body")

	// Tags stuck to a role can be neither modified nor deleted.
	tags := tagsByName(t, f, fuel.TagScope{Deployment: "prod"})
	db := tags["release:db"]
	_, err = f.Store.UpdateTag(f.Ctx, db.ID, fuel.TagUpdate{HasPrimary: &off})
	assert.Equal(t, "tag db is stuck to role(s) controller; change the release instead", storetest.RequireConflict(t, err).Reason)
	_, err = f.Store.DeleteTag(f.Ctx, db.ID)
	storetest.RequireConflict(t, err)
	reloaded, err := f.Store.Tag(f.Ctx, db.ID)
	require.NoError(t, err)
	assert.True(t, reloaded.HasPrimary)

	// Deleting unassigns the tag and its instances from the nodes.
	_, err = f.Store.AssignTags(f.Ctx, storetest.CtlName, []string{"swift", "swift:2"})
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, storetest.CmpName, []string{"swift:1"})
	require.NoError(t, err)
	del, err := f.Store.DeleteTag(f.Ctx, swift.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{storetest.CmpName, storetest.CtlName}, del.UnassignedFrom)
	assert.Equal(t, []string{"controller", "api", "db"}, nodeTagsOf(t, f, storetest.CtlName))
	assert.Equal(t, []string{"compute", "hypervisor"}, nodeTagsOf(t, f, storetest.CmpName))
	_, err = f.Store.Tag(f.Ctx, swift.ID)
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = f.Store.DeleteTag(f.Ctx, swift.ID)
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestDeploymentTagsAreScoped(t *testing.T) {
	f := storetest.NewFixture(t)
	other, err := f.Store.CreateDeployment(f.Ctx, models.DeploymentInput{Name: "staging", Release: "openstack@1.0"})
	require.NoError(t, err)
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "prod"})
	require.NoError(t, err)
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "ceph", Release: "openstack@1.0"})
	require.NoError(t, err)

	prod := tagsByName(t, f, fuel.TagScope{Deployment: "prod"})
	assert.ElementsMatch(t, []string{"release:api", "release:db", "release:hypervisor", "release:ceph", "deployment:swift"}, keys(prod))
	staging := tagsByName(t, f, fuel.TagScope{Deployment: other.Name})
	assert.ElementsMatch(t, []string{"release:api", "release:db", "release:hypervisor", "release:ceph"}, keys(staging))
	rel := tagsByName(t, f, fuel.TagScope{Release: "openstack"})
	assert.NotContains(t, rel, "deployment:swift")

	// A node of staging cannot take prod's swift, until staging has its own.
	_, _, err = f.Store.CreateNode(f.Ctx, models.NodeInput{Name: "stg.anneal.test", Deployment: "staging"}, true)
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, "stg.anneal.test", []string{"ceph", "swift"})
	storetest.RequireInput(t, err, "tags[1]")
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "staging"})
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, "stg.anneal.test", []string{"ceph", "swift"})
	require.NoError(t, err)
	sys, _, err := f.Store.CreateNode(f.Ctx, models.NodeInput{Name: "sys.anneal.test"}, true)
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, sys.Name, []string{"swift"})
	storetest.RequireInput(t, err, "tags[0]")

	_, err = f.Store.Tags(f.Ctx, fuel.TagScope{})
	storetest.RequireInput(t, err, "release")
	_, err = f.Store.Tags(f.Ctx, fuel.TagScope{Deployment: "nope"})
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestAssignAndUnassignTags(t *testing.T) {
	f := storetest.NewFixture(t)
	_, err := f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "prod"})
	require.NoError(t, err)

	view, err := f.Store.AssignTags(f.Ctx, storetest.CmpName, []string{"db", "swift", "db", "controller", "swift:3"})
	require.NoError(t, err)
	assert.Equal(t, []string{"compute", "hypervisor", "db", "swift", "controller", "swift:3"}, view.Tags)
	assert.Equal(t, []string{"compute"}, view.Roles)
	assert.Equal(t, "prod", view.Deployment)

	for _, c := range []struct {
		tags  []string
		field string
	}{
		{[]string{"api", "nope"}, "tags[1]"},
		{[]string{"api", "swift", "db:0"}, "tags[2]"},
		{[]string{"db:x"}, "tags[0]"},
		{[]string{"api", "nope:1"}, "tags[1]"},
		{[]string{"primary-db"}, "tags[0]"},
		{[]string{"api", ""}, "tags[1]"},
		{[]string{"db:1:2"}, "tags[0]"},
		{[]string{"swift:-1"}, "tags[0]"},
	} {
		_, err := f.Store.AssignTags(f.Ctx, storetest.CtlName, c.tags)
		storetest.RequireInput(t, err, c.field)
	}
	assert.Equal(t, []string{"controller", "api", "db"}, nodeTagsOf(t, f, storetest.CtlName), "a refused assignment writes nothing")
	_, err = f.Store.AssignTags(f.Ctx, storetest.CtlName, nil)
	storetest.RequireInput(t, err, "tags")
	_, err = f.Store.AssignTags(f.Ctx, "ghost.anneal.test", []string{"db"})
	assert.ErrorIs(t, err, models.ErrNotFound)

	// Unassigning what the node lacks is fine; so is removing every tag, the
	// role name still selects tasks at planning.
	view, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{"api", "not-held"})
	require.NoError(t, err)
	assert.Equal(t, []string{"controller", "db"}, view.Tags)
	view, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{"controller", "db"})
	require.NoError(t, err)
	assert.Equal(t, []string{}, view.Tags)
	assert.Equal(t, []string{}, nodeTagsOf(t, f, storetest.CtlName))
	_, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{})
	storetest.RequireInput(t, err, "tags")

	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	assert.Contains(t, runs, "setup@"+storetest.CtlName, "selected by the role name")
	assert.NotContains(t, runs, "db@"+storetest.CtlName)
	assert.Contains(t, runs, "db@"+storetest.CmpName, "cmp took the db tag")
}

// primaryGraphYAML adds a graph whose task only the primary of db runs.
const primaryGraphYAML = `
name: openstack
version: "1.0"
roles_metadata:
  controller: {tags: [api, db]}
  compute: {tags: [hypervisor]}
tags_metadata:
  db: {name: db, has_primary: true}
graphs:
  deployment:
    tasks:
      - id: db
        tags: [db]
        parameters: {cmd: "echo db"}
      - id: db-bootstrap
        tags: [primary-db]
        parameters: {cmd: "echo first"}
`

func TestPrimaryTags(t *testing.T) {
	f := storetest.NewFixture(t)
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(primaryGraphYAML), &spec))
	_, err := f.Store.ImportRelease(f.Ctx, spec)
	require.NoError(t, err)
	ctl2 := f.AddNode(t, "ctl2.anneal.test", "controller")
	require.Greater(t, ctl2.ID, f.Ctl.ID)

	primaryOf := func(name string) []string {
		t.Helper()
		view, err := f.Store.NodeTags(f.Ctx, name)
		require.NoError(t, err)
		return view.Primary
	}
	planned := func() map[string]models.TaskRun {
		t.Helper()
		txn, _ := f.Plan(t)
		return f.RunsByLabel(t, txn)
	}
	recorded := func() []fuel.PrimaryTag {
		t.Helper()
		var rows []fuel.PrimaryTag
		require.NoError(t, f.Store.DB.Order("tag").Find(&rows).Error)
		return rows
	}

	// The lowest id holding db is primary, before any plan too.
	assert.Equal(t, []string{"db"}, primaryOf(storetest.CtlName))
	assert.Equal(t, []string{}, primaryOf(ctl2.Name))
	runs := planned()
	assert.Contains(t, runs, "db-bootstrap@"+storetest.CtlName)
	assert.NotContains(t, runs, "db-bootstrap@"+ctl2.Name)
	assert.Contains(t, runs, "db@"+ctl2.Name)
	assert.Equal(t, []fuel.PrimaryTag{{DeploymentID: f.Dep.ID, Tag: "db", NodeID: f.Ctl.ID}}, recorded())

	// ctl loses db: ctl2 takes over, and keeps it when ctl gets db back.
	_, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{"db"})
	require.NoError(t, err)
	assert.Equal(t, []string{"db"}, primaryOf(ctl2.Name))
	runs = planned()
	assert.Contains(t, runs, "db-bootstrap@"+ctl2.Name)
	assert.NotContains(t, runs, "db-bootstrap@"+storetest.CtlName)
	_, err = f.Store.AssignTags(f.Ctx, storetest.CtlName, []string{"db"})
	require.NoError(t, err)
	for range 2 {
		runs = planned()
		assert.Contains(t, runs, "db-bootstrap@"+ctl2.Name, "stable across re-plans")
		assert.NotContains(t, runs, "db-bootstrap@"+storetest.CtlName)
	}
	assert.Equal(t, []string{}, primaryOf(storetest.CtlName))

	// ctl2 leaves the deployment: ctl is primary again.
	sys := models.SystemDeployment
	_, err = f.Store.UpdateNode(f.Ctx, ctl2.Name, models.NodeUpdate{Deployment: &sys})
	require.NoError(t, err)
	runs = planned()
	assert.Contains(t, runs, "db-bootstrap@"+storetest.CtlName)
	assert.Equal(t, []fuel.PrimaryTag{{DeploymentID: f.Dep.ID, Tag: "db", NodeID: f.Ctl.ID}}, recorded())

	// Nobody holds db: no primary, the row goes.
	_, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{"db"})
	require.NoError(t, err)
	runs = planned()
	for label := range runs {
		assert.False(t, strings.HasPrefix(label, "db"), label)
	}
	assert.Empty(t, recorded())

	// A deployment tag with has_primary works the same; a role name counts
	// as held.
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "compute-lead", Deployment: "prod", HasPrimary: true})
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, storetest.CmpName, []string{"compute-lead"})
	require.NoError(t, err)
	assert.Equal(t, []string{"compute-lead"}, primaryOf(storetest.CmpName))
	assert.True(t, plan.Resolves([]string{"primary-compute-lead"}, []string{"primary-compute-lead"}))
}

func TestCheckDeployment(t *testing.T) {
	f := storetest.NewFixture(t)
	check, err := f.Store.CheckDeployment(f.Ctx, "prod")
	require.NoError(t, err)
	assert.True(t, check.OK)
	assert.Equal(t, "prod", check.Deployment)
	assert.Equal(t, "openstack@1.0", check.Release)
	assert.Equal(t, []string{"api", "db", "hypervisor"}, check.Mandatory)
	assert.Empty(t, check.Warnings)

	// An instance tag does not hold its base tag; user tags are not mandatory.
	_, err = f.Store.UnassignTags(f.Ctx, storetest.CtlName, []string{"db"})
	require.NoError(t, err)
	_, err = f.Store.AssignTags(f.Ctx, storetest.CtlName, []string{"db:1"})
	require.NoError(t, err)
	_, err = f.Store.CreateTag(f.Ctx, fuel.TagInput{Name: "swift", Deployment: "prod"})
	require.NoError(t, err)
	check, err = f.Store.CheckDeployment(f.Ctx, "prod")
	require.NoError(t, err)
	assert.False(t, check.OK)
	assert.Equal(t, []fuel.CheckWarning{{Tag: "db",
		Message: "no node of deployment prod holds the mandatory tag db (declared by release openstack@1.0)"}}, check.Warnings)

	// Deploying is still allowed.
	f.Execute(t, fuel.ExecuteInput{})

	system, err := f.Store.CheckDeployment(f.Ctx, models.SystemDeployment)
	require.NoError(t, err)
	assert.True(t, system.OK, "no release, nothing mandatory")
	_, err = f.Store.CheckDeployment(f.Ctx, "nope")
	assert.ErrorIs(t, err, models.ErrNotFound)
}
