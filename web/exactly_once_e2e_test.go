package web_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// onceRelease has one task that appends a line to a file outside the
// agent's work directory: the node-side count of its executions.
const onceRelease = `
name: once
version: "1"
roles_metadata:
  worker: {tags: [worker]}
graphs:
  deployment:
    tasks:
      - id: count
        tags: [worker]
        parameters: {cmd: "echo ran >> %s; echo counted", timeout: 30}
`

// restartAgent runs a real agent again on a stopped one's work directory
// (its stored credential), like a node agent restarted by its init system.
// It returns what stops it again (at the test's end at the latest).
func restartAgent(t *testing.T, st *testenv.Stack, a *testenv.Agent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := daemon.Config{
		APIURL: st.URL, Name: a.Name, WorkDir: a.WorkDir, Address: a.Address, Listen: a.Address,
		HeartbeatEvery: time.Second, RunHeartbeatEvery: time.Second, PollWait: 5 * time.Second,
		RetryMin: 50 * time.Millisecond, RetryMax: time.Second, Logger: testenv.Logger(t).With("agent", a.Name),
	}
	go func() { done <- daemon.Run(ctx, cfg) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// agentDownOnN1 starts a stack with the release of text (its node-side
// count file in place of its %s) as deployment d1, and node n1 in it as a
// worker, enrolled by a real agent that is then stopped: the test makes the
// agent's requests by hand, or restarts it (restartAgent).
func agentDownOnN1(t *testing.T, text, release string) (st *testenv.Stack, count string, agent *testenv.Agent, node models.Node) {
	t.Helper()
	st = testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 30})
	count = filepath.Join(t.TempDir(), "count")
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken,
		testenv.YAML(fmt.Sprintf(text, count)), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": release}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	agent = st.StartAgent(t, nodeName("n1"))
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("n1"), map[string]any{"deployment": "d1", "roles": []string{"worker"}}, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	agent.Token(t) // enrolled before it stops
	agent.Stop()
	return st, count, agent, node
}

// TestLostClaimRunsExactlyOnce: the server hands a run out and the answer
// never reaches the agent (here: the claim is made directly on the store
// while the node's agent is down). The run is offered again once its lease
// has passed, the real agent executes it, and it executes exactly once,
// counted on the node. Agent reports out of range, or for runs that are
// unknown, foreign or finished, are 4xx.
func TestLostClaimRunsExactlyOnce(t *testing.T) {
	st, count, agent, node := agentDownOnN1(t, onceRelease, "once")
	other := st.StartAgent(t, nodeName("n2"))
	token := agent.Token(t)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	// The claim whose answer is lost.
	const lease = 2 * time.Second
	ctx := context.Background()
	var claimed []models.TaskRun
	require.Eventually(t, func() bool {
		var err error
		claimed, _, err = st.Store.ClaimWorkOrNextOffer(ctx, node.ID, lease, false)
		require.NoError(t, err)
		return len(claimed) == 1
	}, 30*time.Second, 50*time.Millisecond, "the run is dispatched to n1")
	claimedAt := time.Now()
	run := claimed[0]
	require.Equal(t, 1, run.Attempt)

	// Within the lease nothing is offered, even to the node's own agent.
	var work protocol.WorkResponse
	status, body := testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/work?wait=0s", token, nil, &work)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Empty(t, work.Runs)

	restartAgent(t, st, agent)
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	took := time.Since(claimedAt)
	t.Logf("claimed run delivered again and finished %s after the lost claim (lease %s)", took.Round(time.Millisecond), lease)
	assert.Equal(t, models.TxReady, tx.Status)
	got := runsByKey(t, st, ans.TaskUUID, "")["count@"+nodeName("n1")]
	assert.Equal(t, contract.RunSucceeded, got.State)
	assert.Equal(t, 1, got.Attempt, "the same attempt, delivered again")
	assert.Equal(t, "counted\n", got.StdoutTail)
	assert.GreaterOrEqual(t, took, lease, "not offered before the lease ran out")
	assert.Less(t, took, lease+15*time.Second, "offered again soon after the lease ran out (not after the heartbeat timeout)")
	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "ran\n", string(data), "executed exactly once on the node")

	// Delivered: never offered again.
	again, _, err := st.Store.ClaimWorkOrNextOffer(ctx, node.ID, time.Millisecond, false)
	require.NoError(t, err)
	assert.Empty(t, again)

	// Acknowledging or reporting a finished, unknown or foreign run is a 4xx,
	// and a repeated report changes nothing.
	call := func(path string, id int64, tok string, body any) (int, string) {
		status, raw := testenv.Call(t, http.MethodPost, st.URL+fmt.Sprintf(path, id), tok, body, nil)
		return status, string(raw)
	}
	status, raw := call(protocol.PathRunAck, run.ID, token, map[string]any{"attempt": 1})
	assert.Equal(t, http.StatusConflict, status, raw)
	assert.Contains(t, raw, "succeeded, not running")
	status, raw = call(protocol.PathRunAck, run.ID+100000, token, map[string]any{"attempt": 1})
	assert.Equal(t, http.StatusNotFound, status, raw)
	status, raw = call(protocol.PathRunAck, run.ID, other.Token(t), map[string]any{"attempt": 1})
	assert.Equal(t, http.StatusForbidden, status, raw)
	status, raw = call(protocol.PathRunAck, run.ID, token, map[string]any{})
	assert.Equal(t, http.StatusBadRequest, status, raw)
	assert.Contains(t, raw, `"field":"attempt"`)
	status, raw = call(protocol.PathRunHeartbeat, run.ID, token, map[string]any{"attempt": 2})
	assert.Equal(t, http.StatusConflict, status, "a heartbeat of a stale attempt: %s", raw)
	var hb protocol.RunHeartbeatResponse
	status, rawb := testenv.Call(t, http.MethodPost, st.URL+fmt.Sprintf(protocol.PathRunHeartbeat, run.ID), token, map[string]any{"attempt": 1}, &hb)
	assert.Equal(t, http.StatusOK, status, "%s", rawb)
	assert.True(t, hb.Cancel, "a finished run's heartbeat says cancel")
	status, raw = call(protocol.PathRunResult, run.ID+100000, token, map[string]any{"attempt": 1})
	assert.Equal(t, http.StatusNotFound, status, raw)
	status, raw = call(protocol.PathRunResult, run.ID, token, map[string]any{"attempt": 1, "exit_code": 9})
	assert.Equal(t, http.StatusOK, status, raw)
	after := runsByKey(t, st, ans.TaskUUID, "")["count@"+nodeName("n1")]
	assert.Equal(t, contract.RunSucceeded, after.State)
	require.NotNil(t, after.ExitCode)
	assert.Equal(t, 0, *after.ExitCode, "a repeated report changes nothing")

	// The run's short log came with its result (log_with_result): the API
	// has it whole, byte for byte what the node wrote.
	onNode, err := os.ReadFile(filepath.Join(agent.WorkDir, "logs", ans.TaskUUID, fmt.Sprintf("count.%d.1.log", run.ID)))
	require.NoError(t, err)
	status, logged := st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", ans.TaskUUID, run.ID), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", logged)
	assert.Equal(t, string(onNode), string(logged))
	assert.Contains(t, string(logged), "out| counted\n")
	// A log that starts past the server's copy (a chunk lost before it) is
	// a 409 naming the offset to send from, as on the log route; the
	// report changes nothing.
	status, raw = call(protocol.PathRunResult, run.ID, token, map[string]any{"attempt": 1, "exit_code": 9,
		"log": map[string]any{"offset": len(onNode) + 10, "data": base64.StdEncoding.EncodeToString([]byte("late\n"))}})
	assert.Equal(t, http.StatusConflict, status, raw)
	assert.Contains(t, raw, `"field":"log.offset"`)
	assert.Contains(t, raw, fmt.Sprintf(`"offset":%d`, len(onNode)))
	status, logged = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", ans.TaskUUID, run.ID), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", logged)
	assert.Equal(t, string(onNode), string(logged), "nothing stored")
	// A log that continues the server's copy is stored from the report
	// (the report itself, a repeat, changes nothing).
	status, raw = call(protocol.PathRunResult, run.ID, token, map[string]any{"attempt": 1,
		"log": map[string]any{"offset": len(onNode), "data": base64.StdEncoding.EncodeToString([]byte("more\n"))}})
	assert.Equal(t, http.StatusOK, status, raw)
	status, logged = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", ans.TaskUUID, run.ID), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", logged)
	assert.Equal(t, string(onNode)+"more\n", string(logged), "stored from the report")

	for _, tt := range []struct {
		path  string
		body  string
		field string
	}{
		{protocol.PathRunResult, fmt.Sprintf(`{"attempt": %d}`, int64(math.MaxInt32)+1), "attempt"},
		{protocol.PathRunResult, `{"attempt": 1e30}`, "attempt"},
		{protocol.PathRunResult, `{"attempt": -3}`, "attempt"},
		{protocol.PathRunResult, fmt.Sprintf(`{"attempt": 1, "exit_code": %d}`, int64(1)<<40), "exit_code"},
		{protocol.PathRunResult, `{"attempt": 1, "started_at": "yesterday"}`, "started_at"},
		{protocol.PathRunResult, `{"attempt": 1, "finished_at": "0001-01-01T00:00:01Z"}`, "finished_at"},
		{protocol.PathRunResult, `{"attempt": 1, "log": {"offset": -1, "data": ""}}`, "log.offset"},
		{protocol.PathRunResult, fmt.Sprintf(`{"attempt": 1, "log": {"offset": 0, "data": %q}}`,
			base64.StdEncoding.EncodeToString(make([]byte, protocol.MaxLogWithResult+1))), "log.data"},
		{protocol.PathRunResult, `{"attempt": 1, "log": {"offset": 0, "data": "not base64!"}}`, "log.data"},
		{protocol.PathRunResult, `{"attempt": 1, "log": {"offset": "zero", "data": ""}}`, "log.offset"},
		{protocol.PathRunAck, fmt.Sprintf(`{"attempt": %d}`, int64(1)<<33), "attempt"},
		{protocol.PathRunHeartbeat, fmt.Sprintf(`{"attempt": %d}`, int64(1)<<33), "attempt"},
	} {
		status, raw := call(tt.path, run.ID, token, tt.body)
		assert.Equal(t, http.StatusBadRequest, status, "%s %s: %s", tt.path, tt.body, raw)
		assert.True(t, strings.Contains(raw, `"field":"`+tt.field+`"`), "%s %s names %s: %s", tt.path, tt.body, tt.field, raw)
	}
}

// handBackRelease is a chain of two tasks on a node: the second goes back
// to the agent with the answer to the first's report; it appends a line to
// a file outside the agent's work directory, the node-side count.
const handBackRelease = `
name: handback
version: "1"
roles_metadata:
  worker: {tags: [worker]}
graphs:
  deployment:
    tasks:
      - id: first
        tags: [worker]
        parameters: {cmd: "echo first", timeout: 30}
      - id: second
        tags: [worker]
        requires: [first]
        parameters: {cmd: "echo ran >> %s; echo counted", timeout: 30}
`

// TestLostHandBackRunsExactlyOnce: the agent reports a chain's first run
// and never reads the answer that hands it the next one (killed or
// stopped right then; here the agent's requests are made by hand while
// the node's agent is down). That run, taken for the agent with the
// answer, is offered to the node's polls once the ack lease has passed:
// the restarted agent executes it, exactly once, counted on the node, and
// the transaction succeeds.
func TestLostHandBackRunsExactlyOnce(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, handBackRelease, "handback")
	token := agent.Token(t)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	var work protocol.WorkResponse
	var status int
	var body []byte
	require.Eventually(t, func() bool {
		status, body = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/work?wait=5s", token, nil, &work)
		require.Equal(t, http.StatusOK, status, "%s", body)
		return len(work.Runs) == 1
	}, 30*time.Second, 10*time.Millisecond, "the chain's first run is handed out")
	first := work.Runs[0]
	require.Equal(t, "first", first.Task)
	assert.False(t, first.Acknowledged, "a polled run is acknowledged by the agent")
	status, body = testenv.Call(t, http.MethodPost, st.URL+fmt.Sprintf(protocol.PathRunAck, first.RunID), token, map[string]any{"attempt": 1}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	now := time.Now().UTC()
	var answer protocol.RunResultResponse
	status, body = testenv.Call(t, http.MethodPost, st.URL+fmt.Sprintf(protocol.PathRunResult, first.RunID), token,
		protocol.RunResult{Attempt: 1, StdoutTail: "first\n", StartedAt: now, FinishedAt: now}, &answer)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, answer.Runs, 1, "the next run goes back with the answer")
	lost := answer.Runs[0]
	assert.Equal(t, "second", lost.Task)
	assert.True(t, lost.Acknowledged, "taken with the answer: no ack")
	lostAt := time.Now()

	// The answer is lost. Within the ack lease nothing is offered.
	status, body = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/agent/work?wait=0s", token, nil, &work)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Empty(t, work.Runs)

	restartAgent(t, st, agent)
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	took := time.Since(lostAt)
	t.Logf("handed-back run delivered again and finished %s after its answer was lost", took.Round(time.Millisecond))
	assert.Equal(t, models.TxReady, tx.Status)
	got := runsByKey(t, st, ans.TaskUUID, "")["second@"+nodeName("n1")]
	assert.Equal(t, contract.RunSucceeded, got.State)
	assert.Equal(t, lost.Attempt, got.Attempt, "the same attempt, delivered again")
	assert.GreaterOrEqual(t, took, models.DefaultAckLease, "not offered before the lease ran out")
	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "ran\n", string(data), "executed exactly once on the node")
}
