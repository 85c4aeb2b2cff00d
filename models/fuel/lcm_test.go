package fuel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestSkipUnchangedTasks: a task whose definition and node are unchanged
// since its last successful run there is planned as skipped, unless forced;
// a changed task, or one that never succeeded, runs.
func TestSkipUnchangedTasks(t *testing.T) {
	f := storetest.NewFixture(t)
	first := f.Execute(t, fuel.ExecuteInput{})
	_, err := f.Store.PlanGraph(f.Ctx, first.ID, 0)
	require.NoError(t, err)
	runs := f.RunsByLabel(t, first)
	for label, r := range runs {
		if label == "nova@"+storetest.CmpName {
			continue // never succeeds
		}
		require.NoError(t, f.Store.SucceedNoOp(f.Ctx, r.ID))
	}

	second := f.Execute(t, fuel.ExecuteInput{})
	_, err = f.Store.PlanGraph(f.Ctx, second.ID, 0)
	require.NoError(t, err)
	got := f.RunsByLabel(t, second)
	assert.Equal(t, contract.RunSkipped, got["setup@"+storetest.CtlName].State)
	assert.Equal(t, contract.RunSkipped, got["db@"+storetest.CtlName].State)
	assert.Equal(t, contract.RunPending, got["nova@"+storetest.CmpName].State, "never succeeded: runs")
	assert.Equal(t, runs["db@"+storetest.CtlName].InputsHash, got["db@"+storetest.CtlName].InputsHash)

	forced := f.Execute(t, fuel.ExecuteInput{Force: true})
	_, err = f.Store.PlanGraph(f.Ctx, forced.ID, 0)
	require.NoError(t, err)
	for label, r := range f.RunsByLabel(t, forced) {
		assert.Equal(t, contract.RunPending, r.State, "force runs %s", label)
	}

	// Changing the db task's command changes its inputs: it runs again.
	spec := storetest.ReleaseSpec(t)
	db := spec.Graphs["deployment"]
	db.Tasks[1].Parameters.Cmd = "echo db v2"
	spec.Graphs["deployment"] = db
	_, err = f.Store.ImportRelease(f.Ctx, spec)
	require.NoError(t, err)
	changed := f.Execute(t, fuel.ExecuteInput{})
	_, err = f.Store.PlanGraph(f.Ctx, changed.ID, 0)
	require.NoError(t, err)
	got = f.RunsByLabel(t, changed)
	assert.Equal(t, contract.RunPending, got["db@"+storetest.CtlName].State)
	assert.Equal(t, contract.RunSkipped, got["setup@"+storetest.CtlName].State)
}

// TestRoleWithoutTasks: a Crowbar-style role (no task selects it) runs as
// one task named after it, after its parent role's task on another node.
func TestRoleWithoutTasks(t *testing.T) {
	store, ctx := storetest.New(t)
	spec := models.ReleaseSpec{
		Name: "crowbar",
		RolesMetadata: map[string]models.RoleSpec{
			"dns":      {Script: "echo dns"},
			"ntp":      {},
			"database": {Requires: []string{"dns"}, Script: "echo db"},
		},
	}
	_, err := store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "cb", Release: "crowbar"})
	require.NoError(t, err)
	for name, roles := range map[string][]string{"a.anneal.test": {"dns", "ntp"}, "b.anneal.test": {"database"}} {
		_, _, err := store.CreateNode(ctx, models.NodeInput{Name: name}, true)
		require.NoError(t, err)
		dep := "cb"
		_, err = store.UpdateNode(ctx, name, models.NodeUpdate{Deployment: &dep, Roles: &roles})
		require.NoError(t, err)
	}
	// The release has no graphs at all: its roles make the deployment graph.
	txn, err := store.CreateTransaction(ctx, fuel.ExecuteInput{Deployment: "cb", Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
		func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	_, err = store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	runs, err := store.Runs(ctx, txn.ID, fuel.RunFilter{})
	require.NoError(t, err)
	got := map[string]models.TaskRun{}
	for _, r := range runs {
		got[r.TaskName+"@"+r.NodeName] = r
	}
	require.Len(t, got, 3)
	assert.Equal(t, "echo dns", got["dns@a.anneal.test"].Spec.Cmd)
	assert.Equal(t, "noop", got["ntp@a.anneal.test"].TaskType)
	db := got["database@b.anneal.test"]
	assert.Equal(t, "echo db", db.Spec.Cmd)
	plan, err := store.NodePlan(ctx, txn.ID, 0, db.NodeID)
	require.NoError(t, err)
	require.Len(t, plan.Runs, 1)
	assert.Equal(t, []int64{got["dns@a.anneal.test"].ID}, plan.Runs[0].Remote, "database waits for dns on the other node")
}
