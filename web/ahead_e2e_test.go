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
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)

	data, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "t1\nt2\nt3\nt4\nt5\nt6\n", string(data), "each task once, in order, on the node")
	runs := runsByKey(t, st, ans.TaskUUID, "")
	claims := map[time.Time]int{}
	for i := 1; i <= 6; i++ {
		r := runs[fmt.Sprintf("t%d@%s", i, nodeName("n1"))]
		assert.Equal(t, contract.RunSucceeded, r.State, r.TaskName)
		assert.Equal(t, 1, r.Attempt, r.TaskName)
		require.NotNil(t, r.ClaimedAt)
		require.NotNil(t, r.StartedAt)
		require.NotNil(t, r.FinishedAt)
		assert.False(t, r.FinishedAt.Before(*r.StartedAt), "%s: started when the agent says, before it finished", r.TaskName)
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
