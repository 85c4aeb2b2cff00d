package replay_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/dev/replay"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/contract"
)

const release = `name: replay
version: "1"
roles_metadata:
  box: {tags: [box]}
graphs:
  deployment:
    tasks:
      - id: first
        tags: [box]
        parameters: {cmd: "true", timeout: 30}
      - id: second
        tags: [box]
        requires: [first]
        parameters: {cmd: "echo second", timeout: 30}
`

// runTransaction runs a small real transaction (two tasks on each of two
// nodes, through real agents) so that the stack's task queue has histories
// of every kind a transaction makes, and returns its uuid.
func runTransaction(t *testing.T, st *testenv.Stack) string {
	t.Helper()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(release), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "rp", "release": "replay"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, n := range []string{"r1.anneal.test", "r2.anneal.test"} {
		st.StartAgent(t, n)
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+n, map[string]any{"deployment": "rp", "roles": []string{"box"}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	var ans struct {
		TaskUUID string `json:"task_uuid"`
	}
	status, body = st.Do(t, http.MethodPost, "/api/v1/graphs/execute",
		map[string]any{"deployment": "rp", "graphs": []map[string]any{{"type": "deployment"}}}, &ans)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	var tx struct {
		Status, Error string
	}
	require.Eventually(t, func() bool {
		status, _ := st.Do(t, http.MethodGet, "/api/v1/transactions/"+ans.TaskUUID, nil, &tx)
		return status == http.StatusOK && tx.Status != "pending" && tx.Status != "running"
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, "ready", tx.Status, tx.Error)
	return ans.TaskUUID
}

// TestReplayARunningInstallation replays what a real transaction left on
// Temporal against this code: nothing breaks. Then against a Transaction
// workflow that schedules another activity than the recorded one: the
// transaction's execution is named as broken, with its type and IDs.
func TestReplayARunningInstallation(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	txID := runTransaction(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The stack encrypts its payloads: the replayer decodes them with its keys.
	opts := replay.Options{Client: st.Temporal, Namespace: "default", TaskQueue: st.TaskQueue, Since: time.Hour, Log: testenv.Logger(t), Keys: testenv.Keys()}

	res, err := replay.Run(ctx, opts)
	require.NoError(t, err)
	t.Log(res.Summary())
	assert.Empty(t, res.Broken, "on the code that recorded them")
	assert.Equal(t, 1, res.ByType[contract.TransactionWorkflow], "the one transaction")
	assert.Equal(t, 2, res.ByType[contract.NodeWorkflow], "one node workflow per node")
	assert.Equal(t, 2, res.ByType[contract.NodeBootstrapWorkflow], "one bootstrap per registered node")
	sum := 0
	for _, n := range res.ByType {
		sum += n
	}
	assert.Equal(t, res.Replayed, sum)

	// Another installation's executions (another task queue) are not ours.
	other, err := replay.Run(ctx, replay.Options{Client: st.Temporal, Namespace: "default", TaskQueue: "no-such-queue-" + st.TaskQueue, Since: time.Hour})
	require.NoError(t, err)
	assert.Zero(t, other.Replayed)

	opts.Register = func(r worker.WorkflowRegistry) {
		// Today's workflows, but for an incompatible Transaction.
		workflows.Register(r)
		r.RegisterWorkflowWithOptions(incompatibleTransaction, workflow.RegisterOptions{
			Name: contract.TransactionWorkflow, DisableAlreadyRegisteredCheck: true,
		})
	}
	res, err = replay.Run(ctx, opts)
	require.NoError(t, err)
	t.Log(res.Summary())
	require.Len(t, res.Broken, 1, "only the transaction's execution: %s", res.Summary())
	b := res.Broken[0]
	assert.Equal(t, contract.TransactionWorkflowID(txID), b.WorkflowID)
	assert.Equal(t, contract.TransactionWorkflow, b.Type)
	assert.NotEmpty(t, b.RunID)
	assert.False(t, b.Open)
	require.Error(t, b.Err)
	assert.Contains(t, b.Err.Error(), "nondeterministic", "a non-determinism error, not a decoding one: %v", b.Err)
	assert.True(t, strings.Contains(res.Summary(), b.WorkflowID) && strings.Contains(res.Summary(), b.RunID), res.Summary())
}

// incompatibleTransaction takes the Transaction workflow's input but
// schedules an activity that no recorded history has.
func incompatibleTransaction(ctx workflow.Context, in contract.TransactionInput) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	return workflow.ExecuteActivity(ctx, "SomethingElseEntirely", in).Get(ctx, nil)
}
