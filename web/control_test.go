package web_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	workflowpb "go.temporal.io/api/workflow/v1"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/codec"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestStopThroughTheAPI: POST /stop lets the running task finish, cancels
// the rest, and the transaction ends stopped; stopping it again is a 409.
func TestStopThroughTheAPI(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "slow"}}})
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("ctl")].State == contract.RunRunning
	}, 20*time.Second, 50*time.Millisecond)
	// The node's two tasks went as one chain: in Temporal (the Web UI)
	// the node's pending activity is a RunChainOnNode whose heartbeat
	// details name the task running now.
	long := runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("ctl")]
	var pending *workflowpb.PendingActivityInfo
	require.Eventually(t, func() bool {
		desc, err := st.Temporal.DescribeWorkflowExecution(t.Context(), contract.NodeWorkflowID(ans.TaskUUID, nodeName("ctl")), "")
		require.NoError(t, err)
		if len(desc.PendingActivities) != 1 || desc.PendingActivities[0].HeartbeatDetails == nil {
			return false
		}
		pending = desc.PendingActivities[0]
		return true
	}, 20*time.Second, 100*time.Millisecond)
	assert.Equal(t, contract.RunChainOnNodeActivity, pending.ActivityType.GetName())
	var details string
	require.NoError(t, codec.DataConverter(testenv.Keys()).FromPayloads(pending.HeartbeatDetails, &details))
	assert.Equal(t, fmt.Sprintf("running long (run %d, attempt 1)", long.ID), details)
	status, body := st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/stop", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	assert.Equal(t, models.TxStopped, tx.Status)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunSucceeded, runs["long@"+nodeName("ctl")].State)
	assert.Equal(t, contract.RunCancelled, runs["next@"+nodeName("ctl")].State)
	status, _ = st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/stop", nil, nil)
	assert.Equal(t, http.StatusConflict, status)
	// Recorded at node-chain version 3: a chain cut by the stop.
	recordHistories(t, st, map[string]string{"node-chain-stopped": ans.WorkflowID + "/" + nodeName("ctl")})
}

// TestRetryResumesFromTheFailedTask: POST /retry reruns the failed task and
// its blocked descendant, not the task that had succeeded.
func TestRetryResumesFromTheFailedTask(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "fixable"}}})
	require.Equal(t, models.TxError, waitDone(t, st, ans.TaskUUID, 30*time.Second).Status)
	status, _ := st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/retry", nil, nil)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, models.TxError, waitDone(t, st, ans.TaskUUID, 30*time.Second).Status, "still broken")

	require.NoError(t, os.WriteFile(filepath.Join(agents["ctl"].WorkDir, "fixed"), nil, 0o644))
	status, body := st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/retry", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	for _, task := range []string{"prepare", "needs-fix", "after-fix"} {
		assert.Equal(t, contract.RunSucceeded, runs[task+"@"+nodeName("ctl")].State, task)
	}
	prepared, err := os.ReadFile(filepath.Join(agents["ctl"].WorkDir, "prepared"))
	require.NoError(t, err)
	assert.Equal(t, "once\n", string(prepared), "the task that had succeeded did not run again")
	assert.Equal(t, 3, runs["needs-fix@"+nodeName("ctl")].Attempt, "one attempt per execution")

	status, _ = st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/retry", nil, nil)
	assert.Equal(t, http.StatusConflict, status, "a transaction that succeeded has nothing to retry")
}

// TestFailureThresholdStopsTheOtherNodes: with a threshold of 0%, the first
// failed node stops the others; their running task finishes, the rest is
// cancelled, and the transaction says why.
func TestFailureThresholdStopsTheOtherNodes(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"bad": {"broken"}, "c1": {"compute"}, "c2": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "failure_threshold": 0,
		"graphs": []map[string]any{{"type": "valves"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	assert.Equal(t, models.TxError, tx.Status)
	assert.Contains(t, tx.Error, "failure threshold of 0%")
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunFailed, runs["boom@"+nodeName("bad")].State)
	for _, n := range []string{"c1", "c2"} {
		assert.Equal(t, contract.RunSucceeded, runs["slow@"+nodeName(n)].State, n)
		assert.Equal(t, contract.RunCancelled, runs["after-slow@"+nodeName(n)].State, n)
	}

	status, body := st.Do(t, http.MethodPost, "/api/v1/graphs/execute",
		map[string]any{"deployment": "d1", "failure_threshold": 101, "graphs": []map[string]any{{"type": "valves"}}}, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, status)
	assert.Contains(t, string(body), `"field":"failure_threshold"`)
}

// TestConcurrencyCap: with max_nodes_in_flight 1 the nodes take their turn.
func TestConcurrencyCap(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"c1": {"compute"}, "c2": {"compute"}, "c3": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "solo", "max_nodes_in_flight": 1}}})
	require.Equal(t, models.TxReady, waitDone(t, st, ans.TaskUUID, 60*time.Second).Status)
	var runs []models.TaskRun
	for key, r := range runsByKey(t, st, ans.TaskUUID, "") {
		require.True(t, strings.HasPrefix(key, "solo@"))
		runs = append(runs, r)
	}
	require.Len(t, runs, 3)
	sort.Slice(runs, func(i, j int) bool { return runs[i].StartedAt.Before(*runs[j].StartedAt) })
	for i := 1; i < len(runs); i++ {
		assert.False(t, runs[i].StartedAt.Before(*runs[i-1].FinishedAt), "%s overlapped %s", runs[i].NodeName, runs[i-1].NodeName)
	}
}

// TestSecondGraphReadsTheFirstGraphsOutputs: a two-graph transaction runs
// the graphs in order, and the second graph's tasks see the outputs of the
// first: their own node's as ANNEAL_OUT_<TASK>_<KEY>, everyone's in
// ANNEAL_CONTEXT.
func TestSecondGraphReadsTheFirstGraphsOutputs(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1",
		"graphs": []map[string]any{{"type": "produce"}, {"type": "consume"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	mint, use := runs["mint@"+nodeName("ctl")], runs["use@"+nodeName("ctl")]
	assert.Equal(t, 0, mint.GraphIndex)
	assert.Equal(t, 1, use.GraphIndex)
	assert.False(t, use.StartedAt.Before(*mint.FinishedAt))
	assert.Contains(t, use.StdoutTail, "got abc-"+nodeName("ctl"))
	assert.Contains(t, runs["peer@"+nodeName("cmp")].StdoutTail, "saw the controller token")
}

// TestFuelClientFlags: the flags of `fuel2 graph execute` (--env, --nodes,
// --graph-types, --task-names, --dry-run) map onto the execute call.
func TestFuelClientFlags(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	var node models.Node
	status, _ := st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("ctl"), nil, &node)
	require.Equal(t, http.StatusOK, status)
	ans := execute(t, st, map[string]any{"cluster": "d1", "graph_types": []string{"deployment", "fixable"},
		"nodes": []int64{node.ID}, "dry_run": true})
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	assert.Equal(t, []fuel.GraphRequest{
		{Type: "deployment", Nodes: []int64{node.ID}},
		{Type: "fixable", Nodes: []int64{node.ID}},
	}, tx.Graphs)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.ElementsMatch(t, []string{"base", "database", "api", "prepare", "needs-fix", "after-fix"}, taskNames(runs),
		"only the controller's tasks: the compute node is not in --nodes")
	for _, r := range runs {
		assert.Equal(t, contract.RunPlanned, r.State, "a dry run touches no node")
	}

	// --task-names runs only those tasks (fuel2's default graph type).
	ans = execute(t, st, map[string]any{"cluster": "d1", "task_names": []string{"api"}, "dry_run": true})
	require.Equal(t, models.TxReady, waitDone(t, st, ans.TaskUUID, 30*time.Second).Status)
	assert.Equal(t, []string{"api@" + nodeName("ctl")}, keys(runsByKey(t, st, ans.TaskUUID, "")))

	status, body := st.Do(t, http.MethodPost, "/api/v1/graphs/execute",
		map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}, "graph_types": []string{"deployment"}}, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, status, "%s", body)
	assert.Contains(t, string(body), `"field":"graph_types"`)
}

func taskNames(runs map[string]models.TaskRun) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.TaskName)
	}
	return out
}

// TestSpecialTasks: upload_file, sync and erase_node run on the node as
// shell, master_shell runs on the orchestrator with the node's context,
// skipped is recorded as skipped, and move_to_bootstrap returns the node
// to discovery.
func TestSpecialTasks(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "special"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	ctl := nodeName("ctl")
	assert.Equal(t, "600\n", runs["check@"+ctl].StdoutTail, "the uploaded file, copied by sync, with its mode")
	assert.Equal(t, contract.RunSkipped, runs["not-now@"+ctl].State)
	master := runs["on-master@"+ctl]
	assert.Equal(t, contract.RunSucceeded, master.State)
	assert.Contains(t, master.StdoutTail, "node="+ctl+" roles=controller")
	assert.Equal(t, map[string]string{"seen": ctl}, master.Outputs)
	_, err := os.Stat(filepath.Join(agents["ctl"].WorkDir, "backup", "conf", "app.conf"))
	assert.NoError(t, err, "sync ran on the node")

	cmp := nodeName("cmp")
	require.NoError(t, os.WriteFile(filepath.Join(agents["cmp"].WorkDir, "state-file"), []byte("x"), 0o644))
	ans = execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "teardown"}}})
	tx = waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	_, err = os.Stat(filepath.Join(agents["cmp"].WorkDir, "state-file"))
	assert.True(t, os.IsNotExist(err), "erase_node wiped the node's state")
	_, err = os.Stat(filepath.Join(agents["cmp"].WorkDir, "credential.json"))
	assert.NoError(t, err, "but kept its credential")
	var node models.Node
	status, _ := st.Do(t, http.MethodGet, "/api/v1/nodes/"+cmp, nil, &node)
	require.Equal(t, http.StatusOK, status)
	var system models.Deployment
	st.Do(t, http.MethodGet, "/api/v1/deployments/system", nil, &system)
	assert.Equal(t, system.ID, node.DeploymentID, "back in the system deployment")
	assert.Empty(t, node.Roles)
	assert.Empty(t, node.Tags)
	assert.Equal(t, models.NodeDiscover, node.Status)
}

// TestReboot: a reboot task waits for the node to come back with a new
// boot id before its descendants run; a node that does not come back in
// time fails the run, naming the timeout.
func TestReboot(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	var before models.Node
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("ctl"), nil, &before)
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "rebooting"}}})
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	var after models.Node
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("ctl"), nil, &after)
	assert.NotEqual(t, before.BootID, after.BootID, "the node came back with a new boot id")
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunSucceeded, runs["after-reboot@"+nodeName("ctl")].State)

	// A machine whose reboot command does not reboot it never comes back.
	st2 := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st2.URL+"/api/v1/releases", st2.AdminToken, testenv.YAML(testRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	st2.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "e2e"}, nil)
	st2.StartAgent(t, nodeName("stuck"), func(c *daemon.Config) { c.RebootCommand = "true" })
	status, body = st2.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("stuck"), map[string]any{"deployment": "d1", "roles": []string{"controller"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	ans = execute(t, st2, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "rebooting"}}})
	tx = waitDone(t, st2, ans.TaskUUID, 30*time.Second)
	require.Equal(t, models.TxError, tx.Status)
	runs = runsByKey(t, st2, ans.TaskUUID, "")
	assert.Equal(t, contract.RunFailed, runs["restart@"+nodeName("stuck")].State)
	assert.Contains(t, runs["restart@"+nodeName("stuck")].Error, "did not come back with a new boot id within 3s")
	assert.Equal(t, contract.RunBlocked, runs["after-reboot@"+nodeName("stuck")].State)
}

// TestConcurrencyCapWithCrossNodeDependencies: with one node in flight, a
// node that waits for another ("cmp" waits for the api on "ctl", and sorts
// before it) is started after it, so the transaction cannot deadlock.
func TestConcurrencyCapWithCrossNodeDependencies(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment", "max_nodes_in_flight": 1}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.False(t, runs["base@"+nodeName("cmp")].StartedAt.Before(*runs["api@"+nodeName("ctl")].FinishedAt),
		"cmp started only after ctl finished")
}
