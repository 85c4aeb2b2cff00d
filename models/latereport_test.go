package models_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestLateReportIsRefused: a result for a run that already failed without
// a report (its activity timed out) is refused, not taken as a repeat.
func TestLateReportIsRefused(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	run, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token"))
	require.NoError(t, err)
	require.NoError(t, f.Store.FailRun(f.Ctx, setup.ID, "no result from the node's agent: heartbeat timeout", nil))
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: run.Attempt})
	storetest.RequireConflict(t, err)
	got := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	require.Equal(t, contract.RunFailed, got.State, "the late result changed nothing")
}
