package crowbar_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
)

// Node hooks are global and every node creation or deletion of every
// parallel test runs them, so the hooks below act only on the node names
// their tests use (nodeHookNames) and do nothing for any other node.
const (
	hookOrderNode  = "order.hooks.test" // never stored: RunNodeHooks is called directly
	hookFailNode   = "fail.anneal.test"
	hookDeleteNode = "gone.anneal.test"
)

var nodeHookNames = map[string]bool{hookOrderNode: true, hookFailNode: true, hookDeleteNode: true}

// nodeHookCalls records, per node name, "role/hook:event" in call order
// and, for deletions, whether the node's row was still there.
var nodeHookCalls = struct {
	sync.Mutex
	byNode map[string][]string
}{byNode: map[string][]string{}}

func recordNodeHook(label string) models.NodeHook {
	return func(_ context.Context, tx *gorm.DB, node *models.Node) error {
		if !nodeHookNames[node.Name] {
			return nil
		}
		entry := label
		if tx != nil {
			var n int64
			if err := tx.Model(&models.Node{}).Where("id = ?", node.ID).Count(&n).Error; err != nil {
				return err
			}
			if n == 1 {
				entry += "(row present)"
			}
		}
		nodeHookCalls.Lock()
		defer nodeHookCalls.Unlock()
		nodeHookCalls.byNode[node.Name] = append(nodeHookCalls.byNode[node.Name], entry)
		return nil
	}
}

func nodeHooksOf(name string) []string {
	nodeHookCalls.Lock()
	defer nodeHookCalls.Unlock()
	return append([]string(nil), nodeHookCalls.byNode[name]...)
}

func init() {
	// Registered out of name order: the run is in role name order, then
	// registration order.
	models.RegisterNodeHook("nodehook-b", models.OnNodeCreate, recordNodeHook("b1:create"))
	models.RegisterNodeHook("nodehook-a", models.OnNodeCreate, recordNodeHook("a1:create"))
	models.RegisterNodeHook("nodehook-b", models.OnNodeCreate, recordNodeHook("b2:create"))
	models.RegisterNodeHook("nodehook-a", models.OnNodeDelete, recordNodeHook("a1:delete"))
	models.RegisterNodeHook("nodehook-fail", models.OnNodeDelete, func(ctx context.Context, tx *gorm.DB, node *models.Node) error {
		if node.Name != hookFailNode {
			return nil
		}
		// A write the failure must roll back with the rest.
		if err := tx.Exec(`UPDATE nodes SET attributes = '{"touched": true}' WHERE id = ?`, node.ID).Error; err != nil {
			return err
		}
		return errors.New("refusing on purpose")
	})
}

func TestRunNodeHooksOrderAndEvents(t *testing.T) {
	node := &models.Node{Name: hookOrderNode}
	require.NoError(t, models.RunNodeHooks(context.Background(), nil, models.OnNodeCreate, node))
	assert.Equal(t, []string{"a1:create", "b1:create", "b2:create"}, nodeHooksOf(hookOrderNode),
		"role name order, then registration order; no delete hook on create")

	require.NoError(t, models.RunNodeHooks(context.Background(), nil, models.OnNodeDelete, node))
	assert.Equal(t, []string{"a1:create", "b1:create", "b2:create", "a1:delete"}, nodeHooksOf(hookOrderNode))

	err := models.RunNodeHooks(context.Background(), nil, crowbar.OnProposed, node)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"on_proposed" is not a node event`)
	assert.Len(t, nodeHooksOf(hookOrderNode), 4, "nothing ran for a noderole event")

	assert.Panics(t, func() { models.RegisterNodeHook("nodehook-x", crowbar.OnActive, recordNodeHook("x")) },
		"a noderole event is not a node event")
	assert.Panics(t, func() { models.RegisterNodeHook("nodehook-x", "on_node_update", recordNodeHook("x")) })
}

func TestDeleteNodeRunsHooksFirst(t *testing.T) {
	c := newCrowbar(t)
	gone := c.node(t, "gone", "")
	deleted, err := c.store.DeleteNode(c.ctx, gone.Name)
	require.NoError(t, err)
	assert.Equal(t, gone.ID, deleted.ID)
	assert.Equal(t, gone.Name, deleted.Name)
	var deletes []string
	for _, e := range nodeHooksOf(hookDeleteNode) {
		if strings.Contains(e, ":delete") {
			deletes = append(deletes, e)
		}
	}
	assert.Equal(t, []string{"a1:delete(row present)"}, deletes,
		"on_node_delete ran once, in the transaction, just before the node went")
	_, err = c.store.Node(c.ctx, gone.Name)
	assert.ErrorIs(t, err, models.ErrNotFound)

	_, err = c.store.DeleteNode(c.ctx, gone.Name)
	assert.ErrorIs(t, err, models.ErrNotFound, "gone already")
	_, err = c.store.DeleteNode(c.ctx, "987654")
	assert.ErrorIs(t, err, models.ErrNotFound)

	// A failing hook stops the deletion and rolls back what hooks wrote.
	fail := c.node(t, "fail", "")
	_, err = c.store.DeleteNode(c.ctx, fail.Name)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "on_node_delete hook of role nodehook-fail on node "+hookFailNode+": refusing on purpose")
	kept, err := c.store.Node(c.ctx, fail.Name)
	require.NoError(t, err, "the node is still there")
	assert.Empty(t, kept.Attributes, "the hook's write was rolled back")
}

// TestDeleteNodeKeepsTransactionHistory: a node with work in flight is
// refused (409, saying what to wait for); once its transaction ended it
// goes, and the transaction's runs stay readable under the node's name.
func TestDeleteNodeKeepsTransactionHistory(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup := runs["setup@"+storetest.CtlName]

	_, err := f.Store.DeleteNode(f.Ctx, storetest.CtlName)
	ce := storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "transaction "+txn.ID.String()+" has not finished")
	assert.Contains(t, ce.Reason, "/api/v1/transactions/"+txn.ID.String()+"/stop")

	_, err = f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)
	_, err = f.Store.DeleteNode(f.Ctx, storetest.CtlName)
	ce = storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "(setup) is running")

	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, StdoutTail: "set up"})
	require.NoError(t, err)
	for _, r := range runs {
		require.NoError(t, f.Store.SucceedNoOp(f.Ctx, r.ID))
	}
	before, err := f.Store.FinishTransaction(f.Ctx, txn.ID, false, "")
	require.NoError(t, err)
	require.Equal(t, models.TxReady, before.Status)

	deleted, err := f.Store.DeleteNode(f.Ctx, storetest.CtlName)
	require.NoError(t, err)
	assert.Equal(t, f.Ctl.ID, deleted.ID)
	_, err = f.Store.Node(f.Ctx, storetest.CtlName)
	assert.ErrorIs(t, err, models.ErrNotFound)

	after, err := f.Store.TransactionStatus(f.Ctx, txn.ID)
	require.NoError(t, err)
	assert.Equal(t, before.Total, after.Total, "no run of the history went")
	assert.Equal(t, before.Counts, after.Counts)
	kept := f.RunsByLabel(t, txn)
	require.Contains(t, kept, "setup@"+storetest.CtlName, "the run still names the deleted node")
	assert.Zero(t, kept["setup@"+storetest.CtlName].NodeID, "only the link to the node is gone")
	assert.Equal(t, "set up", kept["setup@"+storetest.CtlName].StdoutTail)
	assert.Equal(t, f.Cmp.ID, kept["setup@"+storetest.CmpName].NodeID, "another node's runs are untouched")
	byName, err := f.Store.Runs(f.Ctx, txn.ID, fuel.RunFilter{Node: storetest.CtlName})
	require.NoError(t, err)
	assert.Len(t, byName, 2, "runs are still found by the node's name")

	// Planning again leaves the deleted node out and reads its history
	// (LCM, a deployment's last successful runs) without tripping on it.
	again := f.Execute(t, fuel.ExecuteInput{})
	_, err = f.Store.PlanGraph(f.Ctx, again.ID, 0)
	require.NoError(t, err)
	for label, r := range f.RunsByLabel(t, again) {
		assert.Equal(t, f.Cmp.ID, r.NodeID, "%s", label)
	}
	assert.Zero(t, storetest.Count(t, f.Store, &models.Node{}, "name = ?", storetest.CtlName))
}

// TestDeleteNodeRefusesNodeRoleWork: a noderole in transition, or its run
// under way, keeps the node; once the run ended the node goes with its
// noderoles and their runs.
func TestDeleteNodeRefusesNodeRoleWork(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "del", "")
	n := c.node(t, "busy", "del")
	keep := c.node(t, "keep", "del")
	snap := c.propose(t, "del")
	c.bind(t, snap, "busy", "cache")
	c.bind(t, snap, "keep", "front") // front on keep requires cache on busy
	c.commit(t, snap)
	cur := c.committedByKey(t, "del")
	nr, other := cur["cache@busy"], cur["front@keep"]

	_, err := c.store.TransitionNodeRole(c.ctx, nr.ID)
	require.NoError(t, err)
	_, err = c.store.DeleteNode(c.ctx, n.Name)
	ce := storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "(cache) is in transition")

	plan, err := c.store.PrepareNodeRoleRun(c.ctx, nr.ID, 1)
	require.NoError(t, err)
	_, err = c.store.DispatchRun(c.ctx, plan.RunID, nil)
	require.NoError(t, err)
	_, err = c.store.DeleteNode(c.ctx, n.Name)
	ce = storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "(cache)")

	_, err = c.store.RecordRunResult(c.ctx, n.ID, plan.RunID, protocol.RunResult{Attempt: 1})
	require.NoError(t, err)
	_, err = c.store.FinishNodeRoleRun(c.ctx, nr.ID, 1, true, "")
	require.NoError(t, err)

	// A software deployment in progress keeps it too.
	require.NoError(t, c.store.DB.Exec(`INSERT INTO software_configs (name) VALUES ('cfg')`).Error)
	require.NoError(t, c.store.DB.Exec(`INSERT INTO software_deployments (config_id, node_id, status)
		SELECT id, ?, 'IN_PROGRESS' FROM software_configs WHERE name = 'cfg'`, n.ID).Error)
	_, err = c.store.DeleteNode(c.ctx, n.Name)
	ce = storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, "is in progress on node "+n.Name)
	require.NoError(t, c.store.DB.Exec(`UPDATE software_deployments SET status = 'COMPLETE' WHERE node_id = ?`, n.ID).Error)

	_, err = c.store.DeleteNode(c.ctx, n.Name)
	require.NoError(t, err)
	assert.Zero(t, storetest.Count(t, c.store, &crowbar.NodeRole{}, "node_id = ?", n.ID), "its noderoles went")
	assert.Zero(t, storetest.Count(t, c.store, &models.TaskRun{}, "noderole_id = ?", nr.ID), "with their runs")
	assert.Zero(t, storetest.Count(t, c.store, &models.TaskRun{}, "node_id = ?", n.ID))
	assert.Zero(t, storetest.Count(t, c.store, &crowbar.NodeRoleEdge{}, "child_id = ?", other.ID), "the edge to a child on another node went")
	assert.EqualValues(t, 1, storetest.Count(t, c.store, &crowbar.NodeRole{}, "id = ?", other.ID), "the child itself stays")
	_, err = c.store.Node(c.ctx, keep.Name)
	require.NoError(t, err)
}

func TestUpdateNodeFlags(t *testing.T) {
	f := storetest.NewFixture(t)
	off := false
	node, err := f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Available: &off})
	require.NoError(t, err)
	assert.False(t, node.Available)
	assert.True(t, node.Allocated, "untouched")
	assert.Equal(t, []string{"controller"}, node.Roles, "roles stay when not given")

	node, err = f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Allocated: &off})
	require.NoError(t, err)
	loaded, err := f.Store.Node(f.Ctx, storetest.CtlName)
	require.NoError(t, err)
	assert.False(t, loaded.Available, "stored")
	assert.False(t, loaded.Allocated, "stored")
	assert.Equal(t, node.Tags, loaded.Tags)

	on := true
	_, err = f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Available: &on, Allocated: &on})
	require.NoError(t, err)
	loaded, err = f.Store.Node(f.Ctx, storetest.CtlName)
	require.NoError(t, err)
	assert.True(t, loaded.Available)
	assert.True(t, loaded.Allocated)
}
