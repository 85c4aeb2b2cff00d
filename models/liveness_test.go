package models_test

import (
	"strings"
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

// TestTouchNodesInOneStatement: heartbeats of alive nodes are recorded in
// one statement (boot id and address included, a node twice in the batch
// once); a silent node is revived as TouchNode does, an unknown one is
// not found and an invalid heartbeat is refused by field, each alone.
func TestTouchNodesInOneStatement(t *testing.T) {
	f := storetest.NewFixture(t)
	require.NoError(t, f.Store.DB.Model(&models.Node{}).Where("id = ?", f.Cmp.ID).Update("alive", false).Error)
	statements := countStatements(t, f, func(sql string) bool { return strings.HasPrefix(sql, "UPDATE nodes") })

	out, err := f.Store.TouchNodes(f.Ctx, []models.NodeTouch{
		{NodeID: f.Ctl.ID, BootID: "boot-9", Address: "10.0.0.9"},
		{NodeID: f.Cmp.ID, BootID: "boot-3"},
		{NodeID: f.Ctl.ID, BootID: "boot-9", Address: "10.0.0.9"},
		{NodeID: f.Ctl.ID + f.Cmp.ID + 100, BootID: "boot-1"},
		{NodeID: f.Ctl.ID, BootID: "bad\nboot"},
	})
	require.NoError(t, err)
	require.Len(t, out, 5)
	assert.Equal(t, models.Touched{Name: storetest.CtlName}, out[0])
	assert.Equal(t, models.Touched{Name: storetest.CmpName, Revived: true}, out[1], "a silent node is revived")
	assert.Equal(t, models.Touched{Name: storetest.CtlName}, out[2])
	assert.ErrorIs(t, out[3].Err, models.ErrNotFound, "an unknown node")
	var ie *models.InputError
	require.ErrorAs(t, out[4].Err, &ie)
	assert.Equal(t, "boot_id", ie.Field)
	// The batch's statement, then the silent node's two and the unknown
	// node's two (TouchNode's alive-only update, then its revival).
	assert.EqualValues(t, 5, statements.Load())

	ctl, err := f.Store.Node(f.Ctx, storetest.CtlName)
	require.NoError(t, err)
	assert.Equal(t, "boot-9", ctl.BootID)
	assert.Equal(t, "10.0.0.9", ctl.Address)
	cmp, err := f.Store.Node(f.Ctx, storetest.CmpName)
	require.NoError(t, err)
	assert.True(t, cmp.Alive)
}
