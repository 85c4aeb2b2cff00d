package models_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestNodeRunsOneThingAtATime: a transaction with work on a node keeps the
// annealer away from it until the transaction ends; a noderole in
// transition keeps a transaction's run from being dispatched there, and a
// running task keeps another transaction's run waiting; other nodes are
// not held up.
func TestNodeRunsOneThingAtATime(t *testing.T) {
	f := newFixture(t)
	first, _ := f.plan(t)
	runs := f.runsByLabel(t, first)

	snap, err := f.store.ProposeSnapshot(f.ctx, f.dep.Name)
	require.NoError(t, err)
	ctl, _, err := f.store.BindRole(f.ctx, snap.ID, crowbar.BindInput{Node: ctlName, Role: "controller"})
	require.NoError(t, err)
	_, err = f.store.CommitSnapshot(f.ctx, snap.ID)
	require.NoError(t, err)

	// The transaction still has runs to do on ctl: the annealer waits.
	next, err := f.store.NextNodeRoles(f.ctx, f.dep.ID, 0)
	require.NoError(t, err)
	assert.Empty(t, next)
	_, err = f.store.TransitionNodeRole(f.ctx, ctl.ID)
	conflict := requireConflict(t, err)
	assert.Contains(t, conflict.Reason, "transaction "+first.ID.String()+" has work on it")

	for _, r := range runs {
		require.NoError(t, f.store.SucceedNoOp(f.ctx, r.ID))
	}
	_, err = f.store.FinishTransaction(f.ctx, first.ID, false, "")
	require.NoError(t, err)
	next, err = f.store.NextNodeRoles(f.ctx, f.dep.ID, 0)
	require.NoError(t, err)
	require.Len(t, next, 1)
	assert.Equal(t, ctl.ID, next[0].ID)
	_, err = f.store.TransitionNodeRole(f.ctx, ctl.ID)
	require.NoError(t, err)

	// Now the noderole holds ctl: a new transaction's run there waits,
	// cmp's goes.
	second, _ := f.plan(t)
	runs = f.runsByLabel(t, second)
	_, err = f.store.DispatchRun(f.ctx, runs["setup@"+ctlName].ID, []byte("t"))
	var busy *models.NodeBusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, ctlName, busy.Node)
	assert.Contains(t, busy.Reason, "(controller) is in transition")
	_, err = f.store.DispatchRun(f.ctx, runs["setup@"+cmpName].ID, []byte("t"))
	require.NoError(t, err)

	// The noderole's own run is not held up by its transition.
	plan, err := f.store.PrepareNodeRoleRun(f.ctx, ctl.ID, 1)
	require.NoError(t, err)
	_, err = f.store.DispatchRun(f.ctx, plan.RunID, []byte("t"))
	require.NoError(t, err)
	_, err = f.store.FinishNodeRoleRun(f.ctx, ctl.ID, 1, true, "")
	require.NoError(t, err)
	run, err := f.store.DispatchRun(f.ctx, runs["setup@"+ctlName].ID, []byte("t"))
	require.NoError(t, err, "the node is free once the noderole ended")
	assert.Equal(t, contract.RunRunning, run.State)

	// A third transaction waits for the second's running task on cmp,
	// also when the worker would run it (master_shell, the local jig).
	third, _ := f.plan(t)
	thirdSetup := f.runsByLabel(t, third)["setup@"+cmpName].ID
	_, err = f.store.DispatchRun(f.ctx, thirdSetup, []byte("t"))
	require.ErrorAs(t, err, &busy)
	assert.Contains(t, busy.Reason, "(setup) is running")
	_, _, err = f.store.StartLocalRun(f.ctx, thirdSetup)
	require.ErrorAs(t, err, &busy)
}
