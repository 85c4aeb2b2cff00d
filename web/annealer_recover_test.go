package web_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// slowRelease has one role whose run takes long enough to be interrupted.
const slowRelease = `
name: slow
version: "1"
roles_metadata:
  slow: {script: "sleep 20"}
`

// TestAnnealerRecoversATerminatedRun: an operator terminates a noderole's
// run workflow (temporal workflow terminate) and the annealer with it. The
// next kick starts a fresh annealer, which finds the noderole in
// transition without a run, sets it to error saying why, and frees the
// node; a retry then runs it again.
func TestAnnealerRecoversATerminatedRun(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(slowRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "slowdep", "release": "slow"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	st.StartAgent(t, nodeName("r1"))
	bindAll(t, st, "slowdep", "slow@r1")

	var nr crowbar.NodeRole
	require.Eventually(t, func() bool {
		nr = noderoles(t, st, "slowdep")["slow@r1"]
		return nr.State == contract.NodeRoleTransition
	}, 30*time.Second, 100*time.Millisecond)
	ctx := t.Context()
	runID := contract.NodeRoleWorkflowID(st.TaskQueue, nr.ID, 1)
	require.NoError(t, st.Temporal.TerminateWorkflow(ctx, runID, "", "operator gave up on it"))
	require.NoError(t, st.Temporal.TerminateWorkflow(ctx, contract.AnnealerWorkflowID(st.TaskQueue), "", "operator restarts the annealer"))

	// Any kick starts a fresh annealer; committing an unchanged snapshot is one.
	var snap crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/slowdep/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/commit", snap.ID), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)

	require.Eventually(t, func() bool {
		return getNodeRole(t, st, nr.ID).State == contract.NodeRoleError
	}, 30*time.Second, 100*time.Millisecond, "the terminated run was never noticed")
	got := getNodeRole(t, st, nr.ID)
	require.NotNil(t, got.LastRun)
	assert.Contains(t, got.LastRun.Error, runID)
	assert.Contains(t, got.LastRun.Error, "Terminated")
	assert.Contains(t, got.LastRun.Error, "retry")
}

// TestNULIsBadInput: Postgres cannot store a NUL character in text or
// jsonb; such a value is the client's mistake, answered 422, not 500.
func TestNULIsBadInput(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(slowRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "nul", "release": "slow"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPut, "/api/v1/deployments/nul/roles/slow", map[string]any{"data": map[string]any{"k": "a\x00b"}}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s", body)
	assert.Contains(t, string(body), "NUL")
	status, _ = st.Do(t, http.MethodGet, "/api/v1/deployments/nul/roles/slow", nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "nothing was written")
}
