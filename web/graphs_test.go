package web_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
)

// graphsRelease is this file's release: a controller (database, api) and a
// compute node whose hypervisor task waits for the controller's api.
const graphsRelease = `
name: levels
version: "1"
roles_metadata:
  controller: {tags: [database, api]}
  compute: {tags: [hypervisor]}
graphs:
  deployment:
    tasks:
      - id: base
        tags: ["/.*/"]
        parameters: {cmd: "echo base"}
      - id: database
        tags: [database]
        requires: [base]
        parameters: {cmd: "echo database"}
      - id: api
        tags: [api]
        requires: [database]
        parameters: {cmd: "echo api"}
      - id: hypervisor
        tags: [hypervisor]
        requires: [base]
        cross_depends: [{name: api, tags: [api]}]
        parameters: {cmd: "echo hypervisor"}
  provision:
    tasks:
      - id: image
        type: noop
        role: "*"
`

// graphsSetup imports graphsRelease and creates deployment d1 of it; with
// nodes, it starts an agent per node and gives the node its roles in d1.
func graphsSetup(t *testing.T, st *testenv.Stack, roles map[string][]string) {
	t.Helper()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(graphsRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	graphOK(t, st, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "levels"}, http.StatusCreated, nil)
	for short, rs := range roles {
		st.StartAgent(t, short+".anneal.test")
		graphOK(t, st, http.MethodPatch, "/api/v1/nodes/"+short+".anneal.test", map[string]any{"deployment": "d1", "roles": rs}, http.StatusOK, nil)
	}
}

// graphFailure is an API error answer.
type graphFailure struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
}

// graphRefused calls the API expecting an error with status and, unless
// empty, the field named in the details.
func graphRefused(t *testing.T, st *testenv.Stack, method, path string, body any, status int, field string) graphFailure {
	t.Helper()
	code, raw := st.Do(t, method, path, body, nil)
	require.Equal(t, status, code, "%s %s: %s", method, path, raw)
	var out graphFailure
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	if field != "" {
		assert.Equal(t, field, out.Error.Details["field"], "%s", raw)
	}
	return out
}

// graphOK calls the API expecting status and decodes the answer into out.
func graphOK(t *testing.T, st *testenv.Stack, method, path string, body any, status int, out any) {
	t.Helper()
	code, raw := st.Do(t, method, path, body, out)
	require.Equal(t, status, code, "%s %s: %s", method, path, raw)
}

// graphRows counts the rows of the graphs table.
func graphRows(t *testing.T, st *testenv.Stack) int64 {
	t.Helper()
	var n int64
	require.NoError(t, st.Store.DB.Model(&fuel.Graph{}).Count(&n).Error)
	return n
}

// graphView calls the API expecting status and a graph, decoded afresh.
func graphView(t *testing.T, st *testenv.Stack, method, path string, body any, status int) fuel.GraphView {
	t.Helper()
	var g fuel.GraphView
	graphOK(t, st, method, path, body, status, &g)
	return g
}

func graphTaskIDs(g fuel.GraphView) []string {
	ids := make([]string, len(g.Tasks))
	for i, task := range g.Tasks {
		ids[i] = task.ID
	}
	return ids
}

type graphListing struct {
	Own       []fuel.GraphSummary `json:"own"`
	Available []string            `json:"available"`
}

func TestPluginAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	var lma fuel.Plugin
	graphOK(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "lma", "version": "1.0.0", "title": "LMA collector"}, http.StatusCreated, &lma)
	assert.Equal(t, "lma", lma.Name)
	assert.Equal(t, "1.0.0", lma.Version)
	assert.Equal(t, "LMA collector", lma.Title)

	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "lma", "version": "1.0.0"}, http.StatusConflict, "")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"version": "1"}, http.StatusUnprocessableEntity, "name")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "12", "version": "1"}, http.StatusUnprocessableEntity, "name")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "has space", "version": "1"}, http.StatusUnprocessableEntity, "name")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "x"}, http.StatusUnprocessableEntity, "version")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins", map[string]any{"name": "x", "version": "1", "colour": 1}, http.StatusBadRequest, "colour")
	var all []fuel.Plugin
	requireList(t, st, "/api/v1/plugins", &all)
	require.Len(t, all, 1, "refused requests create nothing")

	graphOK(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "lma", "version": "2.0.0"}, http.StatusCreated, nil)
	var got fuel.Plugin
	graphOK(t, st, http.MethodGet, fmt.Sprintf("/api/v1/plugins/%d", lma.ID), nil, http.StatusOK, &got)
	assert.Equal(t, "1.0.0", got.Version)
	graphOK(t, st, http.MethodGet, "/api/v1/plugins/lma", nil, http.StatusOK, &got)
	assert.Equal(t, "2.0.0", got.Version, "a bare name is the newest")
	graphOK(t, st, http.MethodGet, "/api/v1/plugins/lma@1.0.0", nil, http.StatusOK, &got)
	assert.Equal(t, lma.ID, got.ID)
	graphRefused(t, st, http.MethodGet, "/api/v1/plugins/nope", nil, http.StatusNotFound, "")

	status, body := st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/lma@1.0.0", nil, http.StatusNoContent, nil)
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/lma@1.0.0", nil, http.StatusNoContent, nil)
	graphRefused(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/nope", nil, http.StatusNotFound, "")
	graphRefused(t, st, http.MethodPut, "/api/v1/deployments/nope/plugins/lma", nil, http.StatusNotFound, "")
	var enabled []fuel.Plugin
	requireList(t, st, "/api/v1/deployments/d1/plugins", &enabled)
	require.Len(t, enabled, 1)
	assert.Equal(t, lma.ID, enabled[0].ID)
	graphOK(t, st, http.MethodDelete, "/api/v1/deployments/d1/plugins/lma@1.0.0", nil, http.StatusNoContent, nil)
	graphRefused(t, st, http.MethodDelete, "/api/v1/deployments/d1/plugins/lma@1.0.0", nil, http.StatusNotFound, "")
	requireList(t, st, "/api/v1/deployments/d1/plugins", &enabled)
	assert.Empty(t, enabled)
}

// TestGraphCRUDEachLevel runs the same create/read/patch/replace/delete
// story, and the same refusals, on a release, a plugin and a deployment.
func TestGraphCRUDEachLevel(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	graphsSetup(t, st, nil)
	var plugin fuel.Plugin
	graphOK(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "lma", "version": "1"}, http.StatusCreated, &plugin)

	for _, owner := range []string{"/api/v1/releases/levels", fmt.Sprintf("/api/v1/plugins/%d", plugin.ID), "/api/v1/deployments/d1"} {
		t.Run(strings.Split(owner, "/")[3], func(t *testing.T) {
			base := owner + "/graphs/"
			ownList := func() []fuel.GraphSummary {
				var l graphListing
				graphOK(t, st, http.MethodGet, owner+"/graphs", nil, http.StatusOK, &l)
				return l.Own
			}
			before, rows := ownList(), graphRows(t, st)

			// Refusals write nothing.
			graphRefused(t, st, http.MethodGet, base+"custom", nil, http.StatusNotFound, "")
			graphRefused(t, st, http.MethodPatch, base+"custom", map[string]any{"name": "x"}, http.StatusNotFound, "")
			graphRefused(t, st, http.MethodDelete, base+"custom", nil, http.StatusNotFound, "")
			graphRefused(t, st, http.MethodPost, base+"custom", `{"tasks": [`, http.StatusBadRequest, "body")
			graphRefused(t, st, http.MethodPost, base+"custom", map[string]any{"tasks": []any{}, "colour": 1}, http.StatusBadRequest, "colour")
			graphRefused(t, st, http.MethodPut, base+"custom", map[string]any{"tasks": []any{map[string]any{"id": "a", "colour": 1}}}, http.StatusBadRequest, "colour")
			graphRefused(t, st, http.MethodPost, base+"Custom", map[string]any{}, http.StatusUnprocessableEntity, "type")
			graphRefused(t, st, http.MethodPut, base+"cust%20om", map[string]any{}, http.StatusUnprocessableEntity, "type")
			graphRefused(t, st, http.MethodPost, base+"custom", map[string]any{"type": "other"}, http.StatusUnprocessableEntity, "type")
			bad := graphRefused(t, st, http.MethodPost, base+"custom", map[string]any{
				"tasks": []any{map[string]any{"id": "a", "tags": []string{"/[/"}}},
			}, http.StatusUnprocessableEntity, "tasks")
			assert.Contains(t, bad.Error.Message, `task "a"`)
			bad = graphRefused(t, st, http.MethodPut, base+"custom", map[string]any{
				"tasks": []any{map[string]any{"id": "a"}, map[string]any{"id": "a"}},
			}, http.StatusUnprocessableEntity, "tasks")
			assert.Contains(t, bad.Error.Message, "duplicate task id")
			assert.Equal(t, before, ownList())
			assert.Equal(t, rows, graphRows(t, st), "refused requests write nothing")

			// Create, then a second create conflicts.
			g := graphView(t, st, http.MethodPost, base+"custom", map[string]any{
				"name": "first", "metadata": map[string]any{"a": 1},
				"tasks": []any{map[string]any{"id": "probe", "tags": []string{"api"}, "parameters": map[string]any{"cmd": "echo probe"}}},
			}, http.StatusCreated)
			assert.Equal(t, fuel.GraphView{
				Type: "custom", Name: "first", Metadata: map[string]any{"a": 1.0}, Tasks: g.Tasks,
			}, g)
			assert.Equal(t, []string{"probe"}, graphTaskIDs(g))
			graphRefused(t, st, http.MethodPost, base+"custom", map[string]any{"name": "again"}, http.StatusConflict, "")
			g = graphView(t, st, http.MethodGet, base+"custom", nil, http.StatusOK)
			assert.Equal(t, "first", g.Name, "the conflict changed nothing")

			// Patch: tasks replaced by id or appended, metadata keys
			// overwritten, the name kept unless given.
			g = graphView(t, st, http.MethodPatch, base+"custom", map[string]any{
				"metadata": map[string]any{"b": "two"},
				"tasks": []any{
					map[string]any{"id": "probe", "tags": []string{"api"}, "parameters": map[string]any{"cmd": "echo patched"}},
					map[string]any{"id": "after", "tags": []string{"api"}, "requires": []string{"probe"}},
				},
			}, http.StatusOK)
			assert.Equal(t, "first", g.Name)
			assert.Equal(t, map[string]any{"a": 1.0, "b": "two"}, g.Metadata)
			assert.Equal(t, []string{"probe", "after"}, graphTaskIDs(g))
			assert.Equal(t, "echo patched", g.Tasks[0].Parameters.Cmd)
			bad = graphRefused(t, st, http.MethodPatch, base+"custom", map[string]any{
				"name":  "renamed",
				"tasks": []any{map[string]any{"id": "after", "parameters": map[string]any{"timeout": -1}}},
			}, http.StatusUnprocessableEntity, "tasks[0].parameters.timeout")
			assert.Contains(t, bad.Error.Message, "must be between 0 and 604800")
			// A task name no level defines: refused at once by a release
			// (the base level) or a deployment (its merged graph is known);
			// a plugin's references are checked where it is enabled.
			unknown := map[string]any{"tasks": []any{map[string]any{"id": "after", "requires": []string{"nowhere"}}}}
			if strings.Contains(owner, "/plugins/") {
				graphOK(t, st, http.MethodPut, base+"custom-3", unknown, http.StatusCreated, nil)
				graphOK(t, st, http.MethodDelete, base+"custom-3", nil, http.StatusNoContent, nil)
			} else {
				bad = graphRefused(t, st, http.MethodPatch, base+"custom", unknown, http.StatusUnprocessableEntity, "tasks")
				assert.Contains(t, bad.Error.Message, `unknown task "nowhere"`)
			}
			g = graphView(t, st, http.MethodGet, base+"custom", nil, http.StatusOK)
			assert.Equal(t, []string{"probe", "after"}, graphTaskIDs(g), "the refused patch changed nothing")
			assert.Equal(t, []string{"probe"}, g.Tasks[1].Requires)

			// A graph read back can be written back.
			var again fuel.GraphView
			graphOK(t, st, http.MethodPut, base+"custom", g, http.StatusOK, &again)
			assert.Equal(t, g, again)

			// Put replaces the whole graph, or creates one.
			g = graphView(t, st, http.MethodPut, base+"custom", map[string]any{"tasks": []any{map[string]any{"id": "only"}}}, http.StatusOK)
			assert.Equal(t, fuel.GraphView{Type: "custom", Metadata: map[string]any{}, Tasks: []plan.Task{{ID: "only"}}}, g)
			g = graphView(t, st, http.MethodPut, base+"custom-2", map[string]any{"name": "second"}, http.StatusCreated)
			assert.Equal(t, "second", g.Name)
			assert.Empty(t, g.Tasks)

			listed := map[string]fuel.GraphSummary{}
			for _, s := range ownList() {
				listed[s.Type] = s
			}
			assert.Equal(t, fuel.GraphSummary{Type: "custom", TaskCount: 1}, listed["custom"])
			assert.Equal(t, fuel.GraphSummary{Type: "custom-2", Name: "second"}, listed["custom-2"])
			assert.Len(t, listed, len(before)+2)

			graphOK(t, st, http.MethodDelete, base+"custom", nil, http.StatusNoContent, nil)
			graphOK(t, st, http.MethodDelete, base+"custom-2", nil, http.StatusNoContent, nil)
			graphRefused(t, st, http.MethodDelete, base+"custom", nil, http.StatusNotFound, "")
			graphRefused(t, st, http.MethodGet, base+"custom", nil, http.StatusNotFound, "")
			assert.Equal(t, before, ownList())
		})
	}
	graphRefused(t, st, http.MethodGet, "/api/v1/releases/nope/graphs", nil, http.StatusNotFound, "")
	graphRefused(t, st, http.MethodPost, "/api/v1/plugins/nope/graphs/custom", map[string]any{}, http.StatusNotFound, "")
	graphRefused(t, st, http.MethodPut, "/api/v1/deployments/nope/graphs/custom", map[string]any{}, http.StatusNotFound, "")
}

// TestGraphMergeAndDOT: release → enabled plugin → deployment merge as the
// deployment sees and plans it, and its Graphviz rendering.
func TestGraphMergeAndDOT(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	graphsSetup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	for _, name := range []string{"lma", "extra", "broken"} {
		graphOK(t, st, http.MethodPost, "/api/v1/plugins", map[string]string{"name": name, "version": "1"}, http.StatusCreated, nil)
	}
	// lma replaces the release's api task and adds a collector selected by
	// the legacy role field, after the release's base task.
	graphOK(t, st, http.MethodPut, "/api/v1/plugins/lma/graphs/deployment", map[string]any{
		"metadata": map[string]any{"from": "lma"},
		"tasks": []any{
			map[string]any{"id": "api", "tags": []string{"api"}, "requires": []string{"database"}, "parameters": map[string]any{"cmd": "echo lma-api"}},
			map[string]any{"id": "collector", "role": "controller", "requires": []string{"base"}},
		},
	}, http.StatusCreated, nil)
	graphOK(t, st, http.MethodPut, "/api/v1/plugins/lma/graphs/lma-check", map[string]any{
		"tasks": []any{map[string]any{"id": "check", "role": "*"}},
	}, http.StatusCreated, nil)
	graphOK(t, st, http.MethodPut, "/api/v1/plugins/extra/graphs/deployment", map[string]any{
		"metadata": map[string]any{"from": "extra"},
		"tasks":    []any{map[string]any{"id": "extra-task", "tags": []string{"api"}}},
	}, http.StatusCreated, nil)
	// broken names a task no release of d1 has: enabling it is refused.
	graphOK(t, st, http.MethodPut, "/api/v1/plugins/broken/graphs/deployment", map[string]any{
		"tasks": []any{map[string]any{"id": "b", "requires": []string{"nowhere"}}},
	}, http.StatusCreated, nil)

	// Before the deployment has a graph of its own, its own graph is 404
	// although it can run the release's.
	graphRefused(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs/deployment", nil, http.StatusNotFound, "")

	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/lma", nil, http.StatusNoContent, nil)
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/extra", nil, http.StatusNoContent, nil)
	graphOK(t, st, http.MethodDelete, "/api/v1/deployments/d1/plugins/extra", nil, http.StatusNoContent, nil)
	refused := graphRefused(t, st, http.MethodPut, "/api/v1/deployments/d1/plugins/broken", nil, http.StatusConflict, "")
	assert.Contains(t, refused.Error.Message, `unknown task "nowhere"`)

	graphOK(t, st, http.MethodPost, "/api/v1/deployments/d1/graphs/deployment", map[string]any{
		"name": "d1 tweaks", "metadata": map[string]any{"from": "d1"},
		"tasks": []any{map[string]any{"id": "database", "tags": []string{"database"}, "requires": []string{"base"}, "parameters": map[string]any{"cmd": "echo d1-database"}}},
	}, http.StatusCreated, nil)
	// A deployment graph naming an unknown task is refused on the merge.
	bad := graphRefused(t, st, http.MethodPatch, "/api/v1/deployments/d1/graphs/deployment", map[string]any{
		"tasks": []any{map[string]any{"id": "x", "requires": []string{"nowhere"}}},
	}, http.StatusUnprocessableEntity, "tasks")
	assert.Contains(t, bad.Error.Message, `deployment "d1"`)

	var own fuel.GraphView
	graphOK(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs/deployment", nil, http.StatusOK, &own)
	assert.Equal(t, "d1 tweaks", own.Name)
	assert.Equal(t, []string{"database"}, graphTaskIDs(own), "the deployment's own graph, not merged")

	var merged fuel.ResolvedGraph
	graphOK(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs/deployment/tasks", nil, http.StatusOK, &merged)
	cmds := map[string]string{}
	var ids []string
	for _, task := range merged.Tasks {
		ids = append(ids, task.ID)
		cmds[task.ID] = task.Parameters.Cmd
	}
	assert.Equal(t, []string{"base", "database", "api", "hypervisor", "collector"}, ids)
	assert.Equal(t, "echo d1-database", cmds["database"], "the deployment wins")
	assert.Equal(t, "echo lma-api", cmds["api"], "the enabled plugin overrides the release")
	assert.Equal(t, "d1", merged.Metadata["from"])
	require.Len(t, merged.Sources, 3)
	assert.Equal(t, []string{"release", "plugin", "deployment"},
		[]string{merged.Sources[0].OwnerKind, merged.Sources[1].OwnerKind, merged.Sources[2].OwnerKind})

	var listing graphListing
	graphOK(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs", nil, http.StatusOK, &listing)
	assert.Equal(t, []fuel.GraphSummary{{Type: "deployment", Name: "d1 tweaks", TaskCount: 1}}, listing.Own)
	// The built-in provision, verification and deletion graphs are always available.
	assert.Equal(t, []string{"deletion", "deployment", "lma-check", "provision", "verification"}, listing.Available)

	// The release cannot drop what the plugin and the deployment build on.
	graphRefused(t, st, http.MethodDelete, "/api/v1/releases/levels/graphs/deployment", nil, http.StatusConflict, "")

	// graph.gv: one cluster per node, the cross-node edge, the plugin's task.
	req, err := http.NewRequest(http.MethodGet, st.URL+"/api/v1/deployments/d1/graphs/deployment/graph.gv", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+st.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	assert.Equal(t, "text/vnd.graphviz; charset=utf-8", resp.Header.Get("Content-Type"))
	gv := string(raw)
	assert.True(t, strings.HasPrefix(gv, `digraph "d1/deployment" {`), gv)
	for _, want := range []string{
		`subgraph "cluster_cmp.anneal.test" {`,
		`subgraph "cluster_ctl.anneal.test" {`,
		`label="ctl.anneal.test";`,
		`"collector@ctl.anneal.test" [label="collector"];`,
		`"hypervisor@cmp.anneal.test" [label="hypervisor"];`,
		`"api@ctl.anneal.test" -> "hypervisor@cmp.anneal.test";`,
		`"base@ctl.anneal.test" -> "collector@ctl.anneal.test";`,
	} {
		assert.Contains(t, gv, want)
	}
	assert.NotContains(t, gv, "extra-task")
	graphRefused(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs/teleport/graph.gv", nil, http.StatusNotFound, "")

	// A cycle of same-node orderings is refused when written, with its
	// path in task ids.
	refused = graphRefused(t, st, http.MethodPut, "/api/v1/deployments/d1/graphs/loop", map[string]any{
		"tasks": []any{
			map[string]any{"id": "a", "tags": []string{"controller"}, "requires": []string{"b"}},
			map[string]any{"id": "b", "tags": []string{"controller"}, "requires": []string{"a"}},
		},
	}, http.StatusUnprocessableEntity, "tasks")
	assert.Equal(t, []any{"a", "b", "a"}, refused.Error.Details["cycle"])
	// A cycle through cross dependencies depends on the nodes: it is
	// stored, but graph.gv, like execute, refuses it with its path.
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/graphs/loop", map[string]any{
		"tasks": []any{
			map[string]any{"id": "a", "tags": []string{"controller"}, "cross_depends": []any{map[string]any{"name": "b"}}},
			map[string]any{"id": "b", "tags": []string{"controller"}, "cross_depends": []any{map[string]any{"name": "a"}}},
		},
	}, http.StatusCreated, nil)
	cycle := graphRefused(t, st, http.MethodGet, "/api/v1/deployments/d1/graphs/loop/graph.gv", nil, http.StatusUnprocessableEntity, "tasks")
	assert.Contains(t, cycle.Error.Message, "dependency cycle: a@ctl.anneal.test -> b@ctl.anneal.test -> a@ctl.anneal.test")
	assert.Equal(t, []any{"a@ctl.anneal.test", "b@ctl.anneal.test", "a@ctl.anneal.test"}, cycle.Error.Details["cycle"])
	graphRefused(t, st, http.MethodPost, "/api/v1/graphs/execute", map[string]any{
		"deployment": "d1", "graphs": []any{map[string]any{"type": "loop"}},
	}, http.StatusUnprocessableEntity, "graphs[0]")
}

// requireList reads a whole list endpoint into out, requiring 200.
func requireList[T any](t *testing.T, st *testenv.Stack, path string, out *[]T) {
	t.Helper()
	status, body := getList(t, st, path, out)
	require.Equal(t, http.StatusOK, status, "%s", body)
}
