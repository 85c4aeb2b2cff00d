package fuel_test

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

// TestRunsPageOfALargeTransaction pages through the runs of a 20,000-run
// transaction: each page is an index range scan (checked with EXPLAIN),
// pages join up without gaps or repeats, and the time of a page is printed.
func TestRunsPageOfALargeTransaction(t *testing.T) {
	f := storetest.NewFixture(t)
	txn := f.Execute(t, fuel.ExecuteInput{DryRun: true})
	const n = 20000
	// 20 graphs x 100 nodes x 10 positions, inserted in one statement.
	start := time.Now()
	err := f.Store.DB.Exec(`INSERT INTO task_runs (transaction_id, graph_index, graph_type, node_id, node_name, task_name, task_type, position, spec, state)
		SELECT ?, g, 'deployment', ?, 'node-' || lpad(nd::text, 3, '0') || '.anneal.test', 'task-' || p || '-' || nd, 'shell', p, '{}', 'planned'
		FROM generate_series(0, 19) g, generate_series(1, 100) nd, generate_series(1, 10) p`, txn.ID, f.Ctl.ID).Error
	require.NoError(t, err)
	require.NoError(t, f.Store.DB.Exec("ANALYZE task_runs").Error)
	t.Logf("inserted %d runs in %s", n, time.Since(start).Round(time.Millisecond))

	var plan []string
	require.NoError(t, f.Store.DB.Raw(`EXPLAIN SELECT * FROM task_runs WHERE transaction_id = ?
		AND (graph_index, position, node_name, id) > (?, ?, ?, ?) ORDER BY graph_index, position, node_name, id LIMIT 101`,
		txn.ID, 10, 5, "node-050.anneal.test", 0).Scan(&plan).Error)
	t.Logf("plan of a page:\n%s", strings.Join(plan, "\n"))
	assert.Contains(t, strings.Join(plan, "\n"), "task_runs_tx_order_idx", "a page of runs reads the keyset index")
	assert.NotContains(t, strings.Join(plan, "\n"), "Sort", "the index gives the order: no sort of the whole transaction")

	seen := map[int64]bool{}
	cursor := ""
	var slowest time.Duration
	pages := 0
	var prev *models.TaskRun
	for {
		t0 := time.Now()
		runs, next, err := f.Store.RunsPage(f.Ctx, txn.ID, fuel.RunFilter{}, models.Page{Limit: 1000, Cursor: cursor})
		took := time.Since(t0)
		require.NoError(t, err)
		slowest = max(slowest, took)
		pages++
		for i := range runs {
			r := &runs[i]
			require.False(t, seen[r.ID], "run %d on two pages", r.ID)
			seen[r.ID] = true
			if prev != nil {
				require.True(t, prev.GraphIndex < r.GraphIndex || prev.GraphIndex == r.GraphIndex &&
					(prev.Position < r.Position || prev.Position == r.Position && prev.NodeName < r.NodeName),
					"plan order: %+v then %+v", prev, r)
			}
			prev = r
		}
		if next == "" {
			break
		}
		cursor = next
	}
	assert.Len(t, seen, n, "every run on exactly one page")
	assert.Equal(t, n/1000, pages)

	// A page of 100 deep inside (the API's default size).
	t0 := time.Now()
	runs, _, err := f.Store.RunsPage(f.Ctx, txn.ID, fuel.RunFilter{}, models.Page{Limit: 100, Cursor: cursor})
	require.NoError(t, err)
	t.Logf("20,000 runs: slowest page of 1,000 took %s; a page of %d deep inside took %s", slowest.Round(time.Microsecond), len(runs), time.Since(t0).Round(time.Microsecond))
	// Generous: the figure above is what matters; this catches a full scan
	// with a sort gone quadratic, not a slow machine.
	assert.Less(t, slowest, 2*time.Second)

	_, _, err = f.Store.RunsPage(f.Ctx, txn.ID, fuel.RunFilter{}, models.Page{Limit: 10, Cursor: "not-a-cursor"})
	storetest.RequireInput(t, err, "cursor")
}
