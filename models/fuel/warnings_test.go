package fuel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
)

// TestPlanWarningsAreRecorded: a cross-node dependency that no node can
// satisfy is reported on the transaction, not silently dropped.
func TestPlanWarningsAreRecorded(t *testing.T) {
	f := storetest.NewFixture(t)
	// Without a controller, nothing holds the db tag nova waits for.
	other := "system"
	_, err := f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Deployment: &other})
	require.NoError(t, err)
	txn := f.Execute(t, fuel.ExecuteInput{})
	gp, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	require.NotEmpty(t, gp.Warnings)
	loaded, err := f.Store.Transaction(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, gp.Warnings, loaded.Warnings)
	assert.Contains(t, loaded.Warnings[0], "db")
}
