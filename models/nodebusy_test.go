package models_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestNodeRunsOneThingAtATime: a transaction with work on a node keeps the
// annealer away from it until the transaction ends; a noderole in
// transition keeps a transaction's run from being dispatched there, and a
// running task keeps another transaction's run waiting; other nodes are
// not held up.
func TestNodeRunsOneThingAtATime(t *testing.T) {
	f := storetest.NewFixture(t)
	first, _ := f.Plan(t)
	runs := f.RunsByLabel(t, first)

	snap, err := f.Store.ProposeSnapshot(f.Ctx, f.Dep.Name)
	require.NoError(t, err)
	ctl, _, err := f.Store.BindRole(f.Ctx, snap.ID, crowbar.BindInput{Node: storetest.CtlName, Role: "controller"})
	require.NoError(t, err)
	_, err = f.Store.CommitSnapshot(f.Ctx, snap.ID)
	require.NoError(t, err)

	// The transaction still has runs to do on ctl: the annealer waits.
	next, err := f.Store.NextNodeRoles(f.Ctx, f.Dep.ID, 0)
	require.NoError(t, err)
	assert.Empty(t, next)
	_, err = f.Store.TransitionNodeRole(f.Ctx, ctl.ID)
	conflict := storetest.RequireConflict(t, err)
	assert.Contains(t, conflict.Reason, "transaction "+first.ID.String()+" has work on it")

	for _, r := range runs {
		require.NoError(t, f.Store.SucceedNoOp(f.Ctx, r.ID))
	}
	_, err = f.Store.FinishTransaction(f.Ctx, first.ID, false, "")
	require.NoError(t, err)
	next, err = f.Store.NextNodeRoles(f.Ctx, f.Dep.ID, 0)
	require.NoError(t, err)
	require.Len(t, next, 1)
	assert.Equal(t, ctl.ID, next[0].ID)
	_, err = f.Store.TransitionNodeRole(f.Ctx, ctl.ID)
	require.NoError(t, err)

	// Now the noderole holds ctl: a new transaction's run there waits,
	// cmp's goes.
	second, _ := f.Plan(t)
	runs = f.RunsByLabel(t, second)
	_, err = f.Store.DispatchRun(f.Ctx, runs["setup@"+storetest.CtlName].ID, []byte("t"))
	var busy *models.NodeBusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, storetest.CtlName, busy.Node)
	assert.Contains(t, busy.Reason, "(controller) is in transition")
	_, err = f.Store.DispatchRun(f.Ctx, runs["setup@"+storetest.CmpName].ID, []byte("t"))
	require.NoError(t, err)

	// The noderole's own run is not held up by its transition.
	plan, err := f.Store.PrepareNodeRoleRun(f.Ctx, ctl.ID, 1)
	require.NoError(t, err)
	_, err = f.Store.DispatchRun(f.Ctx, plan.RunID, []byte("t"))
	require.NoError(t, err)
	_, err = f.Store.FinishNodeRoleRun(f.Ctx, ctl.ID, 1, true, "")
	require.NoError(t, err)
	run, err := f.Store.DispatchRun(f.Ctx, runs["setup@"+storetest.CtlName].ID, []byte("t"))
	require.NoError(t, err, "the node is free once the noderole ended")
	assert.Equal(t, contract.RunRunning, run.State)

	// A third transaction waits for the second's running task on cmp,
	// also when the worker would run it (master_shell, the local jig).
	third, _ := f.Plan(t)
	thirdSetup := f.RunsByLabel(t, third)["setup@"+storetest.CmpName].ID
	_, err = f.Store.DispatchRun(f.Ctx, thirdSetup, []byte("t"))
	require.ErrorAs(t, err, &busy)
	assert.Contains(t, busy.Reason, "(setup) is running")
	_, _, err = f.Store.StartLocalRun(f.Ctx, thirdSetup)
	require.ErrorAs(t, err, &busy)
}
