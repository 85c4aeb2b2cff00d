package web_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/workflows/contract"
)

type swConfig struct {
	ID    int64  `json:"id"`
	Group string `json:"group"`
}

type swDeployment struct {
	ID           int64          `json:"id"`
	Status       string         `json:"status"`
	StatusReason string         `json:"status_reason"`
	Round        int            `json:"round"`
	Action       string         `json:"action"`
	WorkflowID   string         `json:"workflow_id"`
	OutputValues map[string]any `json:"output_values"`
	Config       *struct {
		Name   string `json:"name"`
		Group  string `json:"group"`
		Config string `json:"config"`
	} `json:"config"`
}

func createConfig(t *testing.T, st *testenv.Stack, body map[string]any) swConfig {
	t.Helper()
	var cfg swConfig
	status, raw := st.Do(t, http.MethodPost, "/api/v1/software_configs", body, &cfg)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	return cfg
}

func createSoftware(t *testing.T, st *testenv.Stack, body map[string]any) swDeployment {
	t.Helper()
	var d swDeployment
	status, raw := st.Do(t, http.MethodPost, "/api/v1/software_deployments", body, &d)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	return d
}

// waitSoftware polls a deployment until it leaves WAITING/IN_PROGRESS.
func waitSoftware(t *testing.T, st *testenv.Stack, id int64) swDeployment {
	t.Helper()
	var d swDeployment
	require.Eventually(t, func() bool {
		status, _ := st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/software_deployments/%d", id), nil, &d)
		return status == http.StatusOK && (d.Status == contract.SoftwareComplete || d.Status == contract.SoftwareFailed)
	}, 60*time.Second, 100*time.Millisecond, "software deployment %d did not finish", id)
	return d
}

// A script config runs on the node's real agent: inputs arrive as
// environment variables and files, outputs come back from
// $heat_outputs_path.<name> and are readable as attributes; a second
// deployment takes the first one's output through get_attr; an error
// output, a failing script and an unknown group fail with a reason.
func TestSoftwareDeploymentsEndToEnd(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	st.StartAgent(t, nodeName("n1"))

	cfg := createConfig(t, st, map[string]any{
		"name": "greet",
		"config": `#!/bin/sh
echo "hello $who"
printf '%s from %s' "$who" "$(cat $ANNEAL_INPUTS_DIR/who)" > "$heat_outputs_path.greeting"
echo "$deploy_action" > "$heat_outputs_path.action"
test -n "$fail_with" && printf '%s' "$fail_with" > "$heat_outputs_path.err"
exit 0`,
		"inputs":  []map[string]any{{"name": "who"}, {"name": "fail_with", "default": ""}},
		"outputs": []map[string]any{{"name": "greeting"}, {"name": "action"}, {"name": "err", "error_output": true}},
	})
	assert.Equal(t, "script", cfg.Group, "group defaults to script")

	first := createSoftware(t, st, map[string]any{
		"config_id": cfg.ID, "server_id": nodeName("n1"), "input_values": map[string]any{"who": "world"},
	})
	assert.True(t, strings.HasSuffix(first.WorkflowID, fmt.Sprintf("swd-%d", first.ID)), first.WorkflowID)
	assert.Equal(t, "DEPLOY", first.Action)
	d := waitSoftware(t, st, first.ID)
	require.Equal(t, contract.SoftwareComplete, d.Status, d.StatusReason)
	assert.Equal(t, "world from world", d.OutputValues["greeting"])
	assert.Equal(t, "DEPLOY", d.OutputValues["action"])
	assert.Equal(t, "hello world\n", d.OutputValues["deploy_stdout"])
	assert.EqualValues(t, 0, d.OutputValues["deploy_status_code"])
	recordHistories(t, st, map[string]string{"software-deployment": first.WorkflowID})

	// get_attr of the first deployment's output.
	second := createSoftware(t, st, map[string]any{
		"config_id": cfg.ID, "server_id": nodeName("n1"),
		"input_values": map[string]any{"who": map[string]any{"get_attr": []any{first.ID, "greeting"}}},
	})
	d = waitSoftware(t, st, second.ID)
	require.Equal(t, contract.SoftwareComplete, d.Status, d.StatusReason)
	assert.Equal(t, "world from world from world from world", d.OutputValues["greeting"])

	// An error output with a value fails the deployment, naming it.
	bad := createSoftware(t, st, map[string]any{
		"config_id": cfg.ID, "server_id": nodeName("n1"),
		"input_values": map[string]any{"who": "x", "fail_with": "disk full"},
	})
	d = waitSoftware(t, st, bad.ID)
	assert.Equal(t, contract.SoftwareFailed, d.Status)
	assert.Contains(t, d.StatusReason, "err")
	assert.NotContains(t, d.StatusReason, "disk full", "output values stay out of the workflow (and so of the reason)")
	assert.Equal(t, "disk full", d.OutputValues["err"])

	// A non-zero exit fails it too.
	exit3 := createConfig(t, st, map[string]any{"name": "exit3", "config": "echo oops >&2; exit 3"})
	d = waitSoftware(t, st, createSoftware(t, st, map[string]any{"config_id": exit3.ID, "server_id": nodeName("n1")}).ID)
	assert.Equal(t, contract.SoftwareFailed, d.Status)
	assert.Contains(t, d.StatusReason, "deploy_status_code 3")
	assert.Equal(t, "oops\n", d.OutputValues["deploy_stderr"])

	// An unknown group fails with a reason naming it.
	puppet := createConfig(t, st, map[string]any{"name": "site", "group": "puppet", "config": "class {}"})
	d = waitSoftware(t, st, createSoftware(t, st, map[string]any{"config_id": puppet.ID, "server_id": nodeName("n1")}).ID)
	assert.Equal(t, contract.SoftwareFailed, d.Status)
	assert.Contains(t, d.StatusReason, `"puppet"`)

	// REDEPLOY starts a new round with new inputs.
	var up swDeployment
	status, raw := st.Do(t, http.MethodPut, fmt.Sprintf("/api/v1/software_deployments/%d", first.ID),
		map[string]any{"action": "REDEPLOY", "input_values": map[string]any{"who": "again"}}, &up)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, 2, up.Round)
	d = waitSoftware(t, st, first.ID)
	require.Equal(t, contract.SoftwareComplete, d.Status, d.StatusReason)
	assert.Equal(t, "again from again", d.OutputValues["greeting"])
	assert.Equal(t, "REDEPLOY", d.OutputValues["action"])

	// The index: the node's deployments with their config, in one call.
	var index []swDeployment
	status, raw = getList(t, st, "/api/v1/software_deployments?server_id="+nodeName("n1"), &index)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, index, 5)
	require.NotNil(t, index[0].Config)
	assert.Equal(t, "greet", index[0].Config.Name)
	assert.Equal(t, "puppet", index[4].Config.Group)

	// A config in use cannot be deleted.
	status, raw = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/software_configs/%d", cfg.ID), nil, nil)
	assert.Equal(t, http.StatusConflict, status, "%s", raw)
}

// A repeated signal changes nothing; another node's agent is refused.
func TestSoftwareSignalIdempotentAndOwnNodeOnly(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	// n1 has no agent running: the test plays it with its credential.
	a1 := st.StartAgent(t, nodeName("n1"))
	a1.Stop()
	a2 := st.StartAgent(t, nodeName("n2"))
	a2.Stop()
	cfg := createConfig(t, st, map[string]any{"name": "c", "config": "true", "outputs": []map[string]any{{"name": "v"}}})
	d := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("n1")})
	require.Eventually(t, func() bool {
		var got swDeployment
		st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/software_deployments/%d", d.ID), nil, &got)
		return got.Status == contract.SoftwareInProgress
	}, 30*time.Second, 50*time.Millisecond)

	// The agent's long poll sees it, and then holds with the same version.
	var list struct {
		Version     string `json:"version"`
		Deployments []struct {
			ID    int64 `json:"id"`
			Round int   `json:"round"`
		} `json:"deployments"`
	}
	status, raw := testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/software_deployments?wait=0s", a1.Token(t), nil, &list)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, list.Deployments, 1)
	start := time.Now()
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/software_deployments?wait=1s&version="+list.Version, a1.Token(t), nil, nil)
	assert.Equal(t, http.StatusNotModified, status)
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "an unchanged version is held")

	path := fmt.Sprintf("%s/api/v1/agent/software_deployments/%d/signal", st.URL, d.ID)
	status, raw = testenv.Call(t, http.MethodPost, path, a2.Token(t), map[string]any{"v": "x"}, nil)
	assert.Equal(t, http.StatusForbidden, status, "%s", raw)

	status, raw = testenv.Call(t, http.MethodPost, path, a1.Token(t), map[string]any{"v": "first", "deploy_status_code": 0}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	status, raw = testenv.Call(t, http.MethodPost, path, a1.Token(t), map[string]any{"v": "second", "deploy_status_code": 1}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Contains(t, string(raw), `"repeated":true`)
	got := waitSoftware(t, st, d.ID)
	assert.Equal(t, contract.SoftwareComplete, got.Status)
	assert.Equal(t, "first", got.OutputValues["v"])
	status, _ = testenv.Call(t, http.MethodPost, path, a1.Token(t), map[string]any{"v": "third"}, nil)
	assert.Equal(t, http.StatusOK, status)
	got = waitSoftware(t, st, d.ID)
	assert.Equal(t, "first", got.OutputValues["v"])
}

// Configs are immutable, validated, and a node takes deployments only from
// its own deployment (cluster) unless its policy says otherwise.
func TestSoftwareConfigRulesAndPolicy(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	for _, name := range []string{"prod", "dev"} {
		status, raw := st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": name}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", raw)
	}
	status, raw := st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": nodeName("p1"), "deployment": "prod"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)

	cfg := createConfig(t, st, map[string]any{"name": "dev-only", "config": "true", "deployment": "dev"})
	for _, method := range []string{http.MethodPut, http.MethodPatch} {
		status, raw = st.Do(t, method, fmt.Sprintf("/api/v1/software_configs/%d", cfg.ID), map[string]any{"name": "x"}, nil)
		assert.Equal(t, http.StatusMethodNotAllowed, status)
		assert.Contains(t, string(raw), "immutable")
		assert.Contains(t, string(raw), "create a new")
	}

	for body, field := range map[string]string{
		`{"config": "true"}`:                                             "name",
		`{"name": "x", "group": "a/b"}`:                                  "group",
		`{"name": "x", "inputs": [{"name": "1bad"}]}`:                    "inputs[0].name",
		`{"name": "x", "inputs": [{"name": "a", "error_output": true}]}`: "inputs[0].error_output",
		`{"name": "x", "outputs": [{"name": "a", "type": "Blob"}]}`:      "outputs[0].type",
		`{"name": "x", "outputs": [{"name": "deploy_stdout"}]}`:          "outputs[0].name",
		`{"name": "x", "deployment": "nowhere"}`:                         "deployment",
	} {
		status, raw := st.Do(t, http.MethodPost, "/api/v1/software_configs", body, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, status, "%s → %s", body, raw)
		assert.Contains(t, string(raw), `"field":"`+field+`"`, body)
	}

	// Cross-deployment: refused, naming both deployments.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/software_deployments",
		map[string]any{"config_id": cfg.ID, "server_id": nodeName("p1")}, nil)
	assert.Equal(t, http.StatusForbidden, status, "%s", raw)
	assert.Contains(t, string(raw), `\"prod\"`)
	assert.Contains(t, string(raw), `\"dev\"`)
	// Also when the request says it acts for another deployment.
	open := createConfig(t, st, map[string]any{"name": "any", "config": "true"})
	status, raw = st.Do(t, http.MethodPost, "/api/v1/software_deployments",
		map[string]any{"config_id": open.ID, "server_id": nodeName("p1"), "deployment": "dev"}, nil)
	assert.Equal(t, http.StatusForbidden, status, "%s", raw)
	// Bad input values are refused before anything is written.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/software_deployments",
		map[string]any{"config_id": open.ID, "server_id": nodeName("p1"), "input_values": map[string]any{"nope": 1}}, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, status, "%s", raw)
	assert.Contains(t, string(raw), "input_values.nope")

	// The node's policy allows foreign configs.
	status, raw = st.Do(t, http.MethodPut, "/api/v1/nodes/"+nodeName("p1")+"/software_policy", map[string]any{"accept_foreign_configs": true}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("p1"), "timeout_sec": 1})
}

// The deployments-by-server index is one SQL query, whatever the number of
// deployments and configs.
func TestSoftwareIndexInOneQuery(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	status, raw := st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": nodeName("q1")}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	for i := range 4 {
		cfg := createConfig(t, st, map[string]any{"name": fmt.Sprintf("c%d", i), "config": "true"})
		createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("q1")})
	}
	// Let the workflows settle (IN_PROGRESS, waiting for an agent that
	// never comes) so that only the index reads the table.
	require.Eventually(t, func() bool {
		var n int64
		st.Store.DB.Model(&heat.SoftwareDeployment{}).Where("status = ?", contract.SoftwareInProgress).Count(&n)
		return n == 4
	}, 30*time.Second, 50*time.Millisecond)
	st.Do(t, http.MethodGet, "/api/v1/software_configs", nil, nil) // caches the admin token

	var queries atomic.Int64
	count := func(db *gorm.DB) {
		if strings.Contains(db.Statement.SQL.String(), "software") {
			queries.Add(1)
		}
	}
	require.NoError(t, st.Store.DB.Callback().Query().After("gorm:query").Register("test:count_software", count))
	require.NoError(t, st.Store.DB.Callback().Row().After("gorm:row").Register("test:count_software_row", count))
	require.NoError(t, st.Store.DB.Callback().Raw().After("gorm:raw").Register("test:count_software_raw", count))

	var index []swDeployment
	status, raw = getList(t, st, "/api/v1/software_deployments?server_id="+nodeName("q1"), &index)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Len(t, index, 4)
	for i, d := range index {
		require.NotNil(t, d.Config)
		assert.Equal(t, fmt.Sprintf("c%d", i), d.Config.Name)
	}
	assert.EqualValues(t, 1, queries.Load(), "the index must be one query")
}

// DELETE runs UNDEPLOY on the server first, as Heat does: the agent's hook
// sees deploy_action=UNDEPLOY, the answer is 202 with the round, GET shows
// DELETE_IN_PROGRESS meanwhile and the deployment is gone once signalled.
// A failed UNDEPLOY keeps it FAILED (DELETE_FAILED) until force; a server
// whose agent never answers is removed at the timeout.
func TestSoftwareDeleteRunsUndeploy(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	st.StartAgent(t, nodeName("n1"))
	trace := filepath.Join(t.TempDir(), "actions")
	cfg := createConfig(t, st, map[string]any{
		"name": "svc",
		"config": `#!/bin/sh
echo "$deploy_action $deploy_round" >> "$trace"
if [ "$deploy_action" = UNDEPLOY ] && [ -e "$trace.hold" ]; then sleep 2; fi
if [ "$deploy_action" = UNDEPLOY ] && [ "$fail_undeploy" = yes ]; then echo cannot >&2; exit 4; fi
exit 0`,
		"inputs": []map[string]any{{"name": "trace"}, {"name": "fail_undeploy", "default": "no"}},
	})
	d := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("n1"), "input_values": map[string]any{"trace": trace}})
	got := waitSoftware(t, st, d.ID)
	require.Equal(t, contract.SoftwareComplete, got.Status, got.StatusReason)

	// Hold the hook a moment so that GET sees the delete in progress.
	require.NoError(t, os.WriteFile(trace+".hold", nil, 0o644))
	var del struct {
		swDeployment
		Deleting   bool   `json:"deleting"`
		HeatStatus string `json:"heat_status"`
	}
	path := fmt.Sprintf("/api/v1/software_deployments/%d", d.ID)
	status, raw := st.Do(t, http.MethodDelete, path, nil, &del)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	assert.Equal(t, 2, del.Round)
	assert.Equal(t, "UNDEPLOY", del.Action)
	assert.True(t, del.Deleting)
	assert.Equal(t, "DELETE_IN_PROGRESS", del.HeatStatus)
	status, raw = st.Do(t, http.MethodGet, path, nil, &del)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, "DELETE_IN_PROGRESS", del.HeatStatus, "%s", raw)
	// A second DELETE meanwhile starts nothing new; a new round is refused.
	status, raw = st.Do(t, http.MethodDelete, path, nil, &del)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	assert.Equal(t, 2, del.Round)
	status, raw = st.Do(t, http.MethodPut, path, map[string]any{"action": "REDEPLOY"}, nil)
	assert.Equal(t, http.StatusConflict, status, "%s", raw)
	assert.Contains(t, string(raw), "being deleted")
	require.Eventually(t, func() bool {
		status, _ := st.Do(t, http.MethodGet, path, nil, nil)
		return status == http.StatusNotFound
	}, 60*time.Second, 100*time.Millisecond, "the deployment is removed after its UNDEPLOY")
	lines, err := os.ReadFile(trace)
	require.NoError(t, err)
	assert.Equal(t, "DEPLOY 1\nUNDEPLOY 2\n", string(lines), "the hook ran DEPLOY, then UNDEPLOY once")
	require.NoError(t, os.Remove(trace+".hold"))

	// A failing UNDEPLOY keeps the deployment, FAILED, saying how to go on.
	bad := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("n1"),
		"input_values": map[string]any{"trace": trace, "fail_undeploy": "yes"}})
	require.Equal(t, contract.SoftwareComplete, waitSoftware(t, st, bad.ID).Status)
	badPath := fmt.Sprintf("/api/v1/software_deployments/%d", bad.ID)
	status, raw = st.Do(t, http.MethodDelete, badPath, nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	got = waitSoftware(t, st, bad.ID)
	assert.Equal(t, contract.SoftwareFailed, got.Status)
	assert.Contains(t, got.StatusReason, "UNDEPLOY failed")
	assert.Contains(t, got.StatusReason, "deploy_status_code 4")
	st.Do(t, http.MethodGet, badPath, nil, &del)
	assert.Equal(t, "DELETE_FAILED", del.HeatStatus)
	assert.True(t, del.Deleting)
	// force removes it at once.
	status, raw = st.Do(t, http.MethodDelete, badPath+"?force=true", nil, nil)
	require.Equal(t, http.StatusNoContent, status, "%s", raw)
	status, _ = st.Do(t, http.MethodGet, badPath, nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	// A node whose agent never answers: removed once the round times out.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": nodeName("gone")}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	orphan := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("gone"), "input_values": map[string]any{"trace": trace}})
	orphanPath := fmt.Sprintf("/api/v1/software_deployments/%d", orphan.ID)
	for _, bad := range []string{"?timeout_sec=0", "?timeout_sec=x", "?force=maybe"} {
		status, raw = st.Do(t, http.MethodDelete, orphanPath+bad, nil, nil)
		assert.Equal(t, http.StatusBadRequest, status, "%s: %s", bad, raw)
	}
	start := time.Now()
	status, raw = st.Do(t, http.MethodDelete, orphanPath+"?timeout_sec=2", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	require.Eventually(t, func() bool {
		status, _ := st.Do(t, http.MethodGet, orphanPath, nil, nil)
		return status == http.StatusNotFound
	}, 60*time.Second, 100*time.Millisecond, "removed at the timeout")
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "not before the timeout")
}
