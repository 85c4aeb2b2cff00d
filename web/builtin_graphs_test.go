package web_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestBuiltinGraphs runs the built-in provision, verification and deletion
// graphs on real agents: provision lays down the base state and marks the
// nodes provisioned, verification reaches every peer's agent (and names the
// one it cannot reach), deletion erases the node and returns it to
// discovery.
func TestBuiltinGraphs(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 3})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}, "c1": {"compute"}, "c2": {"compute"}})

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "provision"}, {"type": "verification"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	for short, a := range agents {
		hostname, err := os.ReadFile(filepath.Join(a.WorkDir, "system", "hostname"))
		require.NoError(t, err, short)
		assert.Equal(t, nodeName(short)+"\n", string(hostname))
		var node models.Node
		st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName(short), nil, &node)
		assert.Equal(t, models.NodeProvisioned, node.Status, short)
	}
	runs := runsByKey(t, st, ans.TaskUUID, "")
	check := runs["check-peers@"+nodeName("ctl")]
	assert.Contains(t, check.StdoutTail, "reached "+agents["c1"].Address)
	assert.Contains(t, check.StdoutTail, "reached "+agents["c2"].Address)

	// A peer whose agent is gone cannot be reached: verification fails and
	// names it (the gone node's own check times out).
	agents["c2"].Stop()
	ans = execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "verification"}}, "force": true})
	tx = waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxError, tx.Status)
	runs = runsByKey(t, st, ans.TaskUUID, "")
	check = runs["check-peers@"+nodeName("ctl")]
	assert.Equal(t, contract.RunFailed, check.State)
	assert.Contains(t, check.StderrTail, "cannot reach "+agents["c2"].Address)
	assert.Equal(t, agents["c2"].Address, check.Outputs["unreachable"])

	var c1 models.Node
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("c1"), nil, &c1)
	ans = execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deletion", "nodes": []int64{c1.ID}}}})
	tx = waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	_, err := os.Stat(filepath.Join(agents["c1"].WorkDir, "system"))
	assert.True(t, os.IsNotExist(err), "the node's state is erased")
	st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("c1"), nil, &c1)
	assert.Equal(t, models.NodeDiscover, c1.Status)
	assert.Empty(t, c1.Roles)
}
