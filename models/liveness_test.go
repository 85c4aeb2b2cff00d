package models_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
)

// TestSilentNodesAreNotAlive: a node whose agent stopped heartbeating is
// marked not alive (and planning then leaves it out); a heartbeat brings it
// back.
func TestSilentNodesAreNotAlive(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.store.DB.Model(&models.Node{}).Where("id = ?", f.cmp.ID).
		Update("last_seen_at", time.Now().Add(-time.Hour)).Error)
	names, err := f.store.MarkSilentNodes(f.ctx, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{cmpName}, names)
	node, err := f.store.Node(f.ctx, cmpName)
	require.NoError(t, err)
	assert.False(t, node.Alive)

	txn := f.execute(t, fuel.ExecuteInput{})
	gp, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	for _, n := range gp.Nodes {
		assert.NotEqual(t, cmpName, n.Name, "a node that is not alive gets nothing")
	}

	_, _, err = f.store.TouchNode(f.ctx, f.cmp.ID, "boot-2", "")
	require.NoError(t, err)
	node, err = f.store.Node(f.ctx, cmpName)
	require.NoError(t, err)
	assert.True(t, node.Alive)
	names, err = f.store.MarkSilentNodes(f.ctx, 30*time.Second)
	require.NoError(t, err)
	assert.Empty(t, names)
}
