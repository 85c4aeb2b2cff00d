package fuel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/models/storetest"
)

func TestResolveGraph(t *testing.T) {
	store, ctx := storetest.New(t)
	_, err := store.ImportRelease(ctx, storetest.ReleaseSpec(t))
	require.NoError(t, err)
	// Another release with a graph of the same type must not leak in.
	other := storetest.ReleaseSpec(t)
	other.Name = "other"
	other.Graphs["deployment"] = models.GraphSpec{Tasks: []plan.Task{{ID: "foreign", Tags: []string{"db"}}}}
	_, err = store.ImportRelease(ctx, other)
	require.NoError(t, err)
	dep, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: "openstack"})
	require.NoError(t, err)

	g, err := store.ResolveGraph(ctx, dep, "deployment")
	require.NoError(t, err)
	assert.Equal(t, []string{"setup", "db", "nova"}, taskIDs(g.Tasks))

	// The deployment's own graph overrides tasks by id and adds new ones.
	require.NoError(t, store.DB.Create(&fuel.Graph{
		OwnerKind: fuel.OwnerDeployment, OwnerID: dep.ID, Type: "deployment",
		Metadata: map[string]any{"owner": "deployment", "extra": true},
		Tasks: []plan.Task{
			{ID: "db", Tags: []string{"db"}, Parameters: plan.Parameters{Cmd: "echo override"}},
			{ID: "smoke", Tags: []string{"api"}},
		},
	}).Error)
	// A deployment graph of another type, and a graph owned by another
	// deployment, stay out.
	require.NoError(t, store.DB.Create(&fuel.Graph{
		OwnerKind: fuel.OwnerDeployment, OwnerID: dep.ID, Type: "custom", Metadata: map[string]any{}, Tasks: []plan.Task{{ID: "c"}},
	}).Error)
	require.NoError(t, store.DB.Create(&fuel.Graph{
		OwnerKind: fuel.OwnerDeployment, OwnerID: dep.ID + 1000, Type: "deployment", Metadata: map[string]any{}, Tasks: []plan.Task{{ID: "alien"}},
	}).Error)

	g, err = store.ResolveGraph(ctx, dep, "deployment")
	require.NoError(t, err)
	assert.Equal(t, "deployment", g.Type)
	assert.Equal(t, []string{"setup", "db", "nova", "smoke"}, taskIDs(g.Tasks))
	assert.Equal(t, "echo override", g.Tasks[1].Parameters.Cmd)
	assert.Empty(t, g.Tasks[1].Requires, "a task is replaced whole, not merged")
	assert.Equal(t, "echo setup", g.Tasks[0].Parameters.Cmd)
	assert.Equal(t, "deployment", g.Metadata["owner"], "deployment metadata wins")
	assert.Equal(t, true, g.Metadata["extra"])
	assert.Contains(t, g.Metadata, "on_success")

	_, err = store.ResolveGraph(ctx, dep, "nope")
	assert.ErrorIs(t, err, models.ErrNotFound)

	types, err := store.GraphTypes(ctx, dep)
	require.NoError(t, err)
	assert.Equal(t, []string{"custom", "deployment", "provision"}, types)

	// A deployment without a release sees only its own graphs.
	bare, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "bare"})
	require.NoError(t, err)
	_, err = store.ResolveGraph(ctx, bare, "deployment")
	assert.ErrorIs(t, err, models.ErrNotFound)
	types, err = store.GraphTypes(ctx, bare)
	require.NoError(t, err)
	assert.Empty(t, types)
}

func taskIDs(tasks []plan.Task) []string {
	out := make([]string, len(tasks))
	for i, t := range tasks {
		out[i] = t.ID
	}
	return out
}
