package fuel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// listen subscribes to the live events and returns those that arrive until
// none has for a moment.
func listen(t *testing.T, url string) func() []map[string]any {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+models.EventsChannel)
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
			events := listen(t, url)
			txn, err := store.CreateTransaction(ctx, fuel.ExecuteInput{Deployment: dep.Name, Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
				func(*fuel.Transaction) error { return nil })
			require.NoError(t, err)
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
