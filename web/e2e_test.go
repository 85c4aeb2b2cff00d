package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"
	"go.temporal.io/api/proxy"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/codec"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// testRelease has a controller (database + api) and compute nodes whose
// hypervisor task waits for the controller's api across nodes; the `flaky`
// tag carries a task that fails and one that depends on it.
const testRelease = `
name: e2e
version: "1"
roles_metadata:
  controller: {tags: [database, api]}
  compute: {tags: [hypervisor]}
  broken: {tags: [flaky]}
graphs:
  deployment:
    metadata:
      on_success: {node_attributes: {status: ready, deployed_by: anneal}}
      on_error: {node_attributes: {status: error, error_type: deploy}}
      on_stop: null
    tasks:
      - id: base
        tags: ["/.*/"]
        parameters: {cmd: "echo base on $ANNEAL_NODE; touch base-done", timeout: 30}
      - id: database
        tags: [database]
        requires: [base]
        parameters: {cmd: "echo dsn=pg://$ANNEAL_NODE/app >> $ANNEAL_OUTPUTS", timeout: 30}
      - id: api
        tags: [api]
        requires: [database]
        parameters: {cmd: "sleep 1; echo api up", timeout: 30}
      - id: hypervisor
        tags: [hypervisor]
        requires: [base]
        cross_depends: [{name: api, tags: [api]}]
        parameters: {cmd: "test -f base-done && echo joined", timeout: 30}
      - id: fails
        tags: [flaky]
        requires: [base]
        parameters: {cmd: "echo about to fail >&2; exit 3", timeout: 30}
      - id: after-fails
        tags: [flaky]
        requires: [fails]
        parameters: {cmd: "echo never", timeout: 30}
  fixable:
    tasks:
      - id: prepare
        tags: [controller]
        parameters: {cmd: "echo once >> prepared", timeout: 30}
      - id: needs-fix
        tags: [controller]
        requires: [prepare]
        parameters: {cmd: "test -f fixed || { echo not fixed >&2; exit 3; }", timeout: 30}
      - id: after-fix
        tags: [controller]
        requires: [needs-fix]
        parameters: {cmd: "echo after", timeout: 30}
  valves:
    tasks:
      - id: boom
        tags: [flaky]
        parameters: {cmd: "exit 1", timeout: 30}
      - id: slow
        tags: [hypervisor]
        parameters: {cmd: "sleep 2", timeout: 30}
      - id: after-slow
        tags: [hypervisor]
        requires: [slow]
        parameters: {cmd: "echo after", timeout: 30}
  produce:
    tasks:
      - id: mint
        tags: [controller]
        parameters: {cmd: "echo token=abc-$ANNEAL_NODE >> $ANNEAL_OUTPUTS", timeout: 30}
  consume:
    tasks:
      - id: use
        tags: [controller]
        parameters: {cmd: "test \"$ANNEAL_OUT_MINT_TOKEN\" = \"abc-$ANNEAL_NODE\" && echo got $ANNEAL_OUT_MINT_TOKEN", timeout: 30}
      - id: peer
        tags: [hypervisor]
        parameters: {cmd: "echo \"$ANNEAL_CONTEXT\" | grep -q '\"token\":\"abc-' && echo saw the controller token", timeout: 30}
  special:
    tasks:
      - id: upload
        type: upload_file
        tags: [controller]
        parameters: {path: "conf/app.conf", data: "port=80\n", permissions: "0600"}
      - id: copy
        type: sync
        tags: [controller]
        requires: [upload]
        parameters: {src: conf, dst: backup/conf}
      - id: check
        tags: [controller]
        requires: [copy]
        parameters: {cmd: "grep -q port=80 backup/conf/app.conf && stat -c %a conf/app.conf"}
      - id: not-now
        type: skipped
        tags: [controller]
      - id: on-master
        type: master_shell
        tags: [controller]
        parameters: {cmd: "echo node=$ANNEAL_NODE roles=$ANNEAL_NODE_ROLES && echo seen=$ANNEAL_NODE >> $ANNEAL_OUTPUTS"}
  teardown:
    tasks:
      - id: erase
        type: erase_node
        tags: [hypervisor]
      - id: to-bootstrap
        type: move_to_bootstrap
        tags: [hypervisor]
        requires: [erase]
  rebooting:
    tasks:
      - id: restart
        type: reboot
        tags: [controller]
        parameters: {timeout: 3}
      - id: after-reboot
        tags: [controller]
        requires: [restart]
        parameters: {cmd: "echo back"}
  solo:
    tasks:
      - id: solo
        tags: ["/.*/"]
        parameters: {cmd: "sleep 0.3", timeout: 30}
  slow:
    tasks:
      - id: long
        tags: [controller]
        parameters: {cmd: "sleep 3; echo finished anyway", timeout: 30}
      - id: next
        tags: [controller]
        requires: [long]
        parameters: {cmd: "echo next", timeout: 30}
`

const domain = "anneal.test"

func nodeName(short string) string { return short + "." + domain }

// setup imports the test release, creates deployment "d1" and starts one
// agent per role assignment.
func setup(t *testing.T, st *testenv.Stack, roles map[string][]string) map[string]*testenv.Agent {
	t.Helper()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(testRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "e2e"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	agents := map[string]*testenv.Agent{}
	for short, rs := range roles {
		agents[short] = st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short),
			map[string]any{"deployment": "d1", "roles": rs}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	return agents
}

type executeAnswer struct {
	TaskUUID   string `json:"task_uuid"`
	WorkflowID string `json:"workflow_id"`
}

func execute(t *testing.T, st *testenv.Stack, body any) executeAnswer {
	t.Helper()
	var out executeAnswer
	status, raw := st.Do(t, http.MethodPost, "/api/v1/graphs/execute", body, &out)
	require.Equal(t, http.StatusAccepted, status, "%s", raw)
	require.NotEmpty(t, out.TaskUUID)
	return out
}

// waitDone polls the transaction until it leaves pending/running.
func waitDone(t *testing.T, st *testenv.Stack, id string, within time.Duration) fuel.TransactionStatus {
	t.Helper()
	var tx fuel.TransactionStatus
	require.Eventually(t, func() bool {
		tx = fuel.TransactionStatus{}
		status, _ := st.Do(t, http.MethodGet, "/api/v1/transactions/"+id, nil, &tx)
		return status == http.StatusOK && tx.Status != models.TxPending && tx.Status != models.TxRunning
	}, within, 100*time.Millisecond, "transaction %s did not finish", id)
	return tx
}

func runsByKey(t *testing.T, st *testenv.Stack, id, query string) map[string]models.TaskRun {
	t.Helper()
	var runs []models.TaskRun
	status, raw := getList(t, st, "/api/v1/transactions/"+id+"/runs"+query, &runs)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	out := map[string]models.TaskRun{}
	for _, r := range runs {
		out[r.TaskName+"@"+r.NodeName] = r
	}
	return out
}

// TestExecuteThreeNodes runs a graph on three real agents: a cross-node
// dependency is honoured, a failing task fails its run and blocks its
// descendant, and the other nodes finish.
func TestExecuteThreeNodes(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}, "odd": {"compute", "broken"}})

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	assert.Equal(t, "tx-"+ans.TaskUUID, ans.WorkflowID)
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)

	assert.Equal(t, models.TxError, tx.Status)
	assert.Contains(t, tx.Error, "fails@"+nodeName("odd"))
	assert.Equal(t, 100, tx.Progress)
	assert.Equal(t, map[string]int{"succeeded": 7, "failed": 1, "blocked": 1}, tx.Counts)

	runs := runsByKey(t, st, ans.TaskUUID, "")
	require.Len(t, runs, 9)
	for _, n := range []string{"ctl", "cmp", "odd"} {
		assert.Equal(t, contract.RunSucceeded, runs["base@"+nodeName(n)].State, n)
	}
	db := runs["database@"+nodeName("ctl")]
	assert.Equal(t, map[string]string{"dsn": "pg://" + nodeName("ctl") + "/app"}, db.Outputs)
	api := runs["api@"+nodeName("ctl")]
	assert.Contains(t, api.StdoutTail, "api up")
	for _, n := range []string{"cmp", "odd"} {
		hv := runs["hypervisor@"+nodeName(n)]
		require.Equal(t, contract.RunSucceeded, hv.State, n)
		require.NotNil(t, hv.StartedAt)
		assert.False(t, hv.StartedAt.Before(*api.FinishedAt), "hypervisor on %s started before the api finished", n)
	}
	fails := runs["fails@"+nodeName("odd")]
	assert.Equal(t, contract.RunFailed, fails.State)
	require.NotNil(t, fails.ExitCode)
	assert.Equal(t, 3, *fails.ExitCode)
	assert.Contains(t, fails.StderrTail, "about to fail")
	assert.Equal(t, contract.RunBlocked, runs["after-fails@"+nodeName("odd")].State)

	// The graph's callbacks set the nodes' status (Fuel's "ready" is
	// stored as deployed; "error" is computed from error_type).
	for n, want := range map[string][2]string{"ctl": {"deployed", "deployed"}, "cmp": {"deployed", "deployed"}, "odd": {"discover", "error"}} {
		var node struct {
			models.Node
			ComputedStatus string `json:"computed_status"`
		}
		status, body := st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName(n), nil, &node)
		require.Equal(t, http.StatusOK, status, "%s", body)
		assert.Equal(t, want[0], node.Status, n)
		assert.Equal(t, want[1], node.ComputedStatus, n)
		assert.Equal(t, 100, node.Progress, n)
	}
	var odd models.Node
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("odd"), nil, &odd)
	require.NotNil(t, odd.ErrorType)
	assert.Equal(t, "deploy", *odd.ErrorType)

	// Filters of the runs listing.
	failed := runsByKey(t, st, ans.TaskUUID, "?state=failed")
	assert.Len(t, failed, 1)
	onCtl := runsByKey(t, st, ans.TaskUUID, "?node="+nodeName("ctl"))
	assert.Len(t, onCtl, 3)

	recordHistories(t, st, map[string]string{
		"transaction-with-failure":   ans.WorkflowID,
		"node-waiting-on-other-node": ans.WorkflowID + "/" + nodeName("cmp"),
		"node-with-failure":          ans.WorkflowID + "/" + nodeName("odd"),
		"node-with-remote-children":  ans.WorkflowID + "/" + nodeName("ctl"),
		// Recorded once a node's ready runs went to its agent as chains
		// (node-chain).
		"node-chain-waiting-on-other-node": ans.WorkflowID + "/" + nodeName("cmp"),
		"node-chain-with-failure":          ans.WorkflowID + "/" + nodeName("odd"),
		"node-chain-with-remote-children":  ans.WorkflowID + "/" + nodeName("ctl"),
	})
}

// TestAgentSeesOnlyItsOwnNode: another node's agent cannot report, or
// heartbeat, a run that is not its node's.
func TestAgentSeesOnlyItsOwnNode(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 20})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	waitDone(t, st, ans.TaskUUID, 60*time.Second)
	ctlRun := runsByKey(t, st, ans.TaskUUID, "")["api@"+nodeName("ctl")]

	other := agents["cmp"].Token(t)
	report := map[string]any{"attempt": ctlRun.Attempt, "exit_code": 0}
	status, body := testenv.Call(t, http.MethodPost, fmt.Sprintf("%s/api/v1/agent/runs/%d/result", st.URL, ctlRun.ID), other, report, nil)
	assert.Equal(t, http.StatusForbidden, status, "%s", body)
	status, body = testenv.Call(t, http.MethodPost, fmt.Sprintf("%s/api/v1/agent/runs/%d/heartbeat", st.URL, ctlRun.ID), other, map[string]any{}, nil)
	assert.Equal(t, http.StatusForbidden, status, "%s", body)
	// The owner may (a repeated report changes nothing, even with another
	// exit code).
	own := agents["ctl"].Token(t)
	report["exit_code"] = 7
	status, body = testenv.Call(t, http.MethodPost, fmt.Sprintf("%s/api/v1/agent/runs/%d/result", st.URL, ctlRun.ID), own, report, nil)
	assert.Equal(t, http.StatusOK, status, "%s", body)
	again := runsByKey(t, st, ans.TaskUUID, "")["api@"+nodeName("ctl")]
	assert.Equal(t, contract.RunSucceeded, again.State)
	require.NotNil(t, again.ExitCode)
	assert.Equal(t, 0, *again.ExitCode)
	// An agent's credential opens no operator route, and an operator token
	// is not an agent's.
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes", other, nil, nil)
	assert.Equal(t, http.StatusForbidden, status)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/work?wait=0s", st.AdminToken, nil, nil)
	assert.Equal(t, http.StatusForbidden, status)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes", "", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes", st.EnrollToken, nil, nil)
	assert.Equal(t, http.StatusForbidden, status)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/healthz", "", nil, nil)
	assert.Equal(t, http.StatusOK, status)
}

// TestDeadAgentFailsTheRun: a node whose agent died gets its run failed by
// the heartbeat timeout, not a hang.
func TestDeadAgentFailsTheRun(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 2})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}})
	agents["cmp"].Stop()
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	assert.Equal(t, models.TxError, tx.Status)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	base := runs["base@"+nodeName("cmp")]
	assert.Equal(t, contract.RunFailed, base.State)
	assert.Contains(t, base.Error, "no result from the node's agent")
	assert.Equal(t, contract.RunBlocked, runs["hypervisor@"+nodeName("cmp")].State)
	assert.Equal(t, contract.RunSucceeded, runs["api@"+nodeName("ctl")].State)
}

// TestCancelWithTemporal: cancelling the workflow (what `temporal workflow
// cancel` does) lets the running task finish, cancels what never started,
// and leaves the transaction stopped.
func TestCancelWithTemporal(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "slow"}}})
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("ctl")].State == contract.RunRunning
	}, 20*time.Second, 50*time.Millisecond)
	require.NoError(t, st.Temporal.CancelWorkflow(context.Background(), ans.WorkflowID, ""))
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	assert.Equal(t, models.TxStopped, tx.Status)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunSucceeded, runs["long@"+nodeName("ctl")].State)
	assert.Contains(t, runs["long@"+nodeName("ctl")].StdoutTail, "finished anyway")
	assert.Equal(t, contract.RunCancelled, runs["next@"+nodeName("ctl")].State)
}

// TestExecuteBadInput: bad requests get a 4xx naming the field, and nothing
// is written.
func TestExecuteBadInput(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	cyclic := `
name: cyclic
roles_metadata:
  controller: {tags: []}
graphs:
  deployment:
    tasks:
      - {id: a, tags: [controller], cross_depends: [{name: b}], parameters: {cmd: "true"}}
      - {id: b, tags: [controller], cross_depends: [{name: a}], parameters: {cmd: "true"}}
`
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(cyclic), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "loop", "release": "cyclic"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("ctl"), map[string]any{"deployment": "loop", "roles": []string{"controller"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d2", "release": "e2e"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)

	cases := []struct {
		name   string
		body   string
		status int
		field  string
		reason string
	}{
		{"malformed JSON", `{"deployment": "d1", "graphs": [`, 400, "body", "malformed JSON"},
		{"empty body", ``, 400, "body", "empty body"},
		{"unknown field", `{"deployment": "d1", "graphs": [{"type": "deployment"}], "colour": 1}`, 400, "colour", "unknown field"},
		{"wrong type", `{"deployment": "d1", "graphs": [{"type": "deployment", "nodes": "all"}]}`, 400, "graphs.nodes", "must be"},
		{"missing deployment", `{"graphs": [{"type": "deployment"}]}`, 422, "deployment", "is required"},
		{"unknown deployment", `{"deployment": "nope", "graphs": [{"type": "deployment"}]}`, 422, "deployment", `no deployment named or numbered "nope"`},
		{"no graphs", `{"deployment": "d1", "graphs": []}`, 422, "graphs", "at least one graph"},
		{"unknown graph type", `{"deployment": "d1", "graphs": [{"type": "teleport"}]}`, 422, "graphs[0].type", `no graph of type "teleport"`},
		{"node of another deployment", `{"deployment": "d2", "graphs": [{"type": "deployment", "nodes": [1]}]}`, 422, "graphs[0].nodes[0]", "is not in deployment"},
		{"unknown task", `{"deployment": "d1", "graphs": [{"type": "deployment", "tasks": ["nope"]}]}`, 422, "graphs[0].tasks[0]", `has no task "nope"`},
		{"cycle", `{"deployment": "loop", "graphs": [{"type": "deployment"}]}`, 422, "graphs[0]", "cycle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var answer struct {
				Error struct {
					Code    string         `json:"code"`
					Message string         `json:"message"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			status, raw := st.Do(t, http.MethodPost, "/api/v1/graphs/execute", tc.body, nil)
			require.Equal(t, tc.status, status, "%s", raw)
			require.NoError(t, jsonUnmarshal(raw, &answer))
			assert.Equal(t, tc.field, answer.Error.Details["field"], "%s", raw)
			assert.Contains(t, answer.Error.Message, tc.reason)
		})
	}
	var count int64
	require.NoError(t, st.Store.DB.Model(&fuel.Transaction{}).Count(&count).Error)
	assert.Zero(t, count, "a refused request wrote a transaction")
	require.NoError(t, st.Store.DB.Model(&models.TaskRun{}).Count(&count).Error)
	assert.Zero(t, count, "a refused request wrote runs")
}

// TestRetryWithTemporalReset: resetting a failed transaction's workflow to
// its first workflow task (what `temporal workflow reset --type
// FirstWorkflowTask` does) runs again what did not succeed.
func TestRetryWithTemporalReset(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "fixable"}}})
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	require.Equal(t, models.TxError, tx.Status)
	require.Equal(t, contract.RunBlocked, runsByKey(t, st, ans.TaskUUID, "")["after-fix@"+nodeName("ctl")].State)

	require.NoError(t, os.WriteFile(filepath.Join(agents["ctl"].WorkDir, "fixed"), nil, 0o644))
	ctx := context.Background()
	iter := st.Temporal.GetWorkflowHistory(ctx, ans.WorkflowID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var firstTask int64
	for iter.HasNext() && firstTask == 0 {
		ev, err := iter.Next()
		require.NoError(t, err)
		if ev.GetEventType() == enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			firstTask = ev.GetEventId()
		}
	}
	_, err := st.Temporal.ResetWorkflowExecution(ctx, &workflowservice.ResetWorkflowExecutionRequest{
		Namespace:                 "default",
		WorkflowExecution:         &common.WorkflowExecution{WorkflowId: ans.WorkflowID},
		Reason:                    "retry after the fix",
		WorkflowTaskFinishEventId: firstTask,
		RequestId:                 uuid.NewString(),
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var cur fuel.TransactionStatus
		st.Do(t, http.MethodGet, "/api/v1/transactions/"+ans.TaskUUID, nil, &cur)
		return cur.Status == models.TxReady
	}, 30*time.Second, 100*time.Millisecond)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunSucceeded, runs["needs-fix@"+nodeName("ctl")].State)
	assert.Equal(t, contract.RunSucceeded, runs["after-fix@"+nodeName("ctl")].State)
}

// recordHistories writes the histories of finished workflows to
// workflows/testdata, when ANNEAL_RECORD_HISTORIES is set, for the replay
// test that guards determinism across upgrades. A history already recorded
// is never written again: new code must replay the old histories as they
// are, so a new fixture gets a new name.
func recordHistories(t *testing.T, st *testenv.Stack, workflowIDs map[string]string) {
	if os.Getenv("ANNEAL_RECORD_HISTORIES") == "" {
		return
	}
	ctx := context.Background()
	for name, id := range workflowIDs {
		file := filepath.Join("..", "workflows", "testdata", name+".history.json")
		if _, err := os.Stat(file); err == nil {
			t.Logf("%s is recorded already; not re-recorded", file)
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_ = st.Temporal.GetWorkflow(wctx, id, "").Get(wctx, nil) // closed, whatever its result
		cancel()
		iter := st.Temporal.GetWorkflowHistory(ctx, id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		var hist history.History
		for iter.HasNext() {
			ev, err := iter.Next()
			require.NoError(t, err)
			// Recorded histories are kept plain (the test binary's key is
			// thrown away): decode the payloads before writing them.
			dec := &codec.Codec{Keys: testenv.Keys()}
			require.NoError(t, proxy.VisitPayloads(ctx, ev, proxy.VisitPayloadsOptions{
				SkipSearchAttributes: true,
				Visitor: func(_ *proxy.VisitPayloadsContext, ps []*common.Payload) ([]*common.Payload, error) {
					return dec.Decode(ps)
				},
			}))
			hist.Events = append(hist.Events, ev)
		}
		raw, err := protojson.MarshalOptions{Indent: " "}.Marshal(&hist)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(file, raw, 0o644))
	}
}

// TestWorkerGoneMidRun: the worker going away while a task runs loses
// nothing; the agent's report waits in Temporal and a new worker finishes
// the transaction. The node's two tasks form a chain, so the API hands
// out the second one itself when the first is reported: the node goes on
// while no worker runs.
func TestWorkerGoneMidRun(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 20})
	setup(t, st, map[string][]string{"ctl": {"controller"}})
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "slow"}}})
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("ctl")].State == contract.RunRunning
	}, 20*time.Second, 50*time.Millisecond)
	st.StopWorker()
	// The task finishes and is reported while no worker runs.
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("ctl")].State == contract.RunSucceeded
	}, 20*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["next@"+nodeName("ctl")].State == contract.RunSucceeded
	}, 20*time.Second, 100*time.Millisecond, "the chain goes on without the worker")
	st.StartWorker(t)
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	assert.Equal(t, models.TxReady, tx.Status)
	assert.Equal(t, contract.RunSucceeded, runsByKey(t, st, ans.TaskUUID, "")["next@"+nodeName("ctl")].State)
}
