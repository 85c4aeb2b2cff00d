package fuel_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
)

// A graph without callbacks (the short path: one statement) ends with its
// node's progress at 100 and its attributes as they were; a transaction or
// graph that does not exist is an error, not a silent success, and leaves
// the progress alone.
func TestFinishNodeGraphWithoutCallbacks(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 1, 2)
	txn := deploymentTransaction(t, store, dep)
	var node models.Node
	require.NoError(t, store.DB.Where("deployment_id = ?", dep.ID).Take(&node).Error)
	require.NoError(t, store.DB.Model(&node).Update("attributes", `{"kept": "yes"}`).Error)

	_, err := store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	start := func() {
		t.Helper()
		np, err := store.StartNodePlan(ctx, txn.ID, 0, node.ID)
		require.NoError(t, err)
		require.Len(t, np.Runs, 2)
	}
	start()
	require.NoError(t, store.DB.Take(&node, node.ID).Error)
	require.Equal(t, 0, node.Progress)

	for _, outcome := range []string{"success", "error", "stop"} {
		start()
		require.NoError(t, store.FinishNodeGraph(ctx, txn.ID, 0, node.ID, outcome), outcome)
		var after models.Node
		require.NoError(t, store.DB.Take(&after, node.ID).Error)
		assert.Equal(t, 100, after.Progress, outcome)
		assert.Equal(t, map[string]any{"kept": "yes"}, after.Attributes, outcome)
		assert.Equal(t, node.Status, after.Status, outcome)
	}

	start()
	err = store.FinishNodeGraph(ctx, txn.ID, 1, node.ID, "success")
	assert.ErrorContains(t, err, "has no graph 1")
	err = store.FinishNodeGraph(ctx, txn.ID, -1, node.ID, "success")
	assert.ErrorContains(t, err, "has no graph -1")
	err = store.FinishNodeGraph(ctx, uuid.New(), 0, node.ID, "success")
	assert.ErrorIs(t, err, models.ErrNotFound)
	require.NoError(t, store.DB.Take(&node, node.ID).Error)
	assert.Equal(t, 0, node.Progress, "no graph, no end")
}

// StartNodePlan marks the node busy with the graph (progress 0) only while
// one of its runs is pending; NodePlan reads the same plan and writes
// nothing.
func TestStartNodePlanStartsOnlyPendingWork(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 1, 3)
	txn := deploymentTransaction(t, store, dep)
	_, err := store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	var node models.Node
	require.NoError(t, store.DB.Where("deployment_id = ?", dep.ID).Take(&node).Error)
	progress := func() int {
		t.Helper()
		var n models.Node
		require.NoError(t, store.DB.Take(&n, node.ID).Error)
		return n.Progress
	}
	setProgress := func(p int) {
		t.Helper()
		require.NoError(t, store.DB.Model(&models.Node{}).Where("id = ?", node.ID).Update("progress", p).Error)
	}

	setProgress(55)
	read, err := store.NodePlan(ctx, txn.ID, 0, node.ID)
	require.NoError(t, err)
	assert.Equal(t, 55, progress(), "NodePlan writes nothing")
	var statements atomic.Int64
	count := func(*gorm.DB) { statements.Add(1) }
	require.NoError(t, store.DB.Callback().Query().After("gorm:query").Register("test:count_query", count))
	require.NoError(t, store.DB.Callback().Raw().After("gorm:raw").Register("test:count_raw", count))
	require.NoError(t, store.DB.Callback().Row().After("gorm:row").Register("test:count_row", count))
	started, err := store.StartNodePlan(ctx, txn.ID, 0, node.ID)
	require.NoError(t, err)
	require.NoError(t, store.DB.Callback().Query().Remove("test:count_query"))
	require.NoError(t, store.DB.Callback().Raw().Remove("test:count_raw"))
	require.NoError(t, store.DB.Callback().Row().Remove("test:count_row"))
	assert.EqualValues(t, 1, statements.Load(), "runs, edges and the node's start in one round trip")
	assert.Equal(t, read, started, "the same plan")
	require.Len(t, started.Runs, 3)
	assert.Equal(t, []string{"t01", "t02", "t03"}, []string{started.Runs[0].Task, started.Runs[1].Task, started.Runs[2].Task}, "in plan order")
	assert.Equal(t, []int64{started.Runs[0].ID}, started.Runs[1].Parents)
	assert.Equal(t, 0, progress(), "pending runs: started")

	require.NoError(t, store.DB.Model(&models.TaskRun{}).Where("transaction_id = ?", txn.ID).Update("state", "succeeded").Error)
	setProgress(100)
	_, err = store.StartNodePlan(ctx, txn.ID, 0, node.ID)
	require.NoError(t, err)
	assert.Equal(t, 100, progress(), "nothing pending: left alone")
}
