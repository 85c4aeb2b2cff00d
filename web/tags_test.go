package web_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// tagsRelease decomposes a controller (mysql, rabbitmq, keystone) in Fuel's
// shape; mysql has a primary, whose node alone bootstraps the database.
const tagsRelease = `
name: decomposed
version: "1"
roles_metadata:
  controller: {name: Controller, tags: [mysql, rabbitmq, keystone]}
  compute: {name: Compute, tags: [hypervisor]}
tags_metadata:
  mysql: {name: MySQL, has_primary: true}
  ceph: {name: Ceph}
graphs:
  deployment:
    tasks:
      - id: mysql
        tags: [mysql]
        parameters: {cmd: "echo mysql"}
      - id: mysql-bootstrap
        tags: [primary-mysql]
        requires: [mysql]
        parameters: {cmd: "echo bootstrap"}
      - id: rabbitmq
        tags: [rabbitmq]
        parameters: {cmd: "echo rabbitmq"}
      - id: keystone
        tags: [keystone]
        parameters: {cmd: "echo keystone"}
      - id: nova
        tags: [hypervisor]
        parameters: {cmd: "echo nova"}
      - id: swift
        tags: [swift]
        parameters: {cmd: "echo swift"}
`

// errorAnswer is the API's error envelope.
type errorAnswer struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
}

// tagSetup imports tagsRelease, creates deployments d1 and d2 of it and
// starts one agent per entry of roles (in d1), in the order given.
func tagSetup(t *testing.T, st *testenv.Stack, roles ...[]string) []string {
	t.Helper()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(tagsRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, d := range []string{"d1", "d2"} {
		status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": d, "release": "decomposed@1"}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
	}
	var names []string
	for i, rs := range roles {
		name := nodeName(fmt.Sprintf("n%d", i+1))
		st.StartAgent(t, name)
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+name, map[string]any{"deployment": "d1", "roles": rs}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
		names = append(names, name)
	}
	return names
}

// requireError asserts an error answer with status and, for 422, field.
func requireError(t *testing.T, st *testenv.Stack, method, path string, body any, status int, field string) errorAnswer {
	t.Helper()
	got, raw := st.Do(t, method, path, body, nil)
	require.Equal(t, status, got, "%s %s: %s", method, path, raw)
	var e errorAnswer
	require.NoError(t, jsonUnmarshal(raw, &e), "%s", raw)
	if field != "" {
		assert.Equal(t, field, e.Error.Details["field"], "%s", raw)
	}
	return e
}

func listTags(t *testing.T, st *testenv.Stack, query string) map[string]fuel.Tag {
	t.Helper()
	var tags []fuel.Tag
	status, raw := getList(t, st, "/api/v1/tags?"+query, &tags)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	out := map[string]fuel.Tag{}
	for _, tag := range tags {
		out[tag.Name] = tag
	}
	return out
}

func nodeTags(t *testing.T, st *testenv.Stack, node string) fuel.NodeTagView {
	t.Helper()
	var view fuel.NodeTagView
	status, raw := st.Do(t, http.MethodGet, "/api/v1/nodes/"+node+"/tags", nil, &view)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	return view
}

func TestTagCRUDAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	tagSetup(t, st)

	rel := listTags(t, st, "release=decomposed@1")
	require.Len(t, rel, 5)
	assert.True(t, rel["mysql"].ReadOnly)
	assert.True(t, rel["mysql"].HasPrimary)
	assert.Equal(t, []string{"controller"}, rel["mysql"].Roles)
	assert.False(t, rel["ceph"].ReadOnly, "declared in tags_metadata only")

	var swift fuel.Tag
	status, raw := st.Do(t, http.MethodPost, "/api/v1/tags",
		map[string]any{"name": "swift", "deployment": "d1", "has_primary": true, "metadata": map[string]any{"replicas": 3}}, &swift)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	assert.Equal(t, fuel.OwnerDeployment, swift.OwnerKind)
	assert.Equal(t, map[string]any{"replicas": float64(3)}, swift.Metadata)

	for _, bad := range []string{"", "two words", "swift:1", "primary-swift"} {
		requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": bad, "deployment": "d1"}, http.StatusUnprocessableEntity, "name")
	}
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "x"}, http.StatusUnprocessableEntity, "release")
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "x", "release": "decomposed", "deployment": "d1"}, http.StatusUnprocessableEntity, "deployment")
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "x", "deployment": "nope"}, http.StatusUnprocessableEntity, "deployment")
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "x", "deployment": "d1", "color": "red"}, http.StatusBadRequest, "color")
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "swift", "deployment": "d1"}, http.StatusConflict, "")
	requireError(t, st, http.MethodPost, "/api/v1/tags", map[string]any{"name": "mysql", "deployment": "d1"}, http.StatusConflict, "")

	// A deployment sees its release's tags and its own; another does not.
	d1 := listTags(t, st, "deployment=d1")
	assert.Len(t, d1, 6)
	assert.Equal(t, swift.ID, d1["swift"].ID)
	d2 := listTags(t, st, "deployment=d2")
	assert.Len(t, d2, 5)
	assert.NotContains(t, d2, "swift")
	assert.NotContains(t, listTags(t, st, "release=decomposed"), "swift")
	requireError(t, st, http.MethodGet, "/api/v1/tags", nil, http.StatusUnprocessableEntity, "release")
	requireError(t, st, http.MethodGet, "/api/v1/tags?release=decomposed&deployment=d1", nil, http.StatusUnprocessableEntity, "deployment")
	requireError(t, st, http.MethodGet, "/api/v1/tags?deployment=nope", nil, http.StatusNotFound, "")

	var got fuel.Tag
	status, raw = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/tags/%d", swift.ID), nil, &got)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, "swift", got.Name)
	requireError(t, st, http.MethodGet, "/api/v1/tags/9999", nil, http.StatusNotFound, "")
	requireError(t, st, http.MethodGet, "/api/v1/tags/abc", nil, http.StatusBadRequest, "id")

	status, raw = st.Do(t, http.MethodPatch, fmt.Sprintf("/api/v1/tags/%d", swift.ID),
		map[string]any{"has_primary": false, "metadata": map[string]any{"replicas": 2}}, &got)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.False(t, got.HasPrimary)
	assert.Equal(t, map[string]any{"replicas": float64(2)}, got.Metadata)

	// Tags stuck to a role: 409 on modify and delete, and nothing changes.
	mysql := rel["mysql"]
	e := requireError(t, st, http.MethodPatch, fmt.Sprintf("/api/v1/tags/%d", mysql.ID), map[string]any{"has_primary": false}, http.StatusConflict, "")
	assert.Equal(t, "tag mysql is stuck to role(s) controller; change the release instead", e.Error.Message)
	requireError(t, st, http.MethodDelete, fmt.Sprintf("/api/v1/tags/%d", mysql.ID), nil, http.StatusConflict, "")
	assert.True(t, listTags(t, st, "release=decomposed")["mysql"].HasPrimary)

	// A user-defined release tag can be modified and deleted.
	ceph := rel["ceph"]
	status, raw = st.Do(t, http.MethodPatch, fmt.Sprintf("/api/v1/tags/%d", ceph.ID), map[string]any{"has_primary": true}, &got)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.True(t, got.HasPrimary)

	var del fuel.TagDeletion
	status, raw = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/tags/%d", swift.ID), nil, &del)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, "swift", del.Tag.Name)
	requireError(t, st, http.MethodGet, fmt.Sprintf("/api/v1/tags/%d", swift.ID), nil, http.StatusNotFound, "")
	requireError(t, st, http.MethodDelete, fmt.Sprintf("/api/v1/tags/%d", swift.ID), nil, http.StatusNotFound, "")
}

func TestNodeTagAssignmentAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	nodes := tagSetup(t, st, []string{"controller"}, []string{"compute"})
	ctl, cmp := nodes[0], nodes[1]

	view := nodeTags(t, st, ctl)
	assert.Equal(t, []string{"controller", "mysql", "rabbitmq", "keystone"}, view.Tags)
	assert.Equal(t, []string{"controller"}, view.Roles)
	assert.Equal(t, []string{"mysql"}, view.Primary)
	requireError(t, st, http.MethodGet, "/api/v1/nodes/ghost.anneal.test/tags", nil, http.StatusNotFound, "")

	var swiftD2 fuel.Tag
	status, raw := st.Do(t, http.MethodPost, "/api/v1/tags", map[string]any{"name": "swift", "deployment": "d2"}, &swiftD2)
	require.Equal(t, http.StatusCreated, status, "%s", raw)

	// Bad tags: 422 naming the entry, and nothing written.
	for _, c := range []struct {
		tags  []string
		field string
	}{
		{[]string{"ceph", "nope"}, "tags[1]"},
		{[]string{"ceph", "swift"}, "tags[1]"}, // d2's tag is not visible in d1
		{[]string{"mysql:0"}, "tags[0]"},
		{[]string{"ceph", "mysql:1", "nope:2"}, "tags[2]"},
		{[]string{"primary-mysql"}, "tags[0]"},
	} {
		requireError(t, st, http.MethodPost, "/api/v1/nodes/"+cmp+"/tags", map[string]any{"tags": c.tags}, http.StatusUnprocessableEntity, c.field)
	}
	requireError(t, st, http.MethodPost, "/api/v1/nodes/"+cmp+"/tags", map[string]any{"tags": []string{}}, http.StatusUnprocessableEntity, "tags")
	assert.Equal(t, []string{"compute", "hypervisor"}, nodeTags(t, st, cmp).Tags)

	// Release tags, role names and instance tags "name:N".
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes/"+cmp+"/tags", map[string]any{"tags": []string{"ceph", "mysql:1", "controller", "ceph"}}, &view)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, []string{"compute", "hypervisor", "ceph", "mysql:1", "controller"}, view.Tags)
	assert.Empty(t, view.Primary, "an instance tag does not hold mysql")

	// A deployment tag of d1, once created, can be assigned in d1.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/tags", map[string]any{"name": "swift", "deployment": "d1"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes/"+cmp+"/tags", map[string]any{"tags": []string{"swift", "swift:2"}}, &view)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Contains(t, view.Tags, "swift:2")

	// Unassign: a tag not held is fine; removing all is allowed.
	status, raw = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+cmp+"/tags", map[string]any{"tags": []string{"controller", "not-held"}}, &view)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, []string{"compute", "hypervisor", "ceph", "mysql:1", "swift", "swift:2"}, view.Tags)
	status, raw = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+ctl+"/tags", map[string]any{"tags": []string{"controller", "mysql", "rabbitmq", "keystone"}}, &view)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, []string{}, view.Tags)
	assert.Equal(t, []string{"controller"}, view.Roles)

	// Deleting a tag unassigns it (and its instances) from the nodes.
	d1 := listTags(t, st, "deployment=d1")
	var del fuel.TagDeletion
	status, raw = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/tags/%d", d1["swift"].ID), nil, &del)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, []string{cmp}, del.UnassignedFrom)
	assert.Equal(t, []string{"compute", "hypervisor", "ceph", "mysql:1"}, nodeTags(t, st, cmp).Tags)
}

// dryRun executes the deployment graph of d1 as a dry run and returns its
// planned runs by "task@node".
func dryRun(t *testing.T, st *testenv.Stack) map[string]models.TaskRun {
	t.Helper()
	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}, "dry_run": true})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	return runsByKey(t, st, ans.TaskUUID, "")
}

func TestPrimaryTagAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	nodes := tagSetup(t, st, []string{"controller"}, []string{"controller"}, []string{"compute"})
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	// n1 (lowest id) is the primary of mysql: only it bootstraps.
	for range 2 {
		runs := dryRun(t, st)
		assert.Equal(t, contract.RunPlanned, runs["mysql-bootstrap@"+n1].State)
		assert.NotContains(t, runs, "mysql-bootstrap@"+n2, "the primary is stable across re-plans")
		assert.Contains(t, runs, "mysql@"+n2)
		assert.NotContains(t, runs, "mysql-bootstrap@"+n3)
	}
	assert.Equal(t, []string{"mysql"}, nodeTags(t, st, n1).Primary)
	assert.Equal(t, []string{}, nodeTags(t, st, n2).Primary)

	// n1 loses mysql: n2 becomes primary and stays so when n1 gets it back.
	status, raw := st.Do(t, http.MethodDelete, "/api/v1/nodes/"+n1+"/tags", map[string]any{"tags": []string{"mysql"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, []string{"mysql"}, nodeTags(t, st, n2).Primary)
	runs := dryRun(t, st)
	assert.Contains(t, runs, "mysql-bootstrap@"+n2)
	assert.NotContains(t, runs, "mysql@"+n1)
	assert.NotContains(t, runs, "mysql-bootstrap@"+n1)
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes/"+n1+"/tags", map[string]any{"tags": []string{"mysql"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	runs = dryRun(t, st)
	assert.Contains(t, runs, "mysql-bootstrap@"+n2)
	assert.NotContains(t, runs, "mysql-bootstrap@"+n1)
	assert.Contains(t, runs, "mysql@"+n1)

	// Decomposition: the compute node takes swift, defined for d1 only.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/tags", map[string]any{"name": "swift", "deployment": "d1"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes/"+n3+"/tags", map[string]any{"tags": []string{"swift"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	runs = dryRun(t, st)
	assert.Contains(t, runs, "swift@"+n3)
	assert.NotContains(t, runs, "swift@"+n1)
}

func TestDeploymentCheckAPI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	nodes := tagSetup(t, st, []string{"compute"})

	var check fuel.DeploymentCheck
	status, raw := st.Do(t, http.MethodGet, "/api/v1/deployments/d1/check", nil, &check)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, "d1", check.Deployment)
	assert.False(t, check.OK)
	assert.Equal(t, []string{"ceph", "hypervisor", "keystone", "mysql", "rabbitmq"}, check.Mandatory)
	var missing []string
	for _, w := range check.Warnings {
		missing = append(missing, w.Tag)
	}
	assert.Equal(t, []string{"ceph", "keystone", "mysql", "rabbitmq"}, missing)
	assert.Contains(t, check.Warnings, fuel.CheckWarning{Tag: "mysql",
		Message: "no node of deployment d1 holds the mandatory tag mysql (declared by release decomposed@1)"})

	// Deploying is allowed anyway.
	dryRun(t, st)

	// Tags assigned by hand count.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/nodes/"+nodes[0]+"/tags",
		map[string]any{"tags": []string{"ceph", "keystone", "mysql", "rabbitmq"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	check = fuel.DeploymentCheck{}
	status, raw = st.Do(t, http.MethodGet, "/api/v1/deployments/d1/check", nil, &check)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.True(t, check.OK, "%s", raw)
	assert.Empty(t, check.Warnings)

	requireError(t, st, http.MethodGet, "/api/v1/deployments/nope/check", nil, http.StatusNotFound, "")
}
