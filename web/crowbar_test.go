package web_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// crowRelease is a Crowbar-style release: base is implicit, db requires it.
const crowRelease = `
name: crowrel
version: "7"
roles_metadata:
  base: {flags: [implicit], template: {ntp: pool}}
  db: {requires: [base], template: {port: 5432}}
  cache: {}
  front: {requires: [cache]}
`

// expectInvalid calls the API and asserts a 422 naming field.
func expectInvalid(t *testing.T, st *testenv.Stack, method, path string, body any, field string) errorAnswer {
	t.Helper()
	status, raw := st.Do(t, method, path, body, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s %s: %s", method, path, raw)
	var e errorAnswer
	require.NoError(t, jsonUnmarshal(raw, &e))
	assert.Equal(t, "invalid_input", e.Error.Code)
	assert.Equal(t, field, e.Error.Details["field"], "%s %s: %s", method, path, raw)
	return e
}

func TestCrowbarRESTRolesAndNodeRoles(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	ctx := context.Background()
	var rel models.Release
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(crowRelease), &rel)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "crowd", "release": "crowrel"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	// Nodes made in the store, without agents, alive as the transition
	// rules want; nothing here commits through the API, so the annealer is
	// never woken and the test moves the noderoles itself.
	for _, short := range []string{"c1", "c2"} {
		_, _, err := st.Store.CreateNode(ctx, models.NodeInput{Name: nodeName(short), Deployment: "crowd"}, true)
		require.NoError(t, err)
	}

	// Roles.
	for _, ref := range []string{"crowrel", "crowrel@7", strconv.FormatInt(rel.ID, 10)} {
		var roles []models.Role
		status, body = getList(t, st, "/api/v1/roles?release="+ref, &roles)
		require.Equal(t, http.StatusOK, status, "%s", body)
		var names []string
		for _, r := range roles {
			names = append(names, r.Name)
		}
		assert.Equal(t, []string{"base", "cache", "db", "front"}, names, ref)
	}
	var all []models.Role
	status, body = getList(t, st, "/api/v1/roles", &all)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.NotEmpty(t, all)
	for i := 1; i < len(all); i++ {
		assert.LessOrEqual(t, all[i-1].ReleaseID, all[i].ReleaseID, "ordered by release")
	}
	expectInvalid(t, st, http.MethodGet, "/api/v1/roles?release=nosuch", nil, "release")
	var db models.Role
	for _, r := range all {
		if r.ReleaseID == rel.ID && r.Name == "db" {
			db = r
		}
	}
	require.NotZero(t, db.ID)
	var one models.Role
	status, body = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/roles/%d", db.ID), nil, &one)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, []string{"base"}, one.Requires)
	assert.Equal(t, map[string]any{"port": float64(5432)}, one.Template)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/roles/999999", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/roles/db", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "roles are addressed by id: names repeat across releases")

	// Bind db on c1 (base comes implicitly) and cache on c2, and commit in
	// the store: committing through the API would start deploy-changes,
	// whose end wakes the annealer, which fails a noderole the test put in
	// transition (it has no run workflow).
	var hist []crowbar.Snapshot
	status, body = getList(t, st, "/api/v1/deployments/crowd/snapshots", &hist)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, hist, 1)
	var snap crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/crowd/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, b := range [][2]string{{"c1", "db"}, {"c2", "cache"}} {
		status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID),
			map[string]any{"node": nodeName(b[0]), "role": b[1]}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
	}
	_, err := crowbar.New(st.Store).CommitSnapshot(ctx, snap.ID)
	require.NoError(t, err)

	list := func(query string) []crowbar.NodeRole {
		t.Helper()
		var nrs []crowbar.NodeRole
		status, body := getList(t, st, "/api/v1/noderoles"+query, &nrs)
		require.Equal(t, http.StatusOK, status, "%s: %s", query, body)
		require.NotNil(t, nrs, "%s: [] rather than null", query)
		return nrs
	}
	keys := func(nrs []crowbar.NodeRole) []string {
		out := make([]string, len(nrs))
		for i, nr := range nrs {
			out[i] = nr.RoleName + "@" + nr.NodeName
		}
		return out
	}
	base, dbKey, cache := "base@"+nodeName("c1"), "db@"+nodeName("c1"), "cache@"+nodeName("c2")
	byDep := list("?deployment=crowd")
	assert.Equal(t, []string{base, dbKey, cache}, keys(byDep))
	assert.Equal(t, []int64{byDep[0].ID}, byDep[1].Parents, "edges")
	assert.Equal(t, snap.ID, byDep[0].SnapshotID, "the committed snapshot")
	assert.Equal(t, []string{base, dbKey, cache}, keys(list("")))
	assert.Equal(t, []string{base, dbKey}, keys(list("?deployment=crowd&node="+nodeName("c1"))))
	assert.Equal(t, []string{dbKey}, keys(list("?role=db")))
	assert.Equal(t, []string{base, cache}, keys(list("?state=todo")))
	assert.Equal(t, []string{dbKey}, keys(list("?deployment=crowd&state=blocked&role=db")))
	assert.Empty(t, list(fmt.Sprintf("?deployment=crowd&snapshot=%d", hist[0].ID)), "the first, archived snapshot was empty")

	e := expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?state=bogus", nil, "state")
	assert.Contains(t, e.Error.Message, "proposed, todo, blocked, transition, active, error")
	expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?deployment=ghost", nil, "deployment")
	expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?node=ghost.anneal.test", nil, "node")
	expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?role=nosuch", nil, "role")
	expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?snapshot=abc", nil, "snapshot")
	expectInvalid(t, st, http.MethodGet, "/api/v1/noderoles?snapshot=999999", nil, "snapshot")

	// last_run: none before the first run, then the run with what it saw.
	path := fmt.Sprintf("/api/v1/noderoles/%d", byDep[0].ID)
	var doc map[string]any
	status, body = st.Do(t, http.MethodGet, path, nil, &doc)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.NotContains(t, doc, "last_run")
	_, err = crowbar.New(st.Store).TransitionNodeRole(ctx, byDep[0].ID)
	require.NoError(t, err)
	plan, err := crowbar.New(st.Store).PrepareNodeRoleRun(ctx, byDep[0].ID, 1)
	require.NoError(t, err)
	require.Empty(t, plan.Skip)
	var nr crowbar.NodeRole
	status, body = st.Do(t, http.MethodGet, path, nil, &nr)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, contract.NodeRoleTransition, nr.State)
	require.NotNil(t, nr.LastRun, "%s", body)
	assert.Equal(t, plan.RunID, nr.LastRun.ID)
	assert.Equal(t, 1, nr.LastRun.Position)
	assert.Equal(t, contract.RunPending, nr.LastRun.State)
	assert.Equal(t, "pool", nr.LastRun.AttrsIn["ntp"], "%s", body)
	assert.Nil(t, nr.LastRun.ExitCode)
}

func TestCrowbarRESTDeploymentRoles(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	ctx := context.Background()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(crowRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "crowd", "release": "crowrel"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	_, _, err := st.Store.CreateNode(ctx, models.NodeInput{Name: nodeName("c1"), Deployment: "crowd"}, false)
	require.NoError(t, err)

	var drs []crowbar.DeploymentRoleView
	status, body = getList(t, st, "/api/v1/deployments/crowd/roles", &drs)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.JSONEq(t, `{"items": [], "next_cursor": ""}`, string(bytes.TrimSpace(body)))

	// Binding db seeds the defaults of db and base.
	var snap crowbar.Snapshot
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/crowd/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID),
		map[string]any{"node": nodeName("c1"), "role": "db"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = getList(t, st, "/api/v1/deployments/crowd/roles", &drs)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, drs, 2)
	assert.Equal(t, "base", drs[0].Role)
	assert.Equal(t, map[string]any{"ntp": "pool"}, drs[0].Data)
	assert.Equal(t, "db", drs[1].Role)

	var dr crowbar.DeploymentRoleView
	status, body = st.Do(t, http.MethodGet, "/api/v1/deployments/crowd/roles/db", nil, &dr)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, map[string]any{"port": float64(5432)}, dr.Data)
	assert.Equal(t, drs[1].ID, dr.ID)
	status, body = st.Do(t, http.MethodGet, "/api/v1/deployments/crowd/roles/cache", nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "not bound yet: %s", body)
	assert.Contains(t, string(body), "PUT")
	expectInvalid(t, st, http.MethodGet, "/api/v1/deployments/crowd/roles/nosuch", nil, "role")
	status, _ = st.Do(t, http.MethodGet, "/api/v1/deployments/ghost/roles", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/deployments/ghost/roles/db", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	// PUT creates (201), then replaces (200).
	put := "/api/v1/deployments/crowd/roles/cache"
	// (A fresh variable per answer: decoding into a used map merges.)
	var created, replaced crowbar.DeploymentRoleView
	status, body = st.Do(t, http.MethodPut, put, map[string]any{"data": map[string]any{"size": 1, "mode": "lru"}}, &created)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, "cache", created.Role)
	assert.Equal(t, map[string]any{"size": float64(1), "mode": "lru"}, created.Data)
	status, body = st.Do(t, http.MethodPut, put, map[string]any{"data": map[string]any{"size": 2}}, &replaced)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, created.ID, replaced.ID)
	assert.Equal(t, map[string]any{"size": float64(2)}, replaced.Data, "replaced, not merged")

	// Bad bodies: 422 naming data (400 for an unknown field), and nothing
	// changes.
	for _, bad := range []string{`{"data": [1]}`, `{"data": "x"}`, `{"data": 3}`, `{"data": true}`, `{"data": null}`, `{}`} {
		e := expectInvalid(t, st, http.MethodPut, put, bad, "data")
		assert.NotEmpty(t, e.Error.Message, bad)
	}
	status, body = st.Do(t, http.MethodPut, put, `{"data": {}, "extra": 1}`, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	status, body = st.Do(t, http.MethodPut, put, `{"data": {`, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	expectInvalid(t, st, http.MethodPut, "/api/v1/deployments/crowd/roles/nosuch", map[string]any{"data": map[string]any{}}, "role")
	status, _ = st.Do(t, http.MethodPut, "/api/v1/deployments/ghost/roles/cache", map[string]any{"data": map[string]any{}}, nil)
	assert.Equal(t, http.StatusNotFound, status)
	var after crowbar.DeploymentRoleView
	status, body = st.Do(t, http.MethodGet, put, nil, &after)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, map[string]any{"size": float64(2)}, after.Data)

	// A new binding is seeded from the defaults.
	var nr crowbar.NodeRole
	status, body = st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID),
		map[string]any{"node": nodeName("c1"), "role": "cache"}, &nr)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, map[string]any{"size": float64(2)}, nr.UserData)
}
