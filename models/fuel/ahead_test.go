package fuel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
)

// A chain of ten short runs goes out whole after its first run's report:
// the answer hands its nine other runs ahead (its next and eight more),
// so its results come back in two reports, not three.
func TestChainOfTenHandedOutAfterItsFirstReport(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 1, 10)
	_, runs := planned(t, store, dep)
	require.Len(t, runs, 10)
	ids := make([]int64, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	first, err := store.DispatchChain(ctx, ids, []byte("token"))
	require.NoError(t, err)
	require.NotNil(t, first)
	_, err = store.AckRun(ctx, first.NodeID, first.ID, first.Attempt)
	require.NoError(t, err)

	now := time.Now()
	rep, err := store.ReportRuns(ctx, first.NodeID, protocol.RunResults{Results: []protocol.RunReport{{RunID: first.ID,
		RunResult: protocol.RunResult{Attempt: first.Attempt, StartedAt: now.Add(-10 * time.Millisecond), FinishedAt: now}}}},
		time.Minute, models.MaxAheadRuns)
	require.NoError(t, err)
	require.NotNil(t, rep.Next)
	got := []int64{rep.Next.ID}
	for _, r := range rep.Ahead {
		got = append(got, r.ID)
	}
	assert.Equal(t, ids[1:], got, "the chain's nine other runs, in order")
}

// A chain that starts its graph goes ahead with its first run's
// acknowledgement when that task was short on the node the last time (an
// earlier transaction), and not when it was long: no run of the graph has
// finished yet to tell.
func TestChainStartingAGraphGoesAheadAfterAShortLastTime(t *testing.T) {
	ctx := context.Background()
	const short = 100 * time.Millisecond
	for _, tc := range []struct {
		lastTime time.Duration
		ahead    int
	}{{10 * time.Millisecond, 2}, {time.Second, 0}} {
		store, _, dep := chainDeployment(t, 1, 3)
		first, _ := planned(t, store, dep)
		// Failed, so that LCM skips none of them this time.
		require.NoError(t, store.DB.Exec(`UPDATE task_runs SET state = 'failed', started_at = now() - interval '1 min',
  finished_at = now() - interval '1 min' + make_interval(secs => ?) WHERE transaction_id = ?`, tc.lastTime.Seconds(), first.ID).Error)
		require.NoError(t, store.DB.Exec("UPDATE transactions SET status = ? WHERE id = ?", models.TxReady, first.ID).Error)

		_, runs := planned(t, store, dep)
		require.Len(t, runs, 3)
		run, err := store.DispatchChain(ctx, []int64{runs[0].ID, runs[1].ID, runs[2].ID}, []byte("token"))
		require.NoError(t, err)
		require.Equal(t, runs[0].ID, run.ID)
		_, err = store.AckRun(ctx, run.NodeID, run.ID, run.Attempt)
		require.NoError(t, err)
		ahead, err := store.HandAhead(ctx, run.NodeID, run.ID, run.Attempt, time.Minute, short, models.MaxAheadRuns)
		require.NoError(t, err)
		assert.Len(t, ahead, tc.ahead, "t01 took %s the last time", tc.lastTime)
	}
}

// planned plans a new transaction of dep's deployment graph and returns
// it with its runs in plan order.
func planned(t *testing.T, store *storetest.Stores, dep *models.Deployment) (*fuel.Transaction, []models.TaskRun) {
	t.Helper()
	txn := deploymentTransaction(t, store, dep)
	_, err := store.PlanGraph(context.Background(), txn.ID, 0)
	require.NoError(t, err)
	var runs []models.TaskRun
	require.NoError(t, store.DB.Where("transaction_id = ?", txn.ID).Order("position").Find(&runs).Error)
	return txn, runs
}
