package fuel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
)

// A chain of ten short runs goes out whole after its first run's report:
// the answer hands its nine other runs ahead (its next and eight more),
// so its results come back in two reports, not three.
func TestChainOfTenHandedOutAfterItsFirstReport(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 1, 10)
	txn := deploymentTransaction(t, store, dep)
	_, err := store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	var runs []models.TaskRun
	require.NoError(t, store.DB.Where("transaction_id = ?", txn.ID).Order("position").Find(&runs).Error)
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
