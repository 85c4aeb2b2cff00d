package web_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// decomposeRelease has one controller role whose services carry their own
// tags, and a haproxy task selected by the legacy role field.
const decomposeRelease = `
name: decompose
version: "1"
roles_metadata:
  controller: {tags: [database, queue, api]}
tags_metadata:
  database: {has_primary: true}
graphs:
  deployment:
    tasks:
      - id: database
        tags: [database]
        parameters: {cmd: "echo db > database", timeout: 30}
      - id: queue
        tags: [queue]
        parameters: {cmd: "echo q > queue", timeout: 30}
      - id: api
        tags: [api]
        cross_depends:
          - {name: database, tags: [database]}
          - {name: queue, tags: [queue]}
        parameters: {cmd: "echo api", timeout: 30}
      - id: haproxy
        role: [controller]
        parameters: {cmd: "echo haproxy", timeout: 30}
`

// TestDecomposeControllerAcrossNodes splits the controller's services over
// three nodes by removing tags, checks which tasks ran where, then moves the
// queue to another node and checks that only the tasks of the two nodes it
// moved between run again.
func TestDecomposeControllerAcrossNodes(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(decomposeRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "cloud", "release": "decompose"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	keep := map[string]string{"n1": "database", "n2": "queue", "n3": "api"}
	for _, short := range []string{"n1", "n2", "n3"} {
		st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short),
			map[string]any{"deployment": "cloud", "roles": []string{"controller"}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
		var drop []string
		for _, tag := range []string{"controller", "database", "queue", "api"} {
			if tag != keep[short] {
				drop = append(drop, tag)
			}
		}
		status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName(short)+"/tags", map[string]any{"tags": drop}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}

	first := execute(t, st, map[string]any{"deployment": "cloud", "graphs": []map[string]any{{"type": "deployment"}}})
	tx := waitDone(t, st, first.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, first.TaskUUID, "")
	want := []string{
		"database@" + nodeName("n1"), "queue@" + nodeName("n2"), "api@" + nodeName("n3"),
		// haproxy selects the role, and a role's name stays an implicit tag.
		"haproxy@" + nodeName("n1"), "haproxy@" + nodeName("n2"), "haproxy@" + nodeName("n3"),
	}
	assert.ElementsMatch(t, want, keys(runs))
	api := runs["api@"+nodeName("n3")]
	for _, dep := range []string{"database@" + nodeName("n1"), "queue@" + nodeName("n2")} {
		assert.False(t, api.StartedAt.Before(*runs[dep].FinishedAt), "api started before %s finished", dep)
	}

	// Move the queue from n2 to n3 and deploy again.
	status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName("n2")+"/tags", map[string]any{"tags": []string{"queue"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/nodes/"+nodeName("n3")+"/tags", map[string]any{"tags": []string{"queue"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	second := execute(t, st, map[string]any{"deployment": "cloud", "graphs": []map[string]any{{"type": "deployment"}}})
	tx = waitDone(t, st, second.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	// A node's tags are part of what its tasks see ($ANNEAL_ATTRS), so the
	// tasks of the two nodes the queue moved between run again; n1's,
	// which saw nothing change, are skipped.
	ran := runsByKey(t, st, second.TaskUUID, "?state=succeeded")
	assert.ElementsMatch(t, []string{"queue@" + nodeName("n3"), "api@" + nodeName("n3"), "haproxy@" + nodeName("n3"), "haproxy@" + nodeName("n2")},
		keys(ran), "the moved service and the tasks of the nodes whose tags changed run")
	skipped := runsByKey(t, st, second.TaskUUID, "?state=skipped")
	assert.ElementsMatch(t, []string{"database@" + nodeName("n1"), "haproxy@" + nodeName("n1")}, keys(skipped))
	assert.NotContains(t, keys(runsByKey(t, st, second.TaskUUID, "")), "queue@"+nodeName("n2"))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
