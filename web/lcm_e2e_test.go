package web_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// lcmRelease: every task appends its name to the file "executed" in its
// agent's work directory, so the nodes themselves say what ran. database
// hands its dsn to the compute nodes' hypervisor task, which reads the
// cpu_ratio it is given in $ANNEAL_ATTRS.
const lcmRelease = `
name: lcm
version: "1"
roles_metadata:
  controller: {tags: [database]}
  compute: {tags: [hypervisor]}
graphs:
  deployment:
    tasks:
      - id: base
        tags: ["/.*/"]
        parameters: {cmd: "echo base >> executed", timeout: 30}
      - id: database
        tags: [database]
        requires: [base]
        parameters: {cmd: "echo database >> executed; echo dsn=pg://db/app >> $ANNEAL_OUTPUTS", timeout: 30}
      - id: hypervisor
        tags: [hypervisor]
        requires: [base]
        cross_depends: [{name: database, tags: [database]}]
        parameters:
          cmd: >-
            echo hypervisor >> executed;
            echo "dsn=$(echo "$ANNEAL_CONTEXT" | grep -o '"database@[^}]*' | grep -o 'pg://[a-z/]*')" >> $ANNEAL_OUTPUTS;
            echo "ratio=$(grep -o '"cpu_ratio":[0-9]*' "$ANNEAL_ATTRS" | cut -d: -f2)" >> $ANNEAL_OUTPUTS
          timeout: 30
`

// TestLCMReRunsWhatSeesAChange deploys the same graph again and again on
// real agents. Unchanged, everything is skipped; a changed node attribute
// re-runs exactly the tasks of that node (they see it in $ANNEAL_ATTRS); a
// changed deployment role's data re-runs the tasks of the nodes with that
// role, and their dependants on other nodes, which read the same outputs,
// are skipped when they come to run.
func TestLCMReRunsWhatSeesAChange(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(lcmRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]any{"name": "d1", "release": "lcm",
		"attributes": map[string]any{"cpu_ratio": 2}}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	agents := map[string]*testenv.Agent{}
	for short, role := range map[string]string{"ctl": "controller", "cmp1": "compute", "cmp2": "compute"} {
		agents[short] = st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short), map[string]any{"deployment": "d1", "roles": []string{role}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	executed := func() map[string]string {
		out := map[string]string{}
		for short, a := range agents {
			raw, err := os.ReadFile(filepath.Join(a.WorkDir, "executed"))
			if !os.IsNotExist(err) {
				require.NoError(t, err)
			}
			out[short] = strings.Join(strings.Fields(string(raw)), " ")
		}
		return out
	}
	deploy := func() map[string]models.TaskRun {
		t.Helper()
		ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
		tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
		require.Equal(t, models.TxReady, tx.Status, tx.Error)
		return runsByKey(t, st, ans.TaskUUID, "")
	}
	states := func(runs map[string]models.TaskRun) map[string]string {
		out := map[string]string{}
		for k, r := range runs {
			out[strings.TrimSuffix(k, "."+domain)] = r.State
		}
		return out
	}
	const ok, skip = contract.RunSucceeded, contract.RunSkipped

	first := deploy()
	assert.Equal(t, map[string]string{"base@ctl": ok, "database@ctl": ok, "base@cmp1": ok, "hypervisor@cmp1": ok,
		"base@cmp2": ok, "hypervisor@cmp2": ok}, states(first))
	assert.Equal(t, map[string]string{"ctl": "base database", "cmp1": "base hypervisor", "cmp2": "base hypervisor"}, executed())
	hv := first["hypervisor@"+nodeName("cmp1")]
	assert.Equal(t, map[string]string{"dsn": "pg://db/app", "ratio": "2"}, hv.Outputs, "reads the deployment's attributes and the database's outputs")
	assert.Equal(t, nodeName("cmp1"), hv.AttrsIn["anneal"].(map[string]any)["node"])

	// Nothing changed: nothing runs.
	assert.Equal(t, map[string]string{"base@ctl": skip, "database@ctl": skip, "base@cmp1": skip, "hypervisor@cmp1": skip,
		"base@cmp2": skip, "hypervisor@cmp2": skip}, states(deploy()))
	assert.Equal(t, map[string]string{"ctl": "base database", "cmp1": "base hypervisor", "cmp2": "base hypervisor"}, executed())

	// A node attribute: that node's tasks run, and see it.
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("cmp1"), map[string]any{"attributes": map[string]any{"cpu_ratio": 8}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	runs := deploy()
	assert.Equal(t, map[string]string{"base@ctl": skip, "database@ctl": skip, "base@cmp1": ok, "hypervisor@cmp1": ok,
		"base@cmp2": skip, "hypervisor@cmp2": skip}, states(runs))
	assert.Equal(t, map[string]string{"ctl": "base database", "cmp1": "base hypervisor base hypervisor", "cmp2": "base hypervisor"}, executed())
	assert.Equal(t, "8", runs["hypervisor@"+nodeName("cmp1")].Outputs["ratio"], "the node's attribute over the deployment's")
	assert.Equal(t, "pg://db/app", runs["hypervisor@"+nodeName("cmp1")].Outputs["dsn"], "a skipped database still hands over its outputs")

	// A deployment role's data: the controller's tasks run; the database
	// hands over the same dsn, so the hypervisors, which wait for it, are
	// skipped when their turn comes.
	status, body = st.Do(t, http.MethodPut, "/api/v1/deployments/d1/roles/controller", map[string]any{"data": map[string]any{"pool": 20}}, nil)
	require.True(t, status == http.StatusOK || status == http.StatusCreated, "%d %s", status, body)
	runs = deploy()
	assert.Equal(t, map[string]string{"base@ctl": ok, "database@ctl": ok, "base@cmp1": skip, "hypervisor@cmp1": skip,
		"base@cmp2": skip, "hypervisor@cmp2": skip}, states(runs))
	assert.Equal(t, map[string]string{"ctl": "base database base database", "cmp1": "base hypervisor base hypervisor", "cmp2": "base hypervisor"}, executed())
	assert.Contains(t, runs["hypervisor@"+nodeName("cmp2")].Error, "same outputs")

	// The deployment's attributes: every task sees them, but cmp1's own
	// cpu_ratio hides the deployment's, so what its tasks see is unchanged.
	status, body = st.Do(t, http.MethodPatch, "/api/v1/deployments/d1", map[string]any{"attributes": map[string]any{"cpu_ratio": 3}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	runs = deploy()
	assert.Equal(t, map[string]string{"base@ctl": ok, "database@ctl": ok, "base@cmp1": skip, "hypervisor@cmp1": skip,
		"base@cmp2": ok, "hypervisor@cmp2": ok}, states(runs))
	assert.Equal(t, "3", runs["hypervisor@"+nodeName("cmp2")].Outputs["ratio"])
	assert.Equal(t, "8", runs["hypervisor@"+nodeName("cmp1")].Outputs["ratio"], "skipped: carries its last run's outputs")

	// Bad input names the field and changes nothing.
	for _, c := range []struct{ method, path string }{{http.MethodPatch, "/api/v1/nodes/" + nodeName("cmp1")}, {http.MethodPatch, "/api/v1/deployments/d1"}} {
		var e struct {
			Error struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		status, body = st.Do(t, c.method, c.path, map[string]any{"attributes": []int{5}}, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, status, "%s %s: %s", c.method, c.path, body)
		require.NoError(t, json.Unmarshal(body, &e))
		assert.Equal(t, "attributes", e.Error.Details["field"], "%s", body)
	}
	status, _ = st.Do(t, http.MethodPatch, "/api/v1/deployments/nope", map[string]any{"attributes": map[string]any{}}, nil)
	assert.Equal(t, http.StatusNotFound, status)
	var dep models.Deployment
	status, _ = st.Do(t, http.MethodGet, "/api/v1/deployments/d1", nil, &dep)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, map[string]any{"cpu_ratio": float64(3)}, dep.Attributes)
}
