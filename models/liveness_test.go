package models_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
)

// TestSilentNodesAreNotAlive: a node whose agent stopped heartbeating is
// marked not alive (and planning then leaves it out); a heartbeat brings it
// back.
func TestSilentNodesAreNotAlive(t *testing.T) {
	f := storetest.NewFixture(t)
	require.NoError(t, f.Store.DB.Model(&models.Node{}).Where("id = ?", f.Cmp.ID).
		Update("last_seen_at", time.Now().Add(-time.Hour)).Error)
	names, err := f.Store.MarkSilentNodes(f.Ctx, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{storetest.CmpName}, names)
	node, err := f.Store.Node(f.Ctx, storetest.CmpName)
	require.NoError(t, err)
	assert.False(t, node.Alive)

	txn := f.Execute(t, fuel.ExecuteInput{})
	gp, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	for _, n := range gp.Nodes {
		assert.NotEqual(t, storetest.CmpName, n.Name, "a node that is not alive gets nothing")
	}

	name, revived, err := f.Store.TouchNode(f.Ctx, f.Cmp.ID, "boot-2", "")
	require.NoError(t, err)
	assert.Equal(t, storetest.CmpName, name)
	assert.True(t, revived, "a silent node's heartbeat revives it")
	_, revived, err = f.Store.TouchNode(f.Ctx, f.Cmp.ID, "boot-2", "")
	require.NoError(t, err)
	assert.False(t, revived, "an alive node's heartbeat does not")
	node, err = f.Store.Node(f.Ctx, storetest.CmpName)
	require.NoError(t, err)
	assert.True(t, node.Alive)
	names, err = f.Store.MarkSilentNodes(f.Ctx, 30*time.Second)
	require.NoError(t, err)
	assert.Empty(t, names)
}
