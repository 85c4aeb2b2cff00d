package models_test

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestClaimLease: a run handed to an agent and never acknowledged (the
// answer was lost) is offered again once its lease has passed, with the
// same attempt; an acknowledged one is not, and neither is a run the worker
// executes itself.
func TestClaimLease(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	runs := f.RunsByLabel(t, txn)
	setup := runs["setup@"+storetest.CtlName]
	const lease = 300 * time.Millisecond

	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	next, err := f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	assert.True(t, next.IsZero(), "nothing handed out yet")

	claimed, next, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, false)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.True(t, next.IsZero(), "a poll that claims has no next offer to wait for")
	assert.Equal(t, 1, claimed[0].Attempt)
	assert.Equal(t, setup.ID, claimed[0].ID)
	assert.Equal(t, storetest.CtlName, claimed[0].NodeName)
	assert.Equal(t, setup.Spec, claimed[0].Spec, "the claimed run comes whole")
	// The one query that claims nothing answers when to look again, as
	// NextOffer does.
	again, polled, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, false)
	require.NoError(t, err)
	assert.Empty(t, again, "within the lease the run is not offered again")
	next, err = f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	require.False(t, next.IsZero())
	assert.WithinDuration(t, time.Now().Add(lease), next, 2*time.Second)
	assert.True(t, polled.Equal(next), "claim's next offer %v, NextOffer's %v", polled, next)
	other, otherNext, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Cmp.ID, lease, false)
	require.NoError(t, err)
	assert.Empty(t, other)
	assert.True(t, otherNext.IsZero(), "another node has nothing handed out")

	// The lease passes without an acknowledgement: offered again, same
	// attempt (the agent's record makes a second delivery harmless).
	require.Eventually(t, func() bool {
		again, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
		require.NoError(t, err)
		return len(again) == 1
	}, 5*time.Second, 50*time.Millisecond, "an unacknowledged run is offered again after its lease")
	assert.Equal(t, setup.ID, again[0].ID)
	assert.Equal(t, 1, again[0].Attempt)

	// Another node cannot acknowledge it; a stale attempt is a conflict; an
	// impossible one is bad input.
	_, err = f.Store.AckRun(f.Ctx, f.Cmp.ID, setup.ID, 1)
	assert.ErrorIs(t, err, models.ErrForbidden)
	_, err = f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID+1000, 1)
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, 2)
	storetest.RequireConflict(t, err)
	in := storetest.RequireInput(t, mustErr(f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, math.MaxInt32+1)), "attempt")
	assert.Equal(t, http.StatusBadRequest, in.Status)

	// Acknowledged: never offered again, however long one waits.
	acked, err := f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, 1)
	require.NoError(t, err)
	assert.Equal(t, contract.RunRunning, acked.State)
	// What the API heartbeats the run's activity with.
	assert.Equal(t, setup.ID, acked.ID)
	assert.Equal(t, 1, acked.Attempt)
	assert.Equal(t, again[0].TaskToken, acked.TaskToken)
	assert.NotEmpty(t, acked.TaskToken)
	assert.Equal(t, again[0].TaskName, acked.TaskName)
	assert.Equal(t, again[0].NodeName, acked.NodeName)
	_, err = f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, 1)
	require.NoError(t, err, "a repeated acknowledgement is harmless")
	time.Sleep(2 * lease)
	again, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
	require.NoError(t, err)
	assert.Empty(t, again, "an acknowledged run is delivered")
	next, err = f.Store.NextOffer(f.Ctx, f.Ctl.ID)
	require.NoError(t, err)
	assert.True(t, next.IsZero())

	// A new attempt starts unacknowledged again; its result is its
	// acknowledgement too.
	assert.Nil(t, claimedThenReported(t, f, setup.ID, 2, lease, false).AckedAt)
	// Acknowledging a finished run returns it as it is.
	done, err := f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, 2)
	require.NoError(t, err)
	assert.Equal(t, contract.RunSucceeded, done.State)
}

// TestClaimAsAcknowledged: a poll that needs no ack (the agent's
// protocol.WorkAheadParam) takes the runs it claims as acknowledged, as a
// hand-back is (acked_at = claimed_at), but not for good: one whose answer
// was lost is offered again once its lease has passed, with the same
// attempt, until the agent's first run heartbeat (AckRun) or its result
// confirms it. Meanwhile it counts as delivered (RunDelivery), as a
// hand-back does: the agent may have started it.
func TestClaimAsAcknowledged(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	const lease = 300 * time.Millisecond
	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)

	claimed, _, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, true)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.NotNil(t, claimed[0].AckedAt, "taken as acknowledged")
	assert.True(t, claimed[0].AckedAt.Equal(*claimed[0].ClaimedAt), "acked_at = claimed_at: not confirmed")
	d, err := f.Store.RunDelivery(f.Ctx, setup.ID)
	require.NoError(t, err)
	assert.True(t, d.Acked)
	again, next, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, true)
	require.NoError(t, err)
	assert.Empty(t, again, "within the lease it is not offered again")
	assert.WithinDuration(t, time.Now().Add(lease), next, 2*time.Second, "the poll looks again when the lease ends")

	// The answer was lost: offered again after the lease, same attempt,
	// still taken as acknowledged, to a poll that asks either way.
	require.Eventually(t, func() bool {
		again, err = f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
		require.NoError(t, err)
		return len(again) == 1
	}, 5*time.Second, 50*time.Millisecond, "an unconfirmed run is offered again after its lease")
	assert.Equal(t, 1, again[0].Attempt)
	require.NotNil(t, again[0].AckedAt)
	assert.True(t, again[0].AckedAt.Equal(*again[0].ClaimedAt))

	// The first run heartbeat confirms it: never offered again.
	acked, err := f.Store.AckRun(f.Ctx, f.Ctl.ID, setup.ID, 1)
	require.NoError(t, err)
	assert.Equal(t, contract.RunRunning, acked.State)
	time.Sleep(2 * lease)
	again, next, err = f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, true)
	require.NoError(t, err)
	assert.Empty(t, again, "a confirmed run is delivered")
	assert.True(t, next.IsZero())

	// So does a result, for a run too short to heartbeat.
	assert.NotNil(t, claimedThenReported(t, f, setup.ID, 2, lease, true).AckedAt)
}

// claimedThenReported dispatches attempt of run, has the node's agent
// claim it (asAcked: as a poll with protocol.WorkAheadParam does) and
// report its result, and checks that it is not offered again, however
// long one waits. It returns the run as claimed.
func claimedThenReported(t *testing.T, f *storetest.Fixture, runID int64, attempt int, lease time.Duration, asAcked bool) models.TaskRun {
	t.Helper()
	_, err := f.Store.DispatchRun(f.Ctx, runID, []byte(fmt.Sprintf("token-%d", attempt)))
	require.NoError(t, err)
	claimed, _, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, lease, asAcked)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, attempt, claimed[0].Attempt)
	_, err = f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, runID, protocol.RunResult{Attempt: attempt})
	require.NoError(t, err)
	time.Sleep(2 * lease)
	again, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, lease)
	require.NoError(t, err)
	assert.Empty(t, again, "attempt %d, reported, is not offered again", attempt)
	return claimed[0]
}

// TestClaimLeaseSkipsWorkerRuns: a run the worker executes for a node
// (claimed when it starts, without a lease) never reaches the agent.
func TestClaimLeaseSkipsWorkerRuns(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	_, _, err := f.Store.StartLocalRun(f.Ctx, setup.ID)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	claimed, err := f.Store.ClaimWork(f.Ctx, f.Ctl.ID, time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, claimed)
}

// TestRecordRunResultRanges: numbers and times that do not fit are bad
// input naming the field (400), never a database error.
func TestRecordRunResultRanges(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, nil)
	require.NoError(t, err)
	tests := []struct {
		field string
		res   protocol.RunResult
	}{
		{"attempt", protocol.RunResult{Attempt: math.MaxInt32 + 1}},
		{"attempt", protocol.RunResult{Attempt: -1}},
		{"attempt", protocol.RunResult{}},
		{"exit_code", protocol.RunResult{Attempt: 1, ExitCode: math.MaxInt32 + 1}},
		{"exit_code", protocol.RunResult{Attempt: 1, ExitCode: math.MinInt32 - 1}},
		{"started_at", protocol.RunResult{Attempt: 1, StartedAt: time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)}},
		{"finished_at", protocol.RunResult{Attempt: 1, FinishedAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)}},
	}
	for _, tt := range tests {
		_, err := f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, tt.res)
		in := storetest.RequireInput(t, err, tt.field)
		assert.Equal(t, http.StatusBadRequest, in.Status)
	}
	got := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	assert.Equal(t, contract.RunRunning, got.State, "nothing was recorded")
	rec, err := f.Store.RecordRunResult(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: 1, ExitCode: math.MinInt32})
	require.NoError(t, err)
	assert.Equal(t, contract.RunFailed, rec.Run.State)
}

func mustErr(_ any, err error) error { return err }

// The agents' work queries find a node's runs by index also from a cached
// generic plan (their state is a literal), now that no index of their own
// stands in the way of HOT acknowledgements (migration 0027).
func TestWorkQueriesUseAnIndex(t *testing.T) {
	f := storetest.NewFixture(t)
	for _, q := range []struct {
		sql          string
		params, args string
	}{
		{models.ClaimWorkSQL(), "(float8, boolean, bigint)", "(5, true, 1)"},
		{models.NextOfferSQL(), "(bigint)", "(1)"},
		{models.ClaimOrNextOfferSQL(), "(float8, boolean, bigint, bigint)", "(5, true, 1, 1)"}, // @node twice
	} {
		plan := storetest.ExplainGeneric(t, f.Store.DB, "EXPLAIN", q.sql, q.params, q.args, "SET enable_seqscan = off")
		assert.Contains(t, strings.Join(plan, "\n"), "task_runs_node_unfinished_idx", "%s", q.sql)
	}
}

// TestPollPlansOnce: the poll's statement runs with its generic plan,
// planned once on a connection, whatever the statistics say: left to
// choose after an ANALYZE of many runs, Postgres planned it anew at about
// every second call.
func TestPollPlansOnce(t *testing.T) {
	f := storetest.NewFixture(t)
	sqlDB, err := f.Store.DB.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1) // every poll on the connection asked below
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	_, err = f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	require.NoError(t, f.Store.DB.Exec("ANALYZE task_runs").Error)

	for i := range 7 {
		claimed, next, err := f.Store.ClaimWorkOrNextOffer(f.Ctx, f.Ctl.ID, time.Minute, false)
		require.NoError(t, err)
		if i == 0 {
			require.Len(t, claimed, 1, "the first poll claims the run")
			assert.Equal(t, setup.ID, claimed[0].ID)
		} else {
			assert.Empty(t, claimed, "within its lease the run is not offered again")
			assert.False(t, next.IsZero(), "and the poll says when it is")
		}
	}
	var plans struct{ GenericPlans, CustomPlans int64 }
	require.NoError(t, f.Store.DB.Raw(`SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = ?`,
		models.ClaimOrNextOfferSQL()).Scan(&plans).Error)
	assert.Equal(t, int64(0), plans.CustomPlans, "never planned for its arguments' values")
	assert.Equal(t, int64(7), plans.GenericPlans, "the generic plan serves each poll")
}
