package web_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// aheadRelease is one node's chain of six tasks, each appending its name
// to a file outside the agent's work directory (the node-side count);
// the third sleeps for a while when $ANNEAL_SLOW_THIRD's file exists.
const aheadRelease = `
name: ahead
version: "1"
roles_metadata:
  worker: {tags: [worker]}
graphs:
  deployment:
    tasks:
      - {id: t1, tags: [worker], parameters: {cmd: "echo t1 >> %[1]s", timeout: 30}}
      - {id: t2, tags: [worker], requires: [t1], parameters: {cmd: "echo t2 >> %[1]s", timeout: 30}}
      - {id: t3, tags: [worker], requires: [t2], parameters: {cmd: "echo t3 >> %[1]s; if [ -e %[1]s.slow ]; then sleep 2; fi", timeout: 30}}
      - {id: t4, tags: [worker], requires: [t3], parameters: {cmd: "echo t4 >> %[1]s", timeout: 30}}
      - {id: t5, tags: [worker], requires: [t4], parameters: {cmd: "echo t5 >> %[1]s", timeout: 30}}
      - {id: t6, tags: [worker], requires: [t5], parameters: {cmd: "echo t6 >> %[1]s", timeout: 30}}
`

// TestChainHandedAheadRunsOnceEach: a chain of short runs goes to the
// real agent handed ahead (several dispatched by one report's answer, the
// same claim time) and reported in batches; each task runs exactly once,
// in order, counted on the node, and each run's state, attempt and log
// are its own.
func TestChainHandedAheadRunsOnceEach(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, aheadRelease, "ahead")
	restartAgent(t, st, agent)
	runs := runSixOnce(t, st, count, false)
	claims := map[time.Time]int{}
	for _, r := range runs {
		claims[r.ClaimedAt.UTC()]++
	}
	most := 0
	for _, n := range claims {
		most = max(most, n)
	}
	assert.GreaterOrEqual(t, most, 3, "runs handed ahead together share their claim: %v", claims)
}

// TestStopWithRunsHandedAhead: a stop while a chain's run handed ahead is
// running lets that run finish; the runs handed ahead after it do not
// start (the ahead window has passed when it ends: the agent releases
// them), and the stop cancels them, never run on the node.
func TestStopWithRunsHandedAhead(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, aheadRelease, "ahead")
	require.NoError(t, os.WriteFile(count+".slow", nil, 0o644))
	restartAgent(t, st, agent)
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	require.Eventually(t, func() bool {
		data, _ := os.ReadFile(count)
		return strings.Contains(string(data), "t3")
	}, 30*time.Second, 10*time.Millisecond, "t3 starts")
	status, body := st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/stop", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	tx := waitDone(t, st, ans.TaskUUID, 30*time.Second)
	assert.Equal(t, models.TxStopped, tx.Status)

	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "t1\nt2\nt3\n", string(data), "nothing started after the run the stop found running")
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunSucceeded, runs["t3@"+nodeName("n1")].State)
	for _, task := range []string{"t4", "t5", "t6"} {
		r := runs[task+"@"+nodeName("n1")]
		assert.Equal(t, contract.RunCancelled, r.State, task)
		assert.LessOrEqual(t, r.Attempt, 1, "%s: handed ahead at most once, released, never started", task)
	}
}

// aheadAckRelease splits n1's chain with a wait for n2's anchor task:
// [t1, t2], then [t3 .. t6], whose first run follows t2, a short run.
const aheadAckRelease = `
name: aheadack
version: "1"
roles_metadata:
  worker: {tags: [worker]}
  anchor: {tags: [anchor]}
graphs:
  deployment:
    tasks:
      - {id: a1, tags: [anchor], parameters: {cmd: "sleep 1", timeout: 30}}
      - {id: t1, tags: [worker], parameters: {cmd: "echo t1 >> %[1]s", timeout: 30}}
      - {id: t2, tags: [worker], requires: [t1], parameters: {cmd: "echo t2 >> %[1]s", timeout: 30}}
      - {id: t3, tags: [worker], requires: [t2], cross_depends: [{name: a1, tags: [anchor]}], parameters: {cmd: "echo t3 >> %[1]s", timeout: 30}}
      - {id: t4, tags: [worker], requires: [t3], parameters: {cmd: "echo t4 >> %[1]s", timeout: 30}}
      - {id: t5, tags: [worker], requires: [t4], parameters: {cmd: "echo t5 >> %[1]s", timeout: 30}}
      - {id: t6, tags: [worker], requires: [t5], parameters: {cmd: "echo t6 >> %[1]s", timeout: 30}}
`

// TestChainHandedAheadWithItsFirstRun: the first run of a chain that
// follows a short run of its node (t3, after t2) is polled, and the poll's
// answer hands the chain's next runs ahead with it (claimed before t3 even
// finished), so that the whole chain goes to the real agent with one
// report; each task runs exactly once, in order.
func TestChainHandedAheadWithItsFirstRun(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, aheadAckRelease, "aheadack")
	restartAgent(t, st, agent)
	st.StartAgent(t, nodeName("n2"))
	status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("n2"), map[string]any{"deployment": "d1", "roles": []string{"anchor"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	runs := runSixOnce(t, st, count, false)
	for _, r := range runs[3:] {
		assert.True(t, r.ClaimedAt.Before(*runs[2].FinishedAt), "%s handed ahead with t3, before t3 finished", r.TaskName)
	}
}

// runSixOnce executes d1's deployment graph (again, with force: every
// task runs though nothing changed), whose tasks t1 to t6 on n1 append
// their names to count (emptied first), and checks that it succeeds with each
// task run once, in order, on the node, each run with its own state,
// first attempt and times (a run handed ahead started when the agent
// says). It returns n1's runs t1 to t6.
func runSixOnce(t *testing.T, st *testenv.Stack, count string, force bool) []models.TaskRun {
	t.Helper()
	return sixRanOnce(t, st, count, executeSix(t, st, count, force))
}

// executeSix empties count and executes d1's deployment graph (again,
// with force), returning the transaction's id.
func executeSix(t *testing.T, st *testenv.Stack, count string, force bool) string {
	t.Helper()
	require.NoError(t, os.WriteFile(count, nil, 0o644))
	return execute(t, st, map[string]any{"deployment": "d1", "force": force, "graphs": []map[string]any{{"type": "deployment"}}}).TaskUUID
}

// sixRanOnce waits for transaction id, and checks what runSixOnce says.
func sixRanOnce(t *testing.T, st *testenv.Stack, count, id string) []models.TaskRun {
	t.Helper()
	tx := waitDone(t, st, id, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "t1\nt2\nt3\nt4\nt5\nt6\n", string(data), "each task once, in order, on the node")
	byKey := runsByKey(t, st, id, "")
	runs := make([]models.TaskRun, 6)
	for i := range runs {
		r := byKey[fmt.Sprintf("t%d@%s", i+1, nodeName("n1"))]
		assert.Equal(t, contract.RunSucceeded, r.State, r.TaskName)
		assert.Equal(t, 1, r.Attempt, r.TaskName)
		require.NotNil(t, r.ClaimedAt, r.TaskName)
		require.NotNil(t, r.StartedAt, r.TaskName)
		require.NotNil(t, r.FinishedAt, r.TaskName)
		assert.False(t, r.FinishedAt.Before(*r.StartedAt), "%s: started when the agent says, before it finished", r.TaskName)
		runs[i] = r
	}
	return runs
}

// TestGraphStartHandedAheadAfterAShortLastTime: the first time d1's graph
// runs, no run of n1 has finished to tell whether t1 is short, and t2
// goes out with t1's report; the second time, t1 was short the last time,
// so the chain that starts the graph goes ahead with t1's poll (t2 to t6
// claimed before t1 finished), each task still run once, in order.
func TestGraphStartHandedAheadAfterAShortLastTime(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, aheadRelease, "ahead")
	restartAgent(t, st, agent)
	first := runSixOnce(t, st, count, false)
	assert.False(t, first[1].ClaimedAt.Before(*first[0].FinishedAt), "the first time, t2 waits for t1's report")
	again := runSixOnce(t, st, count, true)
	for _, r := range again[1:] {
		assert.True(t, r.ClaimedAt.Before(*again[0].FinishedAt), "%s handed ahead with t1, before t1 finished", r.TaskName)
	}
}

// TestLostPollAnswersRunOnceEach: the answers that hand a chain's runs
// out ahead are lost, and the agent's next requests are those of the
// restarted agent; each task still runs once, in order, counted on the
// node, and nothing is offered again within the ack lease.
//   - As today's agent polls (protocol.WorkAheadParam): t1 comes taken as
//     acknowledged, with no ack, and t2 to t6 ahead with it. The answer is
//     lost: t1 is offered again once the lease has passed.
//   - As an agent that predates that polls: t1 comes for an ack, whose
//     answer hands t2 to t6 ahead (protocol.RunAck.Ahead); the agent runs
//     t1 and reports it, and that answer is lost too: t2 is offered again.
func TestLostPollAnswersRunOnceEach(t *testing.T) {
	st, count, agent, _ := agentDownOnN1(t, aheadRelease, "ahead")
	token := agent.Token(t)
	stop := restartAgent(t, st, agent)
	first := runSixOnce(t, st, count, false) // t1 is short: its chain goes ahead from now on
	stop()
	var head struct{ Unconfirmed bool }
	require.NoError(t, st.Store.DB.Raw("SELECT acked_at = claimed_at AS unconfirmed FROM task_runs WHERE id = ?", first[0].ID).Scan(&head).Error)
	assert.True(t, head.Unconfirmed, "today's agent sent no ack for t1: its poll took it as acknowledged")

	poll := func(query string) protocol.WorkResponse {
		var work protocol.WorkResponse
		require.Eventually(t, func() bool {
			status, body := testenv.Call(t, http.MethodGet, st.URL+protocol.PathWork+"?"+query, token, nil, &work)
			require.Equal(t, http.StatusOK, status, "%s", body)
			return len(work.Runs) == 1 || strings.Contains(query, "wait=0s")
		}, 30*time.Second, 10*time.Millisecond, "t1 is handed out")
		return work
	}
	lost := func(how string, handOut func() []protocol.WorkItem) {
		id := executeSix(t, st, count, true)
		ahead := handOut()
		require.Len(t, ahead, 5, "%s: t2 to t6 go ahead with t1", how)
		lostAt := time.Now()
		assert.Empty(t, poll("wait=0s&ahead=1").Runs, "%s: within the lease nothing is offered", how)
		stop := restartAgent(t, st, agent)
		sixRanOnce(t, st, count, id)
		stop()
		assert.GreaterOrEqual(t, time.Since(lostAt), models.DefaultAckLease, "%s: not offered before the lease ran out", how)
	}

	lost("poll", func() []protocol.WorkItem {
		work := poll("wait=5s&ahead=1")
		require.Equal(t, "t1", work.Runs[0].Task)
		assert.True(t, work.Runs[0].Acknowledged, "taken as acknowledged: no ack")
		assert.Positive(t, work.AheadMs)
		return work.Ahead
	})
	lost("ack", func() []protocol.WorkItem {
		work := poll("wait=5s")
		t1 := work.Runs[0]
		require.Equal(t, "t1", t1.Task)
		assert.False(t, t1.Acknowledged, "a poll without ?ahead= leaves the ack to the agent")
		assert.Empty(t, work.Ahead)
		var ack protocol.RunAckResponse
		status, body := testenv.Call(t, http.MethodPost, st.URL+fmt.Sprintf(protocol.PathRunAck, t1.RunID), token,
			map[string]any{"attempt": t1.Attempt, "ahead": true}, &ack)
		require.Equal(t, http.StatusOK, status, "%s", body)
		assert.Positive(t, ack.AheadMs)
		// The agent runs t1 (counted here) and reports it; that answer,
		// which hands t2 back, is lost too.
		require.NoError(t, os.WriteFile(count, []byte("t1\n"), 0o644))
		now := time.Now().UTC()
		status, body = testenv.Call(t, http.MethodPost, st.URL+protocol.PathRunResults, token, protocol.RunResults{Results: []protocol.RunReport{
			{RunID: t1.RunID, RunResult: protocol.RunResult{Attempt: t1.Attempt, StartedAt: now, FinishedAt: now}}}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
		return ack.Runs
	})

	// A poll's ?ahead= is a boolean.
	status, body := testenv.Call(t, http.MethodGet, st.URL+protocol.PathWork+"?wait=0s&ahead=maybe", token, nil, nil)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, string(body), "ahead")
}
