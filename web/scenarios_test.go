package web_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/scenarios"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// scenarioErr is the API's error envelope.
type scenarioErr struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
}

// scenarioRefused sends a request that must fail with status and returns
// the decoded error.
func scenarioRefused(t *testing.T, st *testenv.Stack, method, path string, body any, status int) scenarioErr {
	t.Helper()
	got, raw := st.Do(t, method, path, body, nil)
	require.Equal(t, status, got, "%s", raw)
	var e scenarioErr
	require.NoError(t, jsonUnmarshal(raw, &e), "%s", raw)
	return e
}

type scenarioExecuteAnswer struct {
	TaskUUID   string              `json:"task_uuid"`
	WorkflowID string              `json:"workflow_id"`
	Scenario   string              `json:"scenario"`
	Acts       []fuel.ActSelection `json:"acts"`
}

// nodeID looks a node's id up through the API.
func nodeID(t *testing.T, st *testenv.Stack, name string) int64 {
	t.Helper()
	var n models.Node
	status, raw := st.Do(t, http.MethodGet, "/api/v1/nodes/"+name, nil, &n)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	return n.ID
}

// TestScenarioSelectedByExpression runs a scenario end to end on real
// agents: act 1 runs the deployment graph on the nodes whose roles include
// compute (an expression), act 2 selects nothing and is skipped, act 3 runs
// it on the controller given by id. One transaction, two graphs; every node
// gets only the runs of the acts that selected it.
func TestScenarioSelectedByExpression(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp1": {"compute"}, "cmp2": {"compute"}})
	ctlID := nodeID(t, st, nodeName("ctl"))

	var sc fuel.Scenario
	status, raw := st.Do(t, http.MethodPost, "/api/v1/scenarios", map[string]any{
		"name": "computes-then-controller", "description": "compute nodes first",
		"scenario": []map[string]any{
			{"graph_type": "deployment", "nodes": map[string]any{"expr": "'compute' in node.roles && node.status == 'discover'"}},
			{"graph_type": "deployment", "nodes": map[string]any{"yaql_exp": "node.name.startsWith('db-')"}},
			{"graph_type": "deployment", "nodes": []int64{ctlID}, "max_nodes_in_flight": 1},
		},
	}, &sc)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	require.Len(t, sc.Acts, 3)

	var ans scenarioExecuteAnswer
	status, raw = st.Do(t, http.MethodPost, "/api/v1/scenarios/computes-then-controller/execute", map[string]any{"deployment": "d1"}, &ans)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	require.NotEmpty(t, ans.TaskUUID)
	assert.Equal(t, "tx-"+ans.TaskUUID, ans.WorkflowID)
	assert.Equal(t, "computes-then-controller", ans.Scenario)
	require.Len(t, ans.Acts, 3)
	assert.Len(t, ans.Acts[0].Nodes, 2)
	assert.True(t, ans.Acts[1].Skipped)
	assert.Equal(t, []int64{ctlID}, ans.Acts[2].Nodes)

	tx := waitDone(t, st, ans.TaskUUID, 90*time.Second)
	assert.Equal(t, models.TxReady, tx.Status, tx.Error)
	require.Len(t, tx.Graphs, 2, "the skipped act is not part of the transaction")
	recordHistories(t, st, map[string]string{
		"transaction-multi-graph":  ans.WorkflowID,
		"node-multi-graph-last":    contract.NodeWorkflowID(ans.TaskUUID, nodeName("ctl")),
		"node-multi-graph-compute": contract.NodeWorkflowID(ans.TaskUUID, nodeName("cmp1")),
		// Recorded once graphs ran as GraphRun children (graph-run-child).
		"transaction-graph-children": ans.WorkflowID,
		"graph-run-first":            contract.GraphWorkflowID(ans.TaskUUID, 0),
		"graph-run-last":             contract.GraphWorkflowID(ans.TaskUUID, 1),
	})
	assert.Equal(t, "deployment", tx.Graphs[0].Type)
	assert.Equal(t, []int64{ctlID}, tx.Graphs[1].Nodes)
	assert.Equal(t, 1, tx.Graphs[1].MaxNodesInFlight)

	runs := runsByKey(t, st, ans.TaskUUID, "")
	byGraph := map[int]map[string]bool{}
	for _, r := range runs {
		if byGraph[r.GraphIndex] == nil {
			byGraph[r.GraphIndex] = map[string]bool{}
		}
		byGraph[r.GraphIndex][r.NodeName] = true
		assert.Equal(t, contract.RunSucceeded, r.State, "%s@%s", r.TaskName, r.NodeName)
	}
	assert.Equal(t, map[string]bool{nodeName("cmp1"): true, nodeName("cmp2"): true}, byGraph[0], "act 1: compute nodes only")
	assert.Equal(t, map[string]bool{nodeName("ctl"): true}, byGraph[1], "act 3: the controller only")
	for _, n := range []string{"cmp1", "cmp2"} {
		assert.Contains(t, runs, "hypervisor@"+nodeName(n))
	}
	assert.Contains(t, runs, "api@"+nodeName("ctl"))

	// A forced dry run of the same scenario plans everything again (without
	// force, LCM would skip the unchanged tasks) and touches no node.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/scenarios/computes-then-controller/execute", map[string]any{"deployment": "d1", "dry_run": true, "force": true}, &ans)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	tx = waitDone(t, st, ans.TaskUUID, 60*time.Second)
	assert.True(t, tx.DryRun)
	for key, r := range runsByKey(t, st, ans.TaskUUID, "") {
		assert.Equal(t, contract.RunPlanned, r.State, key)
	}
}

// TestScenarioAPI covers creation, listing, deletion and bad input.
func TestScenarioAPI(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	require.NoError(t, fuel.EnsureBuiltinScenarios(context.Background(), fuel.New(st.Store), scenarios.Builtins()...))

	body := map[string]any{"name": "mine", "scenario": []map[string]any{
		{"graph_type": "deployment"},
		{"graph_type": "fixable", "nodes": map[string]any{"expr": "node.status == 'discover'"}, "failure_threshold": 50},
	}}
	status, raw := st.Do(t, http.MethodPost, "/api/v1/scenarios", body, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)

	// Duplicate name: 409, nothing changed.
	e := scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", body, http.StatusConflict)
	assert.Equal(t, "conflict", e.Error.Code)
	assert.Contains(t, e.Error.Message, `"mine" already exists`)

	// A bad expression: 422 with the field and the position.
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "bad", "scenario": []map[string]any{
		{"graph_type": "provision"},
		{"graph_type": "deployment", "nodes": map[string]any{"expr": "'compute' in node.roles &&\n  node.stauts == 'discover'"}},
	}}, http.StatusUnprocessableEntity)
	assert.Equal(t, "invalid_input", e.Error.Code)
	assert.Equal(t, "scenario[1].nodes.expr", e.Error.Details["field"])
	assert.Contains(t, e.Error.Message, "scenario[1].nodes.expr: bad expression: line 2, column 7: undefined field 'stauts'")
	assert.EqualValues(t, 2, e.Error.Details["line"])
	assert.EqualValues(t, 7, e.Error.Details["column"])
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "bad", "scenario": []map[string]any{
		{"graph_type": "deployment", "nodes": map[string]any{"yaql_exp": "node.progress + 1"}},
	}}, http.StatusUnprocessableEntity)
	assert.Equal(t, "scenario[0].nodes.yaql_exp", e.Error.Details["field"])
	assert.Contains(t, e.Error.Message, "must be a boolean expression, but its type is int")
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "bad", "scenario": []map[string]any{
		{"graph_type": "deployment", "nodes": "everything"},
	}}, http.StatusUnprocessableEntity)
	assert.Equal(t, "scenario[0].nodes", e.Error.Details["field"])
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "bad", "scenario": []map[string]any{
		{"graph_type": "deployment", "order": 1},
	}}, http.StatusBadRequest)
	assert.Contains(t, e.Error.Message, "unknown field")
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios", `{"name": "bad", "scenario": [`, http.StatusBadRequest)
	assert.Equal(t, "body", e.Error.Details["field"])

	// Listing, in the seed's shape, and one by name.
	var list []map[string]any
	status, raw = getList(t, st, "/api/v1/scenarios", &list)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, list, 2)
	assert.Equal(t, "deploy-changes", list[0]["name"])
	assert.Equal(t, true, list[0]["builtin"])
	acts := list[0]["scenario"].([]any)
	require.Len(t, acts, 2)
	assert.Equal(t, map[string]any{"expr": "node.status == 'discover'"}, acts[0].(map[string]any)["nodes"])
	assert.Equal(t, "mine", list[1]["name"])
	var one fuel.Scenario
	status, raw = st.Do(t, http.MethodGet, "/api/v1/scenarios/mine", nil, &one)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, one.Acts, 2)
	assert.Equal(t, 50, *one.Acts[1].FailureThreshold)
	scenarioRefused(t, st, http.MethodGet, "/api/v1/scenarios/nope", nil, http.StatusNotFound)

	// Executing: bad calls.
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/mine/execute", map[string]any{}, http.StatusUnprocessableEntity)
	assert.Equal(t, "deployment", e.Error.Details["field"])
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/mine/execute", map[string]any{"deployment": "nope"}, http.StatusUnprocessableEntity)
	assert.Equal(t, "deployment", e.Error.Details["field"])
	scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/nope/execute", map[string]any{"deployment": "d1"}, http.StatusNotFound)
	scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/mine/execute", map[string]any{"deployment": "d1", "graphs": []any{}}, http.StatusBadRequest)
	// A graph type the deployment lacks is named on its act.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "teleport", "scenario": []map[string]any{
		{"graph_type": "deployment", "nodes": map[string]any{"expr": "node.admin"}},
		{"graph_type": "teleport"},
	}}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/teleport/execute", map[string]any{"deployment": "d1"}, http.StatusUnprocessableEntity)
	assert.Equal(t, "scenario[1].graph_type", e.Error.Details["field"])
	assert.Contains(t, e.Error.Message, `no graph of type "teleport"`)
	// Nothing selected by any act.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "nobody", "scenario": []map[string]any{
		{"graph_type": "deployment", "nodes": map[string]any{"expr": "node.admin"}},
	}}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	e = scenarioRefused(t, st, http.MethodPost, "/api/v1/scenarios/nobody/execute", map[string]any{"deployment": "d1"}, http.StatusUnprocessableEntity)
	assert.Contains(t, e.Error.Message, "nothing to do")
	var txCount int64
	require.NoError(t, st.Store.DB.Model(&fuel.Transaction{}).Count(&txCount).Error)
	assert.Zero(t, txCount, "no refused call recorded a transaction")

	// Deleting: a user scenario goes, a built-in one stays.
	status, raw = st.Do(t, http.MethodDelete, "/api/v1/scenarios/mine", nil, nil)
	require.Equal(t, http.StatusNoContent, status, "%s", raw)
	scenarioRefused(t, st, http.MethodGet, "/api/v1/scenarios/mine", nil, http.StatusNotFound)
	scenarioRefused(t, st, http.MethodDelete, "/api/v1/scenarios/mine", nil, http.StatusNotFound)
	e = scenarioRefused(t, st, http.MethodDelete, "/api/v1/scenarios/deploy-changes", nil, http.StatusConflict)
	assert.Contains(t, e.Error.Message, "built in")
}
