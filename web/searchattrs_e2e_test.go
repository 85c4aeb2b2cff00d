package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// saRelease: one graph that succeeds, one that fails.
const saRelease = `
name: sa
version: "1"
roles_metadata:
  box: {tags: [box]}
graphs:
  deployment:
    tasks:
      - {id: ok, tags: [box], parameters: {cmd: "echo fine", timeout: 30}}
  breaking:
    tasks:
      - {id: ok, tags: [box], parameters: {cmd: "echo fine", timeout: 30}}
      - {id: breaks, tags: [box], requires: [ok], parameters: {cmd: "echo broken >&2; exit 2", timeout: 30}}
`

// TestSearchAttributesWithTemporalCLI: after a failing and a succeeding
// transaction on each of two deployments, the real temporal CLI's
// `workflow list --query` finds exactly the right workflows by
// Deployment, ExecutionStatus, AnnealStatus, Transaction, GraphType and
// Node.
func TestSearchAttributesWithTemporalCLI(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	ctx := context.Background()
	bin, err := devenv.TemporalBinary(ctx, nil)
	require.NoError(t, err, "the temporal CLI")
	addr := os.Getenv(testenv.EnvTemporal)

	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(saRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	// The Temporal server is shared by every test (and kept by `dev up`):
	// names unique to this run.
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	deps := []string{"sa-a-" + suffix, "sa-b-" + suffix}
	type txns struct{ ok, failed executeAnswer }
	started := map[string]txns{}
	for i, dep := range deps {
		status, body := st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": dep, "release": "sa"}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
		node := nodeName(fmt.Sprintf("box%d-%s", i, suffix))
		st.StartAgent(t, node)
		status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+node, map[string]any{"deployment": dep, "roles": []string{"box"}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
		var tt txns
		tt.ok = execute(t, st, map[string]any{"deployment": dep, "graphs": []any{map[string]any{"type": "deployment"}}})
		assert.Equal(t, models.TxReady, waitDone(t, st, tt.ok.TaskUUID, time.Minute).Status)
		tt.failed = execute(t, st, map[string]any{"deployment": dep, "graphs": []any{map[string]any{"type": "breaking"}}})
		assert.Equal(t, models.TxError, waitDone(t, st, tt.failed.TaskUUID, time.Minute).Status)
		started[dep] = tt
	}

	// list runs the CLI and returns the workflow IDs it finds, sorted;
	// visibility is eventually consistent, so it retries until want shows.
	list := func(query string, want []string) []string {
		t.Helper()
		var ids []string
		deadline := time.Now().Add(30 * time.Second)
		for {
			cmd := exec.CommandContext(ctx, bin, "workflow", "list", "--address", addr, "--namespace", "default",
				"--query", query, "--output", "json")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "temporal workflow list --query %q: %s", query, stderr.String())
			var rows []struct {
				Execution struct {
					WorkflowID string `json:"workflowId"`
				} `json:"execution"`
			}
			if len(strings.TrimSpace(string(out))) > 0 {
				require.NoError(t, json.Unmarshal(out, &rows), "%s", out)
			}
			ids = ids[:0]
			for _, r := range rows {
				ids = append(ids, r.Execution.WorkflowID)
			}
			slices.Sort(ids)
			if slices.Equal(ids, want) || time.Now().After(deadline) {
				return ids
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }

	for i, dep := range deps {
		tt := started[dep]
		failedID := contract.TransactionWorkflowID(tt.failed.TaskUUID)
		assert.Equal(t, []string{failedID},
			list(fmt.Sprintf(`Deployment=%q AND ExecutionStatus="Failed"`, dep), []string{failedID}),
			"the failing transaction of %s, and nothing else", dep)
		okID := contract.TransactionWorkflowID(tt.ok.TaskUUID)
		want := sorted(okID, failedID)
		assert.Equal(t, want, list(fmt.Sprintf(`Deployment=%q AND WorkflowType="Transaction"`, dep), want))
		assert.Equal(t, []string{failedID}, list(fmt.Sprintf(`Deployment=%q AND AnnealStatus="error"`, dep), []string{failedID}))
		assert.Equal(t, []string{okID}, list(fmt.Sprintf(`Deployment=%q AND AnnealStatus="ready"`, dep), []string{okID}))

		// A transaction's own workflows: itself, its graph, its node.
		node := nodeName(fmt.Sprintf("box%d-%s", i, suffix))
		want = sorted(failedID, contract.GraphWorkflowID(tt.failed.TaskUUID, 0), contract.NodeWorkflowID(tt.failed.TaskUUID, node))
		assert.Equal(t, want, list(fmt.Sprintf("`Transaction`=%q", tt.failed.TaskUUID), want))
		want = sorted(contract.NodeWorkflowID(tt.ok.TaskUUID, node), contract.NodeWorkflowID(tt.failed.TaskUUID, node))
		assert.Equal(t, want, list(fmt.Sprintf(`Node=%q AND WorkflowType="NodeRun"`, node), want))
		want = []string{contract.GraphWorkflowID(tt.failed.TaskUUID, 0)}
		assert.Equal(t, want, list(fmt.Sprintf(`Deployment=%q AND GraphType="breaking" AND WorkflowType="GraphRun"`, dep), want))
	}
}
