package fuel_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
)

// A graph without callbacks (the short path: no database transaction)
// ends with its node's progress at 100 and its attributes as they were; a
// transaction or graph that does not exist is an error, not a silent
// success.
func TestFinishNodeGraphWithoutCallbacks(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 1, 2)
	txn, err := store.CreateTransaction(ctx, fuel.ExecuteInput{Deployment: dep.Name, Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
		func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	var node models.Node
	require.NoError(t, store.DB.Where("deployment_id = ?", dep.ID).Take(&node).Error)
	require.NoError(t, store.DB.Model(&node).Update("attributes", `{"kept": "yes"}`).Error)

	require.NoError(t, store.StartNodeGraph(ctx, node.ID))
	require.NoError(t, store.DB.Take(&node, node.ID).Error)
	require.Equal(t, 0, node.Progress)

	for _, outcome := range []string{"success", "error", "stop"} {
		require.NoError(t, store.StartNodeGraph(ctx, node.ID))
		require.NoError(t, store.FinishNodeGraph(ctx, txn.ID, 0, node.ID, outcome), outcome)
		var after models.Node
		require.NoError(t, store.DB.Take(&after, node.ID).Error)
		assert.Equal(t, 100, after.Progress, outcome)
		assert.Equal(t, map[string]any{"kept": "yes"}, after.Attributes, outcome)
		assert.Equal(t, node.Status, after.Status, outcome)
	}

	err = store.FinishNodeGraph(ctx, txn.ID, 1, node.ID, "success")
	assert.ErrorContains(t, err, "has no graph 1")
	err = store.FinishNodeGraph(ctx, txn.ID, -1, node.ID, "success")
	assert.ErrorContains(t, err, "has no graph -1")
	err = store.FinishNodeGraph(ctx, uuid.New(), 0, node.ID, "success")
	assert.ErrorIs(t, err, models.ErrNotFound)
}
