package models_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestLateReportIsRefused: a result for a run that already failed without
// a report (its activity timed out) is refused, not taken as a repeat.
func TestLateReportIsRefused(t *testing.T) {
	f := newFixture(t)
	txn, _ := f.plan(t)
	setup := f.runsByLabel(t, txn)["setup@"+ctlName]
	run, err := f.store.DispatchRun(f.ctx, setup.ID, []byte("token"))
	require.NoError(t, err)
	require.NoError(t, f.store.FailRun(f.ctx, setup.ID, "no result from the node's agent: heartbeat timeout", nil))
	_, err = f.store.RecordRunResult(f.ctx, f.ctl.ID, setup.ID, protocol.RunResult{Attempt: run.Attempt})
	requireConflict(t, err)
	got := f.runsByLabel(t, txn)["setup@"+ctlName]
	require.Equal(t, contract.RunFailed, got.State, "the late result changed nothing")
}
