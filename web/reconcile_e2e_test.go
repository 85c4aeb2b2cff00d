package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

const reconcileRelease = `
name: slow
version: "1"
roles_metadata:
  box: {tags: [box]}
graphs:
  deployment:
    tasks:
      - id: long
        tags: [box]
        parameters: {cmd: "sleep 8; echo long done", timeout: 60}
      - id: after
        tags: [box]
        requires: [long]
        parameters: {cmd: "echo after", timeout: 30}
`

// terminate ends a workflow as an operator does, with the temporal CLI.
func terminate(t *testing.T, workflowID string) {
	t.Helper()
	bin, err := devenv.TemporalBinary(context.Background(), testenv.Logger(t))
	require.NoError(t, err)
	out, err := exec.Command(bin, "workflow", "terminate", "--address", os.Getenv(testenv.EnvTemporal),
		"--workflow-id", workflowID, "--reason", "operator test").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// A transaction whose workflow is terminated with the temporal CLI ends in
// error (its running run failed, the rest cancelled, its node free) with a
// reason that says what happened and how to retry; stop answers that it
// had already ended, another transaction gets the node, and retry runs
// what did not succeed. A terminated software deployment is FAILED by the
// reconciler's pass.
func TestReconcileWhatTemporalEnded(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 30})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(reconcileRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "slow"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	st.StartAgent(t, nodeName("box"))
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("box"), map[string]any{"deployment": "d1", "roles": []string{"box"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	require.Eventually(t, func() bool {
		return runsByKey(t, st, ans.TaskUUID, "")["long@"+nodeName("box")].State == contract.RunRunning
	}, 30*time.Second, 100*time.Millisecond)
	terminate(t, ans.WorkflowID)

	// Stop tells the truth: the transaction had already ended.
	status, body = st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/stop", nil, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	assert.Contains(t, string(body), "had already ended")
	var tx struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	st.Do(t, http.MethodGet, "/api/v1/transactions/"+ans.TaskUUID, nil, &tx)
	assert.Equal(t, models.TxError, tx.Status)
	assert.Contains(t, tx.Error, "is terminated in Temporal")
	assert.Contains(t, tx.Error, "/api/v1/transactions/"+ans.TaskUUID+"/retry")
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, contract.RunFailed, runs["long@"+nodeName("box")].State)
	assert.Equal(t, contract.RunCancelled, runs["after@"+nodeName("box")].State)

	// The node is free: a second transaction runs on it.
	second := execute(t, st, map[string]any{"deployment": "d1", "force": true, "graphs": []map[string]any{{"type": "deployment", "tasks": []string{"after"}}}})
	assert.Equal(t, models.TxReady, waitDone(t, st, second.TaskUUID, 60*time.Second).Status)

	// Retry runs again what did not succeed.
	status, body = st.Do(t, http.MethodPost, "/api/v1/transactions/"+ans.TaskUUID+"/retry", nil, nil)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	done := waitDone(t, st, ans.TaskUUID, 90*time.Second)
	assert.Equal(t, models.TxReady, done.Status, done.Error)

	// A software deployment whose workflow is terminated while it waits
	// for its agent ends FAILED at the reconciler's next pass.
	cfg := createConfig(t, st, map[string]any{"name": "slow", "config": "#!/bin/sh\nsleep 8\n"})
	d := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("box")})
	terminate(t, d.WorkflowID)
	time.Sleep(1100 * time.Millisecond) // past the stack's reconcile grace
	require.NoError(t, st.API.Reconcile(context.Background()))
	var sw swDeployment
	st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/software_deployments/%d", d.ID), nil, &sw)
	assert.Equal(t, contract.SoftwareFailed, sw.Status)
	assert.Contains(t, sw.StatusReason, "is terminated in Temporal")
}
