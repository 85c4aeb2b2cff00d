package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/fuel"
)

// TestBenchPlanOnlyPlansTheBenchGraph: `dev bench --plan-only` plans what
// the bench runs: a chain of every task on every node, the anchor node
// first (the others wait for its middle task), each run pending.
func TestBenchPlanOnlyPlansTheBenchGraph(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := testenv.Store(t)
	const nodes, tasks = 4, 6
	require.NoError(t, benchPlanSetup(ctx, store, nodes, tasks, true))
	plans := fuel.New(store)
	for round := range 2 { // one plan per round, each of a new transaction
		id, err := executeBenchGraph(ctx, plans)
		require.NoError(t, err)
		gp, err := plans.PlanGraph(ctx, id, 0)
		require.NoError(t, err, "round %d", round)
		assert.Equal(t, nodes*tasks, gp.Runs)
		require.Len(t, gp.Nodes, nodes)
		assert.Equal(t, "bench-001.anneal.test", gp.Nodes[0].Name, "the anchor starts first")
		for _, n := range gp.Nodes {
			assert.Equal(t, tasks, n.Runs, n.Name)
		}
		status, err := plans.TransactionStatus(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"pending": nodes * tasks}, status.Counts, "forced: LCM skips nothing")
	}
}
