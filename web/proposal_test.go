package web_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models/crowbar"
)

// A proposal can be undone binding by binding (DELETE /noderoles/:id,
// ?cascade=true for what needs it), and its diff against the committed
// snapshot shows bindings added and removed and data changed.
func TestSnapshotRemoveAndDiffAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(snapRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "undo", "release": "snaprel"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, short := range []string{"u1", "u2"} {
		status, body := st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": nodeName(short), "deployment": "undo"}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
	}
	var snap crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/undo/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	bind := func(node, role string) crowbar.NodeRole {
		t.Helper()
		var nr crowbar.NodeRole
		status, body := st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID), map[string]any{"node": nodeName(node), "role": role}, &nr)
		require.Equal(t, http.StatusCreated, status, "%s", body)
		return nr
	}
	db := bind("u1", "db") // with base@u1, implicit
	api := bind("u1", "api")
	cache := bind("u2", "cache")

	var diff crowbar.SnapshotDiff
	diffPath := fmt.Sprintf("/api/v1/snapshots/%d/diff", snap.ID)
	status, body = st.Do(t, http.MethodGet, diffPath, nil, &diff)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Len(t, diff.Added, 4, "%s", body)
	assert.Empty(t, diff.Removed)

	// db is needed by api: refused, naming it, nothing removed.
	var errBody errorAnswer
	status, body = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d", db.ID), nil, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	require.NoError(t, jsonUnmarshal(body, &errBody))
	assert.Contains(t, errBody.Error.Message, fmt.Sprintf("api on %s (noderole %d)", nodeName("u1"), api.ID))
	status, _ = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/noderoles/%d", api.ID), nil, nil)
	assert.Equal(t, http.StatusOK, status)
	status, body = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d?cascade=maybe", db.ID), nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	assert.Contains(t, string(body), "cascade")
	status, body = st.Do(t, http.MethodDelete, "/api/v1/noderoles/x", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	// With cascade, api goes with it.
	var removed struct {
		Removed []crowbar.NodeRole `json:"removed"`
	}
	status, body = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d?cascade=true", db.ID), nil, &removed)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, removed.Removed, 2)
	assert.Equal(t, []int64{db.ID, api.ID}, []int64{removed.Removed[0].ID, removed.Removed[1].ID})
	status, _ = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/noderoles/%d", api.ID), nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d", api.ID), nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/commit", snap.ID), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = st.Do(t, http.MethodGet, diffPath, nil, &diff)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, snap.ID, diff.Against)
	assert.Empty(t, diff.Added, "the committed snapshot against itself")
	// A committed snapshot's binding cannot be removed.
	status, body = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d", cache.ID), nil, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	require.NoError(t, jsonUnmarshal(body, &errBody))
	assert.Contains(t, errBody.Error.Message, "committed")

	// The next proposal: base@u1 edited, cache@u2 removed, db on u2 added
	// (its parent base is found on u1, so it has none of its own).
	var prop crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/undo/snapshots/propose", nil, &prop)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	var full crowbar.Snapshot
	st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/snapshots/%d", prop.ID), nil, &full)
	ids := map[string]int64{}
	for _, nr := range full.NodeRoles {
		ids[nr.RoleName] = nr.ID
	}
	status, body = st.Do(t, http.MethodPatch, fmt.Sprintf("/api/v1/noderoles/%d", ids["base"]), map[string]any{"user_data": map[string]any{"ntp": "pool.example"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/noderoles/%d", ids["cache"]), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	snap = prop
	db2 := bind("u2", "db")

	status, body = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/snapshots/%d/diff", prop.ID), nil, &diff)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, snap.ID, prop.ID)
	var added []string
	for _, it := range diff.Added {
		added = append(added, it.Role+"@"+it.Node)
	}
	assert.Equal(t, []string{"db@" + nodeName("u2")}, added, "its parent base is found on u1")
	assert.Contains(t, diff.Added, crowbar.DiffItem{Role: "db", Node: nodeName("u2"), NodeRole: db2.ID, State: "proposed"})
	require.Len(t, diff.Removed, 1)
	assert.Equal(t, crowbar.DiffItem{Role: "cache", Node: nodeName("u2"), Committed: cache.ID, State: diff.Removed[0].State}, diff.Removed[0])
	require.Len(t, diff.Changed, 1, "%s", body)
	assert.Equal(t, "base", diff.Changed[0].Role)
	assert.Equal(t, []crowbar.DataChange{{Field: "user_data", Path: "ntp", New: "pool.example"}}, diff.Changed[0].Changes)

	status, _ = st.Do(t, http.MethodGet, "/api/v1/snapshots/999999/diff", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
}
