package web_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// historyBound is the most events a workflow of a transaction may record,
// from the transaction's size: a Transaction grows with its graphs, a
// GraphRun with its nodes, a NodeRun with its tasks and cross-node edges.
// Per item: an activity or child costs 3 events plus up to two workflow
// tasks of 3; a cross-node wait costs a signal and its workflow task, a
// fallback timer started and cancelled, and the signal sent on.
func historyBound(workflowType string, graphs, nodes, tasks, crossEdges int) int {
	switch workflowType {
	case contract.TransactionWorkflow:
		return 30 + 15*graphs // PlanGraph and a GraphRun child per graph
	case contract.GraphWorkflow:
		return 30 + 9*nodes // a NodeRun child per node
	case contract.NodeWorkflow:
		return 50 + 9*tasks + 8*crossEdges
	}
	panic("no bound for " + workflowType)
}

// The bound holds where it matters: a site of 1,000 nodes deployed with a
// scenario of 5 graphs of 20 tasks stays under Temporal's 10,240-event
// warning in every one of its workflows.
func TestHistoryBoundAtAThousandNodes(t *testing.T) {
	for _, typ := range []string{contract.TransactionWorkflow, contract.GraphWorkflow, contract.NodeWorkflow} {
		assert.Less(t, historyBound(typ, 5, 1000, 20, 2), 10240, typ)
	}
}

const boundRelease = `
name: bound
version: "1"
roles_metadata:
  worker: {tags: [worker]}
  head: {tags: [head]}
graphs:
  g1:
    tasks:
      - {id: a, type: noop, tags: [worker, head]}
      - {id: b, type: noop, tags: [worker, head], requires: [a]}
      - {id: c, type: noop, tags: [worker, head], requires: [b]}
  g2:
    tasks:
      - {id: ready, type: noop, tags: [head]}
      - {id: join, type: noop, tags: [worker], cross_depends: [{name: ready, tags: [head]}]}
      - {id: d, type: noop, tags: [worker, head]}
  g3:
    tasks:
      - {id: e, type: noop, tags: [worker, head]}
      - {id: f, type: noop, tags: [worker, head], requires: [e]}
`

// A transaction of several graphs keeps every workflow's history under the
// bound its size gives, measured through the Temporal API: the graphs run
// as GraphRun children, so no history grows with nodes × graphs.
func TestHistoriesStayBounded(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(boundRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "big", "release": "bound"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	const nodes = 24
	for i := range nodes {
		name := nodeName(fmt.Sprintf("h%02d", i))
		status, body = st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": name}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
		role := "worker"
		if i == 0 {
			role = "head"
		}
		status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+name, map[string]any{"deployment": "big", "roles": []string{role}}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	// No agents: the tasks are no-ops the worker records, and the nodes
	// count as alive (nodes without an agent credential are never marked
	// silent).
	require.NoError(t, st.Store.DB.Exec("UPDATE nodes SET alive = true").Error)

	ans := execute(t, st, map[string]any{"deployment": "big", "graphs": []map[string]any{{"type": "g1"}, {"type": "g2"}, {"type": "g3"}}})
	tx := waitDone(t, st, ans.TaskUUID, 2*time.Minute)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)

	ctx := context.Background()
	length := func(id, runID string) int {
		desc, err := st.Temporal.DescribeWorkflowExecution(ctx, id, runID)
		require.NoError(t, err, id)
		return int(desc.GetWorkflowExecutionInfo().GetHistoryLength())
	}
	largest := map[string]int{}
	largest[contract.TransactionWorkflow] = length(ans.WorkflowID, "")
	for gi := range 3 {
		graphID := contract.GraphWorkflowID(ans.TaskUUID, gi)
		largest[contract.GraphWorkflow] = max(largest[contract.GraphWorkflow], length(graphID, ""))
		// Every node workflow of the graph, by the runs its history started.
		iter := st.Temporal.GetWorkflowHistory(ctx, graphID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		children := 0
		for iter.HasNext() {
			ev, err := iter.Next()
			require.NoError(t, err)
			if started := ev.GetChildWorkflowExecutionStartedEventAttributes(); started != nil {
				children++
				exec := started.GetWorkflowExecution()
				largest[contract.NodeWorkflow] = max(largest[contract.NodeWorkflow], length(exec.GetWorkflowId(), exec.GetRunId()))
			}
		}
		assert.Equal(t, nodes, children, "graph %d ran a node workflow per node", gi)
	}
	t.Logf("largest histories of %d nodes x 3 graphs: %v", nodes, largest)
	for typ, n := range largest {
		assert.LessOrEqual(t, n, historyBound(typ, 3, nodes, 3, 1), typ)
	}
}
