package web_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestManyNodesWaitOnOne runs the deployment graph on a controller and 39
// computes that all wait for its api task: the graph asks for its 40 node
// workflows at most 32 at a time (node-start-window), and the controller
// wakes the 39 from one WakeNodes activity (wake-nodes-activity) instead
// of 39 signals of its own. Every run succeeds, and none waiting on the
// api starts before it finished.
func TestManyNodesWaitOnOne(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	roles := map[string][]string{"ctl": {"controller"}}
	const computes = 39
	for i := range computes {
		roles[fmt.Sprintf("cmp%02d", i)] = []string{"compute"}
	}
	setup(t, st, roles)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	tx := waitDone(t, st, ans.TaskUUID, 2*time.Minute)
	require.Equal(t, models.TxReady, tx.Status, "%+v", tx)
	assert.Equal(t, map[string]int{"succeeded": 3 + 2*computes}, tx.Counts)

	runs := runsByKey(t, st, ans.TaskUUID, "")
	api := runs["api@"+nodeName("ctl")]
	require.NotNil(t, api.FinishedAt)
	for i := range computes {
		n := nodeName(fmt.Sprintf("cmp%02d", i))
		hv := runs["hypervisor@"+n]
		require.Equal(t, contract.RunSucceeded, hv.State, n)
		require.NotNil(t, hv.StartedAt, n)
		assert.False(t, hv.StartedAt.Before(*api.FinishedAt), "hypervisor on %s started before the api finished", n)
		// Woken, not found by the fallback poll (30 s after it began waiting).
		assert.Less(t, hv.StartedAt.Sub(*api.FinishedAt), 20*time.Second, "hypervisor on %s started long after the api finished", n)
	}

	graphID := ans.WorkflowID + "/graph-0"
	ctlID := ans.WorkflowID + "/" + nodeName("ctl")
	// The graph never had more than the window's node workflows asked for
	// and not yet started.
	asked, pending, most := 0, 0, 0
	for _, ev := range historyOf(t, st, graphID) {
		switch ev.GetEventType() {
		case enums.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
			asked++
			pending++
			most = max(most, pending)
		case enums.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED, enums.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED:
			pending--
		}
	}
	assert.Equal(t, computes+1, asked)
	assert.Equal(t, 32, most, "node workflows asked for and not yet started, at most")

	// The controller woke the computes from one activity.
	var wakes, signals int
	for _, ev := range historyOf(t, st, ctlID) {
		switch {
		case ev.GetEventType() == enums.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
			signals++
		case ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == contract.WakeNodesActivity:
			wakes++
		}
	}
	assert.Equal(t, 1, wakes, "WakeNodes activities of the controller")
	assert.Zero(t, signals, "signals the controller sent itself")

	recordHistories(t, st, map[string]string{
		"graph-run-start-window": graphID,
		"node-wake-activity":     ctlID,
	})
}

// historyOf reads the whole history of a workflow.
func historyOf(t *testing.T, st *testenv.Stack, id string) []*history.HistoryEvent {
	t.Helper()
	iter := st.Temporal.GetWorkflowHistory(context.Background(), id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []*history.HistoryEvent
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		events = append(events, ev)
	}
	return events
}
