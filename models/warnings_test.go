package models_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
)

// TestPlanWarningsAreRecorded: a cross-node dependency that no node can
// satisfy is reported on the transaction, not silently dropped.
func TestPlanWarningsAreRecorded(t *testing.T) {
	f := newFixture(t)
	// Without a controller, nothing holds the db tag nova waits for.
	other := "system"
	_, err := f.store.UpdateNode(f.ctx, ctlName, models.NodeUpdate{Deployment: &other})
	require.NoError(t, err)
	txn := f.execute(t, fuel.ExecuteInput{})
	gp, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	require.NotEmpty(t, gp.Warnings)
	loaded, err := f.store.Transaction(f.ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, gp.Warnings, loaded.Warnings)
	assert.Contains(t, loaded.Warnings[0], "db")
}
