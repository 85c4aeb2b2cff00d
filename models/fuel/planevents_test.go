package fuel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// listen subscribes to the live events, holding a listener's lease so
// that they are announced (migration 0028), and returns those that arrive
// until none has for a moment.
func listen(t *testing.T, store *storetest.Stores, url string) func() []map[string]any {
	t.Helper()
	ctx := context.Background()
	conn := storetest.Listen(t, url, models.EventsChannel)
	_, err := store.HoldEventListener(ctx, t.Name(), time.Hour)
	require.NoError(t, err)
	return func() []map[string]any {
		var out []map[string]any
		for {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return out
			}
			var ev map[string]any
			require.NoError(t, json.Unmarshal([]byte(n.Payload), &ev))
			out = append(out, ev)
		}
	}
}

// runEvents keeps the run events ("run" and "runs") of one transaction.
func runEvents(evs []map[string]any, txn string) []map[string]any {
	var out []map[string]any
	for _, e := range evs {
		if (e["kind"] == "run" && e["transaction"] == txn) || (e["kind"] == "runs" && e["id"] == txn) {
			out = append(out, e)
		}
	}
	return out
}

// deploymentTransaction creates a transaction of dep's deployment graph,
// not yet planned, with no workflow started.
func deploymentTransaction(t *testing.T, store *storetest.Stores, dep *models.Deployment) *fuel.Transaction {
	t.Helper()
	txn, err := store.CreateTransaction(context.Background(), fuel.ExecuteInput{Deployment: dep.Name, Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
		func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	return txn
}

// chainDeployment is a deployment of nodes each running a chain of tasks
// (deployment graph), with a fresh database of its own and its URL.
func chainDeployment(t *testing.T, nodes, tasks int) (*storetest.Stores, string, *models.Deployment) {
	t.Helper()
	store, url := storetest.Open(t)
	ctx := context.Background()
	var b strings.Builder
	b.WriteString("name: chain\nversion: \"1\"\nroles_metadata:\n  worker: {tags: [worker]}\ngraphs:\n  deployment:\n    tasks:\n")
	for i := 1; i <= tasks; i++ {
		fmt.Fprintf(&b, "      - id: t%02d\n        tags: [worker]\n        parameters: {cmd: \"echo %d\"}\n", i, i)
		if i > 1 {
			fmt.Fprintf(&b, "        requires: [t%02d]\n", i-1)
		}
	}
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(b.String()), &spec))
	_, err := store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	dep, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "chain", Release: "chain"})
	require.NoError(t, err)
	for i := range nodes {
		name := fmt.Sprintf("w%02d.anneal.test", i)
		_, _, err := store.CreateNode(ctx, models.NodeInput{Name: name}, true)
		require.NoError(t, err)
		roles, depName := []string{"worker"}, dep.Name
		_, err = store.UpdateNode(ctx, name, models.NodeUpdate{Deployment: &depName, Roles: &roles})
		require.NoError(t, err)
	}
	return store, url, dep
}

// Planning copies its runs in one statement: a large plan is announced as
// one "runs" event with its count (migration 0025 counts them in the
// trigger's transition table), a small one run by run; either way its
// runs are numbered in plan order, with their edges.
func TestPlanEventsAndOrder(t *testing.T) {
	for _, tc := range []struct{ nodes, tasks int }{
		{11, 20}, // 220 runs: more than the 200 announced one by one
		{2, 3},
	} {
		t.Run(fmt.Sprintf("%dx%d", tc.nodes, tc.tasks), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, url, dep := chainDeployment(t, tc.nodes, tc.tasks)
			events := listen(t, store, url)
			txn := deploymentTransaction(t, store, dep)
			gp, err := store.PlanGraph(ctx, txn.ID, 0)
			require.NoError(t, err)
			n := tc.nodes * tc.tasks
			require.Equal(t, n, gp.Runs)

			var runs []models.TaskRun
			require.NoError(t, store.DB.Where("transaction_id = ?", txn.ID).Order("position").Find(&runs).Error)
			require.Len(t, runs, n)
			for i, r := range runs {
				assert.Equal(t, i, r.Position)
				assert.Equal(t, contract.RunPending, r.State)
				assert.Equal(t, map[string]string{}, r.Outputs)
				assert.NotEmpty(t, r.InputsBase)
				assert.Equal(t, r.NodeName, r.AttrsIn["anneal"].(map[string]any)["node"])
				assert.False(t, r.CreatedAt.IsZero())
				if i > 0 {
					assert.Greater(t, r.ID, runs[i-1].ID, "ids follow the plan order")
				}
			}
			edges := storetest.Count(t, store, &models.RunEdge{}, "child_id IN (SELECT id FROM task_runs WHERE transaction_id = ?)", txn.ID)
			assert.Equal(t, int64(tc.nodes*(tc.tasks-1)), edges)

			got := runEvents(events(), txn.ID.String())
			if n > 200 {
				require.Len(t, got, 1, "one event for the whole plan: %v", got)
				assert.Equal(t, map[string]any{"kind": "runs", "id": txn.ID.String(), "deployment_id": float64(dep.ID),
					"state": "changed", "count": float64(n)}, got[0])
				return
			}
			require.Len(t, got, n, "one event per run: %v", got)
			for i, e := range got {
				assert.Equal(t, "run", e["kind"])
				assert.Equal(t, float64(runs[i].ID), e["id"], "in id order")
				assert.Equal(t, contract.RunPending, e["state"])
				assert.Equal(t, float64(dep.ID), e["deployment_id"])
				assert.Equal(t, runs[i].TaskName, e["task"])
			}
		})
	}
}

// Run updates are announced from the trigger's transition tables (migration
// 0026): a changed state or attempt is one "run" event with the run's
// fields, in id order; an update that changes neither (an acknowledgement,
// a claim) sends none; more than 200 changed runs in one statement are one
// "runs" event per transaction with their count.
func TestRunUpdateEvents(t *testing.T) {
	ctx := context.Background()
	store, url, dep := chainDeployment(t, 11, 20)
	txn := deploymentTransaction(t, store, dep)
	_, err := store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	var runs []models.TaskRun
	require.NoError(t, store.DB.Where("transaction_id = ?", txn.ID).Order("id").Find(&runs).Error)
	require.Len(t, runs, 220)
	events := listen(t, store, url)
	exec := func(sql string, args ...any) {
		t.Helper()
		require.NoError(t, store.DB.Exec(sql, args...).Error)
	}

	exec(`UPDATE task_runs SET state = 'running', attempt = attempt + 1 WHERE id = ?`, runs[0].ID)
	exec(`UPDATE task_runs SET acked_at = now() WHERE id = ?`, runs[0].ID)
	exec(`UPDATE task_runs SET updated_at = now(), state = CASE WHEN id = ? THEN state ELSE 'blocked' END WHERE id IN ?`,
		runs[1].ID, []int64{runs[3].ID, runs[1].ID, runs[2].ID})
	got := runEvents(events(), txn.ID.String())
	require.Len(t, got, 3, "the dispatch, then the two runs blocked; nothing for the acknowledgement or the unchanged run: %v", got)
	assert.Equal(t, map[string]any{"kind": "run", "id": float64(runs[0].ID), "deployment_id": float64(dep.ID),
		"state": contract.RunRunning, "transaction": txn.ID.String(), "noderole": nil, "node": runs[0].NodeName,
		"task": runs[0].TaskName, "graph": float64(0), "attempt": float64(1)}, got[0])
	for i, r := range runs[2:4] {
		assert.Equal(t, float64(r.ID), got[i+1]["id"], "in id order")
		assert.Equal(t, contract.RunBlocked, got[i+1]["state"])
	}

	exec(`UPDATE task_runs SET state = 'cancelled' WHERE transaction_id = ? AND state = 'pending'`, txn.ID)
	got = runEvents(events(), txn.ID.String())
	require.Len(t, got, 1, "one event for a large statement: %v", got)
	assert.Equal(t, map[string]any{"kind": "runs", "id": txn.ID.String(), "deployment_id": float64(dep.ID),
		"state": "changed", "count": float64(220 - 3)}, got[0])
}

// A large plan refreshes the planner statistics of runs and edges at once
// (a small one leaves them to autovacuum): the planner then finds a node's
// runs by index, not by scanning the whole transaction.
func TestLargePlanAnalyzed(t *testing.T) {
	ctx := context.Background()
	reltuples := func(store *storetest.Stores, table string) float64 {
		var n float64
		require.NoError(t, store.DB.Raw("SELECT reltuples FROM pg_class WHERE relname = ?", table).Scan(&n).Error)
		return n
	}
	for _, tc := range []struct {
		nodes, tasks int
		analyzed     bool
	}{{25, 20, true}, {2, 3, false}} {
		store, _, dep := chainDeployment(t, tc.nodes, tc.tasks)
		txn := deploymentTransaction(t, store, dep)
		gp, err := store.PlanGraph(ctx, txn.ID, 0)
		require.NoError(t, err)
		require.Equal(t, tc.nodes*tc.tasks, gp.Runs)
		if tc.analyzed {
			assert.Equal(t, float64(tc.nodes*tc.tasks), reltuples(store, "task_runs"))
			assert.Equal(t, float64(tc.nodes*(tc.tasks-1)), reltuples(store, "run_edges"))
		} else {
			assert.Less(t, reltuples(store, "task_runs"), float64(1), "left to autovacuum")
			continue
		}
		// A plan as large as the table the statistics know doubles it:
		// analyzed again. One smaller than that is left to autovacuum.
		for i, known := range []float64{2 * float64(gp.Runs), 2 * float64(gp.Runs)} {
			require.NoError(t, store.DB.Exec("UPDATE transactions SET status = ? WHERE id = ?", models.TxReady, txn.ID).Error)
			txn = deploymentTransaction(t, store, dep)
			_, err := store.PlanGraph(ctx, txn.ID, 0)
			require.NoError(t, err)
			assert.Equal(t, known, reltuples(store, "task_runs"), "plan %d", i+2)
		}
	}
}

// A node workflow's start finds its node's runs' edges by index from both
// ends (run_edges_child_idx, run_edges' primary key), also from a cached
// generic plan on a site with history, its edges not yet vacuumed: not by
// reading all of run_edges, every transaction's, at each node's start.
func TestNodePlanFindsEdgesByIndex(t *testing.T) {
	ctx := context.Background()
	store, _, dep := chainDeployment(t, 50, 20)
	var txn *fuel.Transaction
	for range 4 {
		if txn != nil {
			require.NoError(t, store.DB.Exec("UPDATE transactions SET status = ? WHERE id = ?", models.TxReady, txn.ID).Error)
		}
		txn = deploymentTransaction(t, store, dep)
		_, err := store.PlanGraph(ctx, txn.ID, 0)
		require.NoError(t, err)
	}
	require.NoError(t, store.DB.Exec("ANALYZE task_runs, run_edges").Error)
	var node int64
	require.NoError(t, store.DB.Raw("SELECT node_id FROM task_runs WHERE transaction_id = ? LIMIT 1", txn.ID).Scan(&node).Error)
	for _, start := range []bool{true, false} {
		sql := strings.NewReplacer("@tx", "$1", "@gi", "$2", "@node", "$3").Replace(fuel.NodePlanSQL(start))
		plan := storetest.ExplainGeneric(t, store.DB, "EXPLAIN", sql, "(uuid, int, bigint)", fmt.Sprintf("('%s', 0, %d)", txn.ID, node))
		text := strings.Join(plan, "\n")
		assert.NotContains(t, text, "Seq Scan on run_edges", "start %v:\n%s", start, text)
		assert.Contains(t, text, "run_edges_child_idx", "start %v", start)
		assert.Contains(t, text, "run_edges_pkey", "start %v", start)
	}
}
