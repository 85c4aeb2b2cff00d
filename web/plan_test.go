package web_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// planAnswer is the answer to an execute with the plan and the check.
type planAnswer struct {
	TaskUUID string                `json:"task_uuid"`
	Status   string                `json:"status"`
	Plan     *fuel.TransactionPlan `json:"plan"`
	PlanURL  string                `json:"plan_url"`
	Check    *fuel.DeploymentCheck `json:"check"`
}

func executePlan(t *testing.T, st *testenv.Stack, body any) planAnswer {
	t.Helper()
	var out planAnswer
	status, raw := st.Do(t, http.MethodPost, "/api/v1/graphs/execute", body, &out)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	require.NotEmpty(t, out.TaskUUID, "%s", raw)
	return out
}

// planNode finds a node of a graph's plan by name.
func planNode(t *testing.T, g fuel.GraphPlan, name string) fuel.PlanNode {
	t.Helper()
	for _, n := range g.PlanNodes {
		if n.Name == name {
			return n
		}
	}
	require.Failf(t, "no such node in the plan", "%s in %+v", name, g.PlanNodes)
	return fuel.PlanNode{}
}

func planTaskNames(ts []fuel.PlanTask) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, t.Task)
	}
	return out
}

// A dry run answers with the plan itself: nodes, each node's tasks in
// order with its edges, the edges across nodes, and why what does not run
// is left out (LCM unchanged, filtered out, skipped type); the same plan is
// served for any transaction; the pre-deployment check comes back with
// every execute; graph.gv honours the node and task filters.
func TestDryRunPlanCheckAndFilters(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	ctl, cmp := nodeName("ctl"), nodeName("cmp")
	var ctlNode models.Node
	status, raw := st.Do(t, http.MethodGet, "/api/v1/nodes/"+ctl, nil, &ctlNode)
	require.Equal(t, http.StatusOK, status, "%s", raw)

	deploy := map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}}
	dry := map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}, "dry_run": true}
	ans := executePlan(t, st, dry)
	// The check: no node holds flaky (the broken role is not assigned); a
	// warning, the dry run went ahead.
	require.NotNil(t, ans.Check)
	assert.False(t, ans.Check.OK)
	require.Len(t, ans.Check.Warnings, 1)
	assert.Equal(t, "flaky", ans.Check.Warnings[0].Tag)

	require.NotNil(t, ans.Plan, "a dry run answers with its plan")
	assert.Equal(t, "/api/v1/transactions/"+ans.TaskUUID+"/plan", ans.PlanURL)
	require.Len(t, ans.Plan.Graphs, 1)
	g := ans.Plan.Graphs[0]
	assert.True(t, g.Planned)
	assert.Equal(t, []string{cmp, ctl}, []string{g.PlanNodes[0].Name, g.PlanNodes[1].Name}, "nodes by name")
	c := planNode(t, g, ctl)
	assert.Equal(t, []string{"base", "database", "api"}, planTaskNames(c.Tasks), "the node's tasks in order")
	assert.ElementsMatch(t, []fuel.PlanEdge{{From: "base", To: "database"}, {From: "database", To: "api"}}, c.Edges)
	for _, task := range c.Tasks {
		assert.Equal(t, contract.RunPlanned, task.State)
		assert.Empty(t, task.Skip)
	}
	m := planNode(t, g, cmp)
	assert.Equal(t, []string{"base", "hypervisor"}, planTaskNames(m.Tasks))
	assert.Equal(t, []fuel.PlanEdge{{From: "base", To: "hypervisor"}}, m.Edges)
	assert.Equal(t, []fuel.PlanEdge{{From: "api@" + ctl, To: "hypervisor@" + cmp}}, g.CrossNodeEdges)

	// The plan of any transaction: a real run, then its plan with states.
	real := executePlan(t, st, deploy)
	assert.Nil(t, real.Plan, "only a dry run waits for its plan")
	require.NotNil(t, real.Check, "the check comes back with every execute")
	require.Equal(t, models.TxReady, waitDone(t, st, real.TaskUUID, 60*time.Second).Status)
	var got fuel.TransactionPlan
	status, raw = st.Do(t, http.MethodGet, "/api/v1/transactions/"+real.TaskUUID+"/plan", nil, &got)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.False(t, got.DryRun)
	c = planNode(t, got.Graphs[0], ctl)
	for _, task := range c.Tasks {
		assert.Equal(t, contract.RunSucceeded, task.State, task.Task)
	}
	assert.Equal(t, g.CrossNodeEdges, got.Graphs[0].CrossNodeEdges)

	// The graph's on_success gave the nodes new attributes, which its tasks
	// see: one more deployment, and then nothing has changed.
	again := executePlan(t, st, deploy)
	require.Equal(t, models.TxReady, waitDone(t, st, again.TaskUUID, 60*time.Second).Status)

	// Again, filtered to base on ctl: base, which reads no outputs, is
	// unchanged since its last run (LCM); the other tasks are filtered
	// out, each saying by what.
	ans = executePlan(t, st, map[string]any{"deployment": "d1", "dry_run": true,
		"graphs": []map[string]any{{"type": "deployment", "nodes": []int64{ctlNode.ID}, "tasks": []string{"base"}}}})
	require.NotNil(t, ans.Plan)
	g = ans.Plan.Graphs[0]
	assert.Equal(t, []int64{ctlNode.ID}, g.Nodes)
	assert.Equal(t, []string{"base"}, g.Tasks)
	c = planNode(t, g, ctl)
	require.Equal(t, []string{"base"}, planTaskNames(c.Tasks))
	assert.Equal(t, contract.RunSkipped, c.Tasks[0].State)
	assert.Equal(t, fuel.SkipLCMUnchanged, c.Tasks[0].Skip)
	assert.Contains(t, c.Tasks[0].SkipReason, "its last finished run on this node, which succeeded")
	assert.ElementsMatch(t, []string{"api", "database"}, planTaskNames(c.FilteredOut))
	for _, f := range c.FilteredOut {
		assert.Equal(t, fuel.SkipFilteredOut, f.Skip)
		assert.Equal(t, "filtered out: task "+f.Task+" is not in graphs[0].tasks", f.SkipReason)
	}
	m = planNode(t, g, cmp)
	assert.Empty(t, m.Tasks)
	assert.ElementsMatch(t, []string{"base", "hypervisor"}, planTaskNames(m.FilteredOut))
	assert.Contains(t, m.FilteredOut[0].SkipReason, "is not in graphs[0].nodes")
	assert.Empty(t, g.CrossNodeEdges)
	// GET serves the same plan.
	status, raw = st.Do(t, http.MethodGet, "/api/v1/transactions/"+ans.TaskUUID+"/plan", nil, &got)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, *ans.Plan, got)

	// A task of the skipped type says so.
	ans = executePlan(t, st, map[string]any{"deployment": "d1", "dry_run": true, "graphs": []map[string]any{{"type": "special"}}})
	require.NotNil(t, ans.Plan)
	c = planNode(t, ans.Plan.Graphs[0], ctl)
	var notNow fuel.PlanTask
	for _, task := range c.Tasks {
		if task.Task == "not-now" {
			notNow = task
		}
	}
	assert.Equal(t, fuel.SkipTaskType, notNow.Skip)

	status, _ = st.Do(t, http.MethodGet, "/api/v1/transactions/00000000-0000-0000-0000-000000000000/plan", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/transactions/x/plan", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status)

	// graph.gv with the execute's filters: only the runs kept.
	dot := func(query string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, st.URL+"/api/v1/deployments/d1/graphs/deployment/graph.gv"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+st.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, full := dot("")
	require.Equal(t, http.StatusOK, status, full)
	assert.Contains(t, full, "hypervisor")
	status, filtered := dot(fmt.Sprintf("?nodes=%d&tasks=database,api", ctlNode.ID))
	require.Equal(t, http.StatusOK, status, filtered)
	assert.Contains(t, filtered, `"api@`+ctl)
	assert.Contains(t, filtered, `"database@`+ctl)
	assert.NotContains(t, filtered, "hypervisor")
	assert.NotContains(t, filtered, `"base@`)
	assert.NotContains(t, filtered, cmp)
	status, filtered = dot("?tasks=base&tasks=hypervisor")
	require.Equal(t, http.StatusOK, status, filtered)
	assert.Contains(t, filtered, `"hypervisor@`+cmp)
	assert.NotContains(t, filtered, `"api@`)
	for query, field := range map[string]string{"?nodes=x": "nodes[0]", "?nodes=1,0": "nodes[1]"} {
		status, body := dot(query)
		assert.Equal(t, http.StatusBadRequest, status, "%s: %s", query, body)
		assert.Contains(t, body, `"field":"`+field+`"`, query)
	}
	for query, field := range map[string]string{"?nodes=999999": "nodes[0]", "?tasks=api,nope": "tasks[1]"} {
		status, body := dot(query)
		assert.Equal(t, http.StatusUnprocessableEntity, status, "%s: %s", query, body)
		assert.Contains(t, body, `"field":"`+field+`"`, query)
	}
}

// A graph whose metadata sets on_stop node attributes: a transaction
// stopped mid-run gives its node those attributes, not on_success's.
func TestOnStopNodeAttributes(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	ctl := nodeName("ctl")
	status, raw := st.Do(t, http.MethodPut, "/api/v1/deployments/d1/graphs/stoppable", map[string]any{
		"metadata": map[string]any{
			"on_success": map[string]any{"node_attributes": map[string]any{"finished": "yes"}},
			"on_stop":    map[string]any{"node_attributes": map[string]any{"status": "provisioned", "error_type": "stopped", "stopped_by": "operator"}},
		},
		"tasks": []map[string]any{
			{"id": "long", "tags": []string{"controller"}, "parameters": map[string]any{"cmd": "sleep 3", "timeout": 30}},
			{"id": "next", "tags": []string{"controller"}, "requires": []string{"long"}, "parameters": map[string]any{"cmd": "echo next", "timeout": 30}},
		},
	}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	var before models.Node
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+ctl, nil, &before)
	assert.NotContains(t, before.Attributes, "stopped_by")
	assert.Nil(t, before.ErrorType)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "stoppable"}}})
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+ctl].State == contract.RunRunning
	}, 20*time.Second, 50*time.Millisecond)
	status, raw = st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/stop", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	require.Equal(t, models.TxStopped, waitDone(t, st, ans.TaskUUID, 30*time.Second).Status)
	assert.Equal(t, contract.RunCancelled, runsByKey(t, st, ans.TaskUUID, "")["next@"+ctl].State)

	var after models.Node
	require.Eventually(t, func() bool {
		after = models.Node{}
		st.Do(t, http.MethodGet, "/api/v1/nodes/"+ctl, nil, &after)
		return after.Attributes["stopped_by"] == "operator"
	}, 10*time.Second, 50*time.Millisecond, "on_stop's node attributes")
	require.NotNil(t, after.ErrorType)
	assert.Equal(t, "stopped", *after.ErrorType)
	assert.Equal(t, models.NodeProvisioned, after.Status)
	assert.NotContains(t, after.Attributes, "finished", "on_success did not apply")
	assert.Equal(t, 100, after.Progress)
}
