package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/scenarios"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// noderoles lists the noderoles of a deployment's committed snapshot by
// "role@short-node-name".
func noderoles(t *testing.T, st *testenv.Stack, deployment string) map[string]crowbar.NodeRole {
	t.Helper()
	var list []crowbar.NodeRole
	status, body := getList(t, st, "/api/v1/noderoles?deployment="+deployment, &list)
	require.Equal(t, http.StatusOK, status, "%s", body)
	out := map[string]crowbar.NodeRole{}
	for _, nr := range list {
		out[nr.RoleName+"@"+strings.TrimSuffix(nr.NodeName, "."+domain)] = nr
	}
	return out
}

// getNodeRole reads one noderole with its last run.
func getNodeRole(t *testing.T, st *testenv.Stack, id int64) crowbar.NodeRole {
	t.Helper()
	var nr crowbar.NodeRole
	status, body := st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/noderoles/%d", id), nil, &nr)
	require.Equal(t, http.StatusOK, status, "%s", body)
	return nr
}

// waitActive waits until every noderole of the deployment named in keys is
// active, failing early on one in error.
func waitActive(t *testing.T, st *testenv.Stack, deployment string, keys ...string) map[string]crowbar.NodeRole {
	t.Helper()
	var nrs map[string]crowbar.NodeRole
	require.Eventually(t, func() bool {
		nrs = noderoles(t, st, deployment)
		for _, k := range keys {
			nr, ok := nrs[k]
			if !ok {
				return false
			}
			if nr.State == contract.NodeRoleError {
				full := getNodeRole(t, st, nr.ID)
				t.Fatalf("noderole %s failed: %+v", k, full.LastRun)
			}
			if nr.State != contract.NodeRoleActive {
				return false
			}
		}
		return true
	}, 90*time.Second, 200*time.Millisecond, "noderoles %v of %s never all active: %v", keys, deployment, states(nrs))
	return nrs
}

func states(nrs map[string]crowbar.NodeRole) map[string]string {
	out := map[string]string{}
	for k, nr := range nrs {
		out[k] = nr.State
	}
	return out
}

// commitAnswer is the answer to a commit: the snapshot, whether the
// annealer was woken, and the deploy-changes transaction it started.
type commitAnswer struct {
	crowbar.Snapshot
	Annealer      map[string]any `json:"annealer"`
	DeployChanges map[string]any `json:"deploy_changes"`
}

// bindAll proposes a snapshot of the deployment, binds each role@node,
// commits it by the deployment's name and returns the commit's answer,
// checking that the commit woke the annealer.
func bindAll(t *testing.T, st *testenv.Stack, deployment string, bindings ...string) commitAnswer {
	t.Helper()
	var snap crowbar.Snapshot
	status, body := st.Do(t, http.MethodPost, "/api/v1/deployments/"+deployment+"/snapshots/propose", nil, &snap)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for _, b := range bindings {
		role, node, _ := strings.Cut(b, "@")
		status, body := st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID),
			map[string]any{"node": nodeName(node), "role": role}, nil)
		require.Equal(t, http.StatusCreated, status, "bind %s: %s", b, body)
	}
	// Committed by the deployment's name (the same as POST /snapshots/:id/commit).
	var committed commitAnswer
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/"+deployment+"/snapshots/commit", nil, &committed)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Equal(t, crowbar.SnapshotCommitted, committed.State)
	require.Equal(t, map[string]any{"woken": true}, committed.Annealer, "%s", body)
	require.Equal(t, snap.ID, committed.ID)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments/"+deployment+"/snapshots/commit", nil, nil)
	require.Equal(t, http.StatusConflict, status, "nothing proposed any more: %s", body)
	assert.Contains(t, string(body), "propose one first")
	return committed
}

// before asserts that run a finished before run b started.
func before(t *testing.T, a, b crowbar.NodeRole) {
	t.Helper()
	require.NotNil(t, a.LastRun, "%s@%s has a run", a.RoleName, a.NodeName)
	require.NotNil(t, b.LastRun, "%s@%s has a run", b.RoleName, b.NodeName)
	require.NotNil(t, a.LastRun.FinishedAt)
	require.NotNil(t, b.LastRun.StartedAt)
	assert.False(t, b.LastRun.StartedAt.Before(*a.LastRun.FinishedAt),
		"%s@%s (finished %s) before %s@%s (started %s)", a.RoleName, a.NodeName, a.LastRun.FinishedAt, b.RoleName, b.NodeName, b.LastRun.StartedAt)
}

// TestAnnealerGrowsTheSampleDeployment drives the Crowbar model end to end
// on the sample release: agents phone home and get the discovery role
// (node-base); a snapshot binds db-server on n1 and app-server on n2 and n3
// (moving them from system into sample); the annealer runs them in
// dependency order through the agents; then a new snapshot grows the
// deployment to five nodes.
func TestAnnealerGrowsTheSampleDeployment(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(string(scenarios.SampleRelease)), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "sample", "release": "sample"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)

	// Phone home: each node gets node-base in system, and the annealer runs it.
	for _, n := range []string{"n1", "n2", "n3"} {
		st.StartAgent(t, nodeName(n))
	}
	sys := waitActive(t, st, models.SystemDeployment, "node-base@n1", "node-base@n2", "node-base@n3")
	base1 := getNodeRole(t, st, sys["node-base@n1"].ID)
	assert.Equal(t, map[string]any{"base": map[string]any{"hostname": nodeName("n1")}}, base1.Wall, "the wall is what the run added")
	assert.Equal(t, map[string]any{"base": map[string]any{"ntp": "pool.ntp.org"}}, base1.LastRun.AttrsIn, "it saw its template")

	// Three nodes: each on the admin network (bound first, so it runs first
	// on its node), the database on n1, the application on n2 and n3.
	committed := bindAll(t, st, "sample", "network-admin@n1", "network-admin@n2", "network-admin@n3",
		"db-server@n1", "app-server@n2", "app-server@n3")
	assert.Equal(t, []string{nodeName("n1"), nodeName("n2"), nodeName("n3")}, committed.MovedNodes)
	var node models.Node
	status, body = st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("n2"), nil, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	sample, err := st.Store.Deployment(t.Context(), "sample")
	require.NoError(t, err)
	assert.Equal(t, sample.ID, node.DeploymentID, "moved into sample by the commit")

	nrs := waitActive(t, st, "sample", "db-server@n1", "app-server@n2", "app-server@n3",
		"network-admin@n1", "network-admin@n2", "network-admin@n3")
	// The network role's on_proposed event gave each node its own address.
	addresses := map[string]any{}
	for _, n := range []string{"n1", "n2", "n3"} {
		addresses[n] = dig(nrs["network-admin@"+n].SystemData, "network", "admin", "address")
	}
	assert.Equal(t, map[string]any{"n1": "192.168.124.10/24", "n2": "192.168.124.11/24", "n3": "192.168.124.12/24"}, addresses)
	db := getNodeRole(t, st, nrs["db-server@n1"].ID)
	app2 := getNodeRole(t, st, nrs["app-server@n2"].ID)
	app3 := getNodeRole(t, st, nrs["app-server@n3"].ID)
	// Order: a node's base before its database; the database before the
	// applications that require it, on other nodes.
	before(t, base1, db)
	before(t, db, app2)
	before(t, db, app3)
	assert.Equal(t, []int64{base1.ID}, db.Parents, "db-server's parent is node-base on its own node, in system")

	// The wall of the database is what its script added; an application
	// run saw it (its parent's), its own node's base, and its template.
	dbURL := "postgres://" + nodeName("n1") + ":5432/sample"
	assert.Equal(t, map[string]any{"db": map[string]any{"url": dbURL}}, db.Wall)
	seen := app2.LastRun.AttrsIn
	assert.Equal(t, dbURL, dig(seen, "db", "url"), "the parent's wall is visible")
	assert.Equal(t, float64(5432), dig(seen, "db", "port"), "the parent's data is visible")
	// node-base of n2 (active on the node) is overridden by node-base of n1,
	// a parent of its parent: parents beat the node's own noderoles.
	assert.Equal(t, nodeName("n1"), dig(seen, "base", "hostname"), "the grandparent beats the node")
	assert.Equal(t, float64(2), dig(seen, "app", "workers"), "its own template")
	assert.Equal(t, "192.168.124.11/24", dig(seen, "network", "admin", "address"), "its node's active noderoles")
	before(t, getNodeRole(t, st, nrs["network-admin@n2"].ID), app2)
	assert.Equal(t, map[string]any{"app": map[string]any{"endpoint": "http://" + nodeName("n2") + ":8080"}}, app2.Wall)

	// Grow to five nodes by a new snapshot.
	for _, n := range []string{"n4", "n5"} {
		st.StartAgent(t, nodeName(n))
	}
	waitActive(t, st, models.SystemDeployment, "node-base@n4", "node-base@n5")
	grown := bindAll(t, st, "sample", "network-admin@n4", "network-admin@n5", "app-server@n4", "app-server@n5")
	assert.Equal(t, []string{nodeName("n4"), nodeName("n5")}, grown.MovedNodes)
	assert.Len(t, grown.NodeRoles, 10, "the new snapshot carries the old bindings and the new")
	nrs = waitActive(t, st, "sample", "db-server@n1", "app-server@n2", "app-server@n3", "app-server@n4", "app-server@n5")
	for _, k := range []string{"db-server@n1", "app-server@n2", "app-server@n3"} {
		assert.Equal(t, 1, nrs[k].RunCount, "%s did not run again", k)
	}
	dbCopy := getNodeRole(t, st, nrs["db-server@n1"].ID)
	require.NotNil(t, dbCopy.LastRun, "the copy shows the run it carries the result of")
	assert.Equal(t, db.LastRun.ID, dbCopy.LastRun.ID)
	for _, k := range []string{"app-server@n4", "app-server@n5"} {
		app := getNodeRole(t, st, nrs[k].ID)
		assert.Equal(t, []int64{dbCopy.ID}, app.Parents, "%s requires the database of the committed snapshot", k)
		assert.Equal(t, dbURL, dig(app.LastRun.AttrsIn, "db", "url"), "%s saw the database's wall", k)
		assert.NotEmpty(t, dig(app.LastRun.AttrsIn, "network", "admin", "address"), "%s saw its address", k)
		assert.Equal(t, 1, app.RunCount)
	}
	var depStatus struct {
		NodeRoles map[string]int `json:"noderoles"`
	}
	status, body = st.Do(t, http.MethodGet, "/api/v1/deployments/sample", nil, &depStatus)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, map[string]int{"proposed": 0, "todo": 0, "blocked": 0, "transition": 0, "active": 10, "error": 0},
		depStatus.NodeRoles, "the deployment shows the annealer's progress")
	recordHistories(t, st, map[string]string{
		"noderole-run":   contract.NodeRoleWorkflowID(st.TaskQueue, db.ID, 1),
		"node-bootstrap": bootstrapID(t, st, "n1"),
		"annealer":       contract.AnnealerWorkflowID(st.TaskQueue),
	})
	// The old snapshot is archived, one linear history.
	var hist []crowbar.Snapshot
	status, body = getList(t, st, "/api/v1/deployments/sample/snapshots", &hist)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, hist, 3)
	assert.Equal(t, []string{crowbar.SnapshotArchived, crowbar.SnapshotArchived, crowbar.SnapshotCommitted},
		[]string{hist[0].State, hist[1].State, hist[2].State})
}

// dig reads a nested value of a JSON object.
func dig(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = obj[p]
	}
	return cur
}
