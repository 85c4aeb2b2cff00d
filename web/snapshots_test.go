package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// snapRelease is a Crowbar-style release: base is implicit, db requires
// it (and its script fails), api requires db, front requires cache (not
// implicit), odd runs on a jig that is not active.
const snapRelease = `
name: snaprel
version: "1"
roles_metadata:
  base: {flags: [implicit]}
  db: {requires: [base], template: {port: 5432}, script: "echo no disk for the database >&2; exit 3"}
  api: {requires: [db]}
  cache: {}
  front: {requires: [cache]}
  odd: {jig: puppet}
`

func TestSnapshotsAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(snapRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "crow", "release": "snaprel"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, short := range []string{"a1", "a2"} {
		st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short), map[string]any{"deployment": "crow"}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}

	var hist []crowbar.Snapshot
	status, body = getList(t, st, "/api/v1/deployments/crow/snapshots", &hist)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, hist, 1)
	committed := hist[0]
	assert.Equal(t, crowbar.SnapshotCommitted, committed.State)

	// Binding into the committed snapshot: 409 saying to propose first.
	var errBody errorAnswer
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", committed.ID),
		map[string]any{"node": nodeName("a1"), "role": "db"}, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	require.NoError(t, jsonUnmarshal(body, &errBody))
	assert.Contains(t, errBody.Error.Message, "propose")

	var snap crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/crow/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, crowbar.SnapshotProposed, snap.State)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/crow/snapshots/propose", nil, nil)
	assert.Equal(t, http.StatusConflict, status, "%s", body)

	bindPath := fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID)
	var db crowbar.NodeRole
	status, body = st.Do(t, http.MethodPost, bindPath, map[string]any{"node": nodeName("a1"), "role": "db"}, &db)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, contract.NodeRoleProposed, db.State)
	assert.Equal(t, "db", db.RoleName)
	assert.Equal(t, map[string]any{"port": float64(5432)}, db.UserData)
	require.Len(t, db.Parents, 1, "base bound implicitly")
	var again crowbar.NodeRole
	status, body = st.Do(t, http.MethodPost, bindPath, map[string]any{"node": nodeName("a1"), "role": "db"}, &again)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, db.ID, again.ID)
	var api crowbar.NodeRole
	status, body = st.Do(t, http.MethodPost, bindPath, map[string]any{"node": nodeName("a2"), "role": "api"}, &api)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, []int64{db.ID}, api.Parents)

	// 422s: a missing parent (named with the node), an inactive jig, a
	// node of another deployment; 400 for an unknown field.
	for _, tc := range []struct {
		body map[string]any
		want []string
	}{
		{map[string]any{"node": nodeName("a1"), "role": "front"}, []string{`"cache"`, nodeName("a1")}},
		{map[string]any{"node": nodeName("a1"), "role": "odd"}, []string{`"puppet"`}},
		{map[string]any{"node": "ghost.anneal.test", "role": "db"}, []string{"ghost"}},
	} {
		var e errorAnswer
		status, body := st.Do(t, http.MethodPost, bindPath, tc.body, nil)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s", body)
		require.NoError(t, jsonUnmarshal(body, &e))
		for _, w := range tc.want {
			assert.Contains(t, e.Error.Message, w)
		}
	}
	status, _ = st.Do(t, http.MethodPost, bindPath, map[string]any{"node": nodeName("a1"), "roles": "db"}, nil)
	assert.Equal(t, http.StatusBadRequest, status)

	// Edit user data in the proposed snapshot.
	var edited crowbar.NodeRole
	status, body = st.Do(t, http.MethodPatch, fmt.Sprintf("/api/v1/noderoles/%d", db.ID), map[string]any{"user_data": map[string]any{"port": 6000}}, &edited)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, float64(6000), edited.UserData["port"])

	// Commit: the previous committed is archived; states todo / blocked.
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/commit", snap.ID), nil, &snap)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, crowbar.SnapshotCommitted, snap.State)
	states := map[string]string{}
	for _, nr := range snap.NodeRoles {
		states[nr.RoleName] = nr.State
	}
	assert.Equal(t, map[string]string{"base": "todo", "db": "blocked", "api": "blocked"}, states)
	// Committing started the built-in deploy-changes scenario on the
	// deployment: provision the nodes still in discover, then deploy.
	var started struct {
		DeployChanges struct {
			TaskUUID string `json:"task_uuid"`
		} `json:"deploy_changes"`
	}
	require.NoError(t, json.Unmarshal(body, &started), "%s", body)
	require.NotEmpty(t, started.DeployChanges.TaskUUID, "%s", body)
	var dc fuel.TransactionStatus
	status, body = st.Do(t, http.MethodGet, "/api/v1/transactions/"+started.DeployChanges.TaskUUID, nil, &dc)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.NotEmpty(t, dc.Graphs)
	assert.Equal(t, "provision", dc.Graphs[0].Type)
	status, _ = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/commit", snap.ID), nil, nil)
	assert.Equal(t, http.StatusConflict, status)
	status, body = getList(t, st, "/api/v1/deployments/crow/snapshots", &hist)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, hist, 2)
	assert.Equal(t, crowbar.SnapshotArchived, hist[0].State)

	// Edits of the committed snapshot are refused.
	status, body = st.Do(t, http.MethodPatch, fmt.Sprintf("/api/v1/noderoles/%d", db.ID), map[string]any{"user_data": map[string]any{}}, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	assert.Contains(t, string(body), "propose")

	// Noderoles: get, retry only from error.
	var got crowbar.NodeRole
	status, body = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/noderoles/%d", api.ID), nil, &got)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, nodeName("a2"), got.NodeName)
	status, _ = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/noderoles/%d/retry", api.ID), nil, nil)
	assert.Equal(t, http.StatusConflict, status)
	// The annealer runs base (nothing to run: active), then db, whose
	// script fails on the agent: db goes to error, api stays blocked, and
	// the noderole shows why.
	require.Eventually(t, func() bool {
		got = getNodeRole(t, st, db.ID)
		return got.State == contract.NodeRoleError
	}, 60*time.Second, 200*time.Millisecond, "db never failed")
	require.NotNil(t, got.LastRun)
	require.NotNil(t, got.LastRun.ExitCode)
	assert.Equal(t, 3, *got.LastRun.ExitCode)
	assert.Contains(t, got.LastRun.StderrTail, "no disk for the database")
	assert.Equal(t, contract.NodeRoleActive, getNodeRole(t, st, db.Parents[0]).State)
	assert.Equal(t, contract.NodeRoleBlocked, getNodeRole(t, st, api.ID).State)
	// A retry is one call: db goes back to todo (and the annealer runs it
	// again).
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/noderoles/%d/retry", db.ID), nil, &got)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, contract.NodeRoleTodo, got.State)
	require.Eventually(t, func() bool {
		got = getNodeRole(t, st, db.ID)
		return got.State == contract.NodeRoleError && got.RunCount == 2
	}, 60*time.Second, 200*time.Millisecond, "db never ran again")

	status, _ = st.Do(t, http.MethodGet, "/api/v1/snapshots/999999", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/snapshots/x", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status)
}
