package fuel_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/scenarios"
)

// scenarioInput builds a ScenarioInput from JSON, as the API receives it.
func scenarioInput(t *testing.T, doc string) fuel.ScenarioInput {
	t.Helper()
	var in fuel.ScenarioInput
	require.NoError(t, json.Unmarshal([]byte(doc), &in))
	return in
}

func TestCreateScenario(t *testing.T) {
	f := storetest.NewFixture(t)
	sc, err := f.Store.CreateScenario(f.Ctx, scenarioInput(t, fmt.Sprintf(`{
		"name": "roll-out", "description": "provision, then deploy",
		"scenario": [
			{"graph_type": "provision", "nodes": {"yaql_exp": "node.status == 'discover'"}, "max_nodes_in_flight": 5},
			{"graph_type": "deployment", "nodes": [%d], "failure_threshold": 20},
			{"graph_type": "deployment", "nodes": {"expr": "'compute' in node.roles"}},
			{"graph_type": "deployment"},
			{"graph_type": "deployment", "nodes": {"ids": [%d, %d]}}
		]}`, f.Ctl.ID, f.Ctl.ID, f.Cmp.ID)))
	require.NoError(t, err)
	require.Len(t, sc.Acts, 5)
	for i, a := range sc.Acts {
		assert.Equal(t, i+1, a.Position)
		assert.NotZero(t, a.ID)
	}
	assert.Equal(t, fuel.ActNodes{Expr: "node.status == 'discover'"}, sc.Acts[0].Nodes, "yaql_exp is an alias of expr")
	assert.Equal(t, 5, *sc.Acts[0].MaxNodesInFlight)
	assert.Nil(t, sc.Acts[0].FailureThreshold)
	assert.Equal(t, []int64{f.Ctl.ID}, sc.Acts[1].Nodes.IDs)
	assert.Equal(t, 20, *sc.Acts[1].FailureThreshold)
	assert.True(t, sc.Acts[3].Nodes.All())
	assert.Equal(t, []int64{f.Ctl.ID, f.Cmp.ID}, sc.Acts[4].Nodes.IDs)
	assert.False(t, sc.Builtin)

	// Stored as the seed's JSON column: {"ids": [...]}, {"expr": ...} or {}.
	var stored []string
	require.NoError(t, f.Store.DB.Raw("SELECT nodes::text FROM scenario_acts WHERE scenario_id = ? ORDER BY position", sc.ID).Scan(&stored).Error)
	assert.JSONEq(t, `{"expr": "node.status == 'discover'"}`, stored[0])
	assert.JSONEq(t, fmt.Sprintf(`{"ids": [%d]}`, f.Ctl.ID), stored[1])
	assert.JSONEq(t, `{}`, stored[3])

	// Read back, by name and in the list, in the API's shape.
	got, err := f.Store.Scenario(f.Ctx, "roll-out")
	require.NoError(t, err)
	assert.Equal(t, sc.Acts[2].Nodes, got.Acts[2].Nodes)
	assert.Equal(t, "provision, then deploy", got.Description)
	out, err := json.Marshal(got)
	require.NoError(t, err)
	var shape struct {
		Name     string           `json:"name"`
		Scenario []map[string]any `json:"scenario"`
	}
	require.NoError(t, json.Unmarshal(out, &shape))
	assert.Equal(t, "roll-out", shape.Name)
	require.Len(t, shape.Scenario, 5)
	assert.Equal(t, map[string]any{"expr": "node.status == 'discover'"}, shape.Scenario[0]["nodes"])
	assert.Nil(t, shape.Scenario[3]["nodes"], "all nodes is null")
	assert.Equal(t, "provision", shape.Scenario[0]["graph_type"])

	list, err := f.Store.Scenarios(f.Ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Len(t, list[0].Acts, 5)

	_, err = f.Store.Scenario(f.Ctx, "nope")
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestCreateScenarioDuplicateName(t *testing.T) {
	store, ctx := storetest.New(t)
	in := scenarioInput(t, `{"name": "twice", "scenario": [{"graph_type": "deployment"}]}`)
	_, err := store.CreateScenario(ctx, in)
	require.NoError(t, err)
	_, err = store.CreateScenario(ctx, in)
	ce := storetest.RequireConflict(t, err)
	assert.Contains(t, ce.Reason, `"twice" already exists`)
	assert.EqualValues(t, 1, storetest.Count(t, store, &fuel.ScenarioAct{}))
}

func TestCreateScenarioValidation(t *testing.T) {
	store, ctx := storetest.New(t)
	for _, tc := range []struct {
		doc, field, reason string
	}{
		{`{"scenario": [{"graph_type": "deployment"}]}`, "name", "is required"},
		{`{"name": "a b", "scenario": [{"graph_type": "deployment"}]}`, "name", "may contain only"},
		{`{"name": "x"}`, "scenario", "at least one act"},
		{`{"name": "x", "scenario": []}`, "scenario", "at least one act"},
		{`{"name": "x", "scenario": [{"graph_type": ""}]}`, "scenario[0].graph_type", "is required"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment"}, {"graph_type": "Bad Type"}]}`, "scenario[1].graph_type", "lower-case"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": "all"}]}`, "scenario[0].nodes", "must be a list of node ids, an object"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": 3}]}`, "scenario[0].nodes", "must be a list"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": []}]}`, "scenario[0].nodes", "empty list"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": [1, "two"]}]}`, "scenario[0].nodes[1]", `not "two"`},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": [0]}]}`, "scenario[0].nodes[0]", "positive integer"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": [1.5]}]}`, "scenario[0].nodes[0]", "positive integer"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": [7, 7]}]}`, "scenario[0].nodes[1]", "already listed at [0]"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": [999999]}]}`, "scenario[0].nodes[0]", "no node with id 999999"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"ids": [999999]}}]}`, "scenario[0].nodes[0]", "no node with id 999999"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"ids": 3}}]}`, "scenario[0].nodes.ids", "list of node ids"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {}}]}`, "scenario[0].nodes", "exactly one of"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"expr": "true", "ids": [1]}}]}`, "scenario[0].nodes", "both expr and ids"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"query": "true"}}]}`, "scenario[0].nodes.query", "unknown field"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"expr": 3}}]}`, "scenario[0].nodes.expr", "must be a string"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"expr": ""}}]}`, "scenario[0].nodes.expr", "is empty"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment"}, {"graph_type": "deployment", "nodes": {"expr": "node.stauts == 'discover'"}}]}`,
			"scenario[1].nodes.expr", "line 1, column 5: undefined field 'stauts'"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "nodes": {"yaql_exp": "node.progress"}}]}`, "scenario[0].nodes.yaql_exp", "must be a boolean expression"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "max_nodes_in_flight": 0}]}`, "scenario[0].max_nodes_in_flight", "at least 1"},
		{`{"name": "x", "scenario": [{"graph_type": "deployment", "failure_threshold": 101}]}`, "scenario[0].failure_threshold", "between 0 and 100"},
	} {
		t.Run(tc.field+" "+tc.reason, func(t *testing.T) {
			_, err := store.CreateScenario(ctx, scenarioInput(t, tc.doc))
			ie := storetest.RequireInput(t, err, tc.field)
			assert.Contains(t, ie.Reason, tc.reason)
		})
	}
	assert.EqualValues(t, 0, storetest.Count(t, store, &fuel.Scenario{}), "nothing half-created")
	assert.EqualValues(t, 0, storetest.Count(t, store, &fuel.ScenarioAct{}))
}

func TestCreateScenarioBadExpressionPosition(t *testing.T) {
	store, ctx := storetest.New(t)
	_, err := store.CreateScenario(ctx, fuel.ScenarioInput{Name: "bad", Acts: []fuel.ActInput{
		{GraphType: "deployment", Nodes: json.RawMessage(`{"expr": "node.status == 'discover' &&\n  'compute' in node.role"}`)},
	}})
	ie := storetest.RequireInput(t, err, "scenario[0].nodes.expr")
	assert.Contains(t, ie.Reason, "line 2, column 20")
	assert.Equal(t, 2, ie.Details["line"])
	assert.Equal(t, 20, ie.Details["column"])
	assert.Equal(t, "node.status == 'discover' &&\n  'compute' in node.role", ie.Details["expression"])
	assert.Contains(t, ie.Details["issues"], "2:20: undefined field 'role'")
}

func TestDeleteScenario(t *testing.T) {
	store, ctx := storetest.New(t)
	_, err := store.CreateScenario(ctx, scenarioInput(t, `{"name": "gone", "scenario": [{"graph_type": "deployment"}, {"graph_type": "verification"}]}`))
	require.NoError(t, err)
	require.NoError(t, store.DeleteScenario(ctx, "gone"))
	assert.EqualValues(t, 0, storetest.Count(t, store, &fuel.ScenarioAct{}), "acts go with their scenario")
	assert.ErrorIs(t, store.DeleteScenario(ctx, "gone"), models.ErrNotFound)

	require.NoError(t, fuel.EnsureBuiltinScenarios(ctx, store.Fuel, scenarios.Builtins()...))
	ce := storetest.RequireConflict(t, store.DeleteScenario(ctx, "deploy-changes"))
	assert.Contains(t, ce.Reason, "built in")
	_, err = store.Scenario(ctx, "deploy-changes")
	assert.NoError(t, err)
}

func TestEnsureBuiltinScenarios(t *testing.T) {
	store, ctx := storetest.New(t)
	// A user scenario of the same name is taken over by the built-in one.
	_, err := store.CreateScenario(ctx, scenarioInput(t, `{"name": "deploy-changes", "scenario": [{"graph_type": "verification"}]}`))
	require.NoError(t, err)
	for range 2 { // idempotent
		require.NoError(t, fuel.EnsureBuiltinScenarios(ctx, store.Fuel, scenarios.Builtins()...))
	}
	list, err := store.Scenarios(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	sc := list[0]
	assert.Equal(t, "deploy-changes", sc.Name)
	assert.True(t, sc.Builtin)
	assert.NotEmpty(t, sc.Description)
	require.Len(t, sc.Acts, 2)
	assert.Equal(t, "provision", sc.Acts[0].GraphType)
	assert.Equal(t, "node.status == 'discover'", sc.Acts[0].Nodes.Expr)
	assert.Equal(t, "deployment", sc.Acts[1].GraphType)
	assert.Equal(t, "node.status != 'deployed' || node.progress < 100", sc.Acts[1].Nodes.Expr)
	assert.EqualValues(t, 2, storetest.Count(t, store, &fuel.ScenarioAct{}))

	// A broken built-in document is an error naming it.
	err = fuel.EnsureBuiltinScenarios(ctx, store.Fuel, []byte("name: broken\nscenario:\n  - graph_type: deployment\n    nodes: {expr: 'node.nope'}\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `built-in scenario "broken"`)
	assert.Contains(t, err.Error(), "undefined field 'nope'")
	err = fuel.EnsureBuiltinScenarios(ctx, store.Fuel, []byte("name: x\nunknown: 1\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown field")
}

func TestPrepareScenario(t *testing.T) {
	f := storetest.NewFixture(t)
	// A third node that is in the deployment but dead gets nothing.
	dead := f.AddNode(t, "dead.anneal.test", "compute")
	require.NoError(t, f.Store.DB.Model(&models.Node{}).Where("id = ?", dead.ID).Update("alive", false).Error)
	// ctl is already deployed.
	require.NoError(t, f.Store.DB.Model(&models.Node{}).Where("id = ?", f.Ctl.ID).Update("status", models.NodeDeployed).Error)

	_, err := f.Store.CreateScenario(f.Ctx, scenarioInput(t, fmt.Sprintf(`{"name": "mixed", "scenario": [
		{"graph_type": "provision", "nodes": {"expr": "node.status == 'discover'"}, "max_nodes_in_flight": 3, "failure_threshold": 50},
		{"graph_type": "deployment", "nodes": {"expr": "node.name.startsWith('nothing-')"}},
		{"graph_type": "deployment", "nodes": {"expr": "'compute' in node.roles"}},
		{"graph_type": "deployment", "nodes": [%d]},
		{"graph_type": "deployment"},
		{"graph_type": "provision", "nodes": {"expr": "!node.alive"}}
	]}`, f.Ctl.ID)))
	require.NoError(t, err)

	sp, err := f.Store.PrepareScenario(f.Ctx, "mixed", fuel.ScenarioExecuteInput{Deployment: "prod", DryRun: true, MaxNodesInFlight: 7})
	require.NoError(t, err)
	assert.True(t, sp.Input.DryRun)
	assert.Equal(t, 7, sp.Input.MaxNodesInFlight)
	fifty := 50
	assert.Equal(t, []fuel.GraphRequest{
		{Type: "provision", Nodes: []int64{f.Cmp.ID}, MaxNodesInFlight: 3, FailureThreshold: &fifty},
		{Type: "deployment", Nodes: []int64{f.Cmp.ID}},
		{Type: "deployment", Nodes: []int64{f.Ctl.ID}},
		{Type: "deployment"},
	}, sp.Input.Graphs)
	require.Len(t, sp.Acts, 6)
	assert.Equal(t, []int64{dead.ID}, sp.Acts[0].Unavailable, "dead is in discovery but not alive")
	assert.True(t, sp.Acts[1].Skipped)
	assert.Equal(t, "the expression selects no node", sp.Acts[1].Reason)
	assert.Nil(t, sp.Acts[1].Graph)
	assert.Equal(t, 1, *sp.Acts[2].Graph)
	assert.True(t, sp.Acts[4].AllNodes)
	assert.ElementsMatch(t, []int64{f.Ctl.ID, f.Cmp.ID}, sp.Acts[4].Nodes)
	assert.True(t, sp.Acts[5].Skipped)
	assert.Contains(t, sp.Acts[5].Reason, "dead")

	// The plan becomes a transaction; the per-act valves are kept.
	txn, err := f.Store.CreateTransaction(f.Ctx, sp.Input, func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	require.Len(t, txn.Graphs, 4)
	assert.Equal(t, 3, txn.Graphs[0].MaxNodesInFlight)
	assert.Equal(t, 50, *txn.Graphs[0].FailureThreshold)
	assert.Equal(t, 7, txn.Graphs[1].MaxNodesInFlight, "the call's default")

	// Bad calls.
	_, err = f.Store.PrepareScenario(f.Ctx, "mixed", fuel.ScenarioExecuteInput{})
	storetest.RequireInput(t, err, "deployment")
	_, err = f.Store.PrepareScenario(f.Ctx, "mixed", fuel.ScenarioExecuteInput{Deployment: "nope"})
	storetest.RequireInput(t, err, "deployment")
	_, err = f.Store.PrepareScenario(f.Ctx, "nope", fuel.ScenarioExecuteInput{Deployment: "prod"})
	assert.ErrorIs(t, err, models.ErrNotFound)
}

func TestPrepareScenarioErrors(t *testing.T) {
	f := storetest.NewFixture(t)
	other, err := f.Store.CreateDeployment(f.Ctx, models.DeploymentInput{Name: "other", Release: "openstack@1.0"})
	require.NoError(t, err)

	// Explicit ids of another deployment's node.
	_, err = f.Store.CreateScenario(f.Ctx, scenarioInput(t, fmt.Sprintf(`{"name": "ids", "scenario": [
		{"graph_type": "deployment"}, {"graph_type": "deployment", "nodes": [%d, %d]}]}`, f.Ctl.ID, f.Cmp.ID)))
	require.NoError(t, err)
	_, err = f.Store.PrepareScenario(f.Ctx, "ids", fuel.ScenarioExecuteInput{Deployment: "prod"})
	require.NoError(t, err)
	_, err = f.Store.PrepareScenario(f.Ctx, "ids", fuel.ScenarioExecuteInput{Deployment: other.Name})
	ie := storetest.RequireInput(t, err, "scenario[1].nodes[0]")
	assert.Contains(t, ie.Reason, `is not in deployment "other"`)

	// A runtime error names the node.
	_, err = f.Store.CreateScenario(f.Ctx, scenarioInput(t, `{"name": "rack", "scenario": [
		{"graph_type": "deployment", "nodes": {"expr": "node.attributes.rack == 'r1'"}}]}`))
	require.NoError(t, err)
	_, err = f.Store.PrepareScenario(f.Ctx, "rack", fuel.ScenarioExecuteInput{Deployment: "prod"})
	ie = storetest.RequireInput(t, err, "scenario[0].nodes.expr")
	assert.Contains(t, ie.Reason, storetest.CtlName)
	assert.Contains(t, ie.Reason, "no such key: rack")

	// Nothing selected anywhere: nothing to do.
	_, err = f.Store.CreateScenario(f.Ctx, scenarioInput(t, `{"name": "none", "scenario": [
		{"graph_type": "deployment", "nodes": {"expr": "node.admin"}}]}`))
	require.NoError(t, err)
	_, err = f.Store.PrepareScenario(f.Ctx, "none", fuel.ScenarioExecuteInput{Deployment: "prod"})
	ie = storetest.RequireInput(t, err, "deployment")
	assert.Contains(t, ie.Reason, "nothing to do")
	assert.Equal(t, true, ie.Details["nothing_to_run"])

	// A graph type the deployment lacks is reported on the act, not on the
	// transaction's graph index.
	_, err = f.Store.CreateScenario(f.Ctx, scenarioInput(t, `{"name": "teleport", "scenario": [
		{"graph_type": "deployment", "nodes": {"expr": "node.admin"}},
		{"graph_type": "deployment"},
		{"graph_type": "teleport"}]}`))
	require.NoError(t, err)
	sp, err := f.Store.PrepareScenario(f.Ctx, "teleport", fuel.ScenarioExecuteInput{Deployment: "prod"})
	require.NoError(t, err)
	_, err = f.Store.CreateTransaction(f.Ctx, sp.Input, func(*fuel.Transaction) error { return nil })
	storetest.RequireInput(t, err, "graphs[1].type")
	ie = storetest.RequireInput(t, sp.MapError(err), "scenario[2].graph_type")
	assert.Contains(t, ie.Reason, "act 3 (teleport)")
	assert.Contains(t, ie.Reason, `no graph of type "teleport"`)
}
