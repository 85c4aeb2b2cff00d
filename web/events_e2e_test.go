package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// sse is one server-sent event as a client reads it.
type sse struct {
	ID, Event string
	Data      map[string]any
}

// eventClient reads GET /api/v1/events into a channel until ctx ends.
type eventClient struct {
	resp   *http.Response
	events chan sse
	retry  string
}

func openEvents(t *testing.T, ctx context.Context, url, token, lastID string) *eventClient {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
	c := &eventClient{resp: resp, events: make(chan sse, 10000)}
	rd := bufio.NewReader(resp.Body)
	// The stream opens with its retry delay: once read, the subscription
	// is registered and nothing committed afterwards is missed.
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	c.retry = strings.TrimSpace(line)
	go func() {
		defer close(c.events)
		defer resp.Body.Close()
		var cur sse
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if cur.Event != "" {
					c.events <- cur
				}
				cur = sse{}
			case strings.HasPrefix(line, "id: "):
				cur.ID = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.Event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.Data)
			}
		}
	}()
	return c
}

// until collects events until done says so (with the events so far) or
// the time runs out.
func (c *eventClient) until(t *testing.T, within time.Duration, done func([]sse) bool) []sse {
	t.Helper()
	var got []sse
	deadline := time.After(within)
	for {
		select {
		case e, ok := <-c.events:
			if !ok {
				t.Fatalf("the event stream ended after %d events", len(got))
			}
			got = append(got, e)
			if done(got) {
				return got
			}
		case <-deadline:
			t.Fatalf("timed out after %d events: %+v", len(got), got)
		}
	}
}

// TestEventStream subscribes to one deployment's events with a viewer
// token, runs a transaction there and one in another deployment, and
// checks that the first arrive in order (transaction pending, running,
// ready; each run pending, running, succeeded) and none of the second; an
// unfiltered subscriber sees both; a reconnection with Last-Event-ID gets
// what followed; an unknown id, or one from before a time when nobody
// listened, asks for a resync.
func TestEventStream(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	setup(t, st, map[string][]string{"ev1": {"controller"}})
	status, body := st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d2", "release": "e2e"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	st.StartAgent(t, nodeName("ev2"))
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("ev2"), map[string]any{"deployment": "d2", "roles": []string{"controller"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var d1, d2 models.Deployment
	st.Do(t, http.MethodGet, "/api/v1/deployments/d1", nil, &d1)
	st.Do(t, http.MethodGet, "/api/v1/deployments/d2", nil, &d2)
	require.NotZero(t, d1.ID)
	require.NotZero(t, d2.ID)

	viewer, err := st.Store.CreateAPIToken(context.Background(), "events-viewer", models.ScopeViewer)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mine := openEvents(t, ctx, st.URL+"/api/v1/events?deployment=d1", viewer, "")
	all := openEvents(t, ctx, st.URL+"/api/v1/events", st.AdminToken, "")
	assert.Equal(t, "retry: 2000", mine.retry)

	other := execute(t, st, map[string]any{"deployment": "d2", "graphs": []map[string]any{{"type": "produce"}}})
	tx := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "produce"}}})
	isReady := func(id string) func([]sse) bool {
		return func(evs []sse) bool {
			for _, e := range evs {
				if e.Event == "transaction" && e.Data["id"] == id && e.Data["state"] == models.TxReady {
					return true
				}
			}
			return false
		}
	}
	got := mine.until(t, 60*time.Second, isReady(tx.TaskUUID))

	var txStates, runStates []string
	for _, e := range got {
		assert.Equal(t, float64(d1.ID), e.Data["deployment_id"], "an event of another deployment: %+v", e)
		assert.NotEqual(t, other.TaskUUID, e.Data["id"])
		assert.NotEqual(t, other.TaskUUID, e.Data["transaction"])
		assert.Equal(t, e.Event, e.Data["kind"])
		assert.NotEmpty(t, e.ID)
		switch e.Event {
		case "transaction":
			txStates = append(txStates, e.Data["state"].(string))
		case "run":
			if e.Data["transaction"] == tx.TaskUUID {
				assert.Equal(t, "mint", e.Data["task"])
				assert.Equal(t, nodeName("ev1"), e.Data["node"])
				runStates = append(runStates, e.Data["state"].(string))
			}
		}
	}
	assert.Equal(t, []string{"pending", "running", "ready"}, txStates)
	assert.Equal(t, []string{"pending", "running", "succeeded"}, runStates)

	// The unfiltered stream has both deployments' transactions.
	both := all.until(t, 60*time.Second, func(evs []sse) bool { return isReady(tx.TaskUUID)(evs) && isReady(other.TaskUUID)(evs) })
	deps := map[float64]bool{}
	for _, e := range both {
		deps[e.Data["deployment_id"].(float64)] = true
	}
	assert.True(t, deps[float64(d1.ID)] && deps[float64(d2.ID)], "deployments seen: %v", deps)

	// Reconnecting after the first event replays the rest, in order.
	again := openEvents(t, ctx, st.URL+"/api/v1/events?deployment=d1&wait=2s", viewer, got[0].ID)
	replayed := again.until(t, 10*time.Second, func(evs []sse) bool { return len(evs) == len(got)-1 })
	for i, e := range replayed {
		assert.Equal(t, got[i+1].ID, e.ID)
	}
	// An id of another server (or a restart) cannot be replayed: resync.
	stale := openEvents(t, ctx, st.URL+"/api/v1/events?wait=2s", viewer, "0badf00d-7")
	first := stale.until(t, 10*time.Second, func(evs []sse) bool { return len(evs) == 1 })
	assert.Equal(t, "resync", first[0].Event)

	// A time when no server held a lease (migration 0028) left changes
	// unannounced: the ids from before cannot be resumed.
	require.NoError(t, st.Store.DB.Exec("UPDATE event_listeners SET until = now() - interval '1 second'").Error)
	st.API.ExpireEventLease()
	gap := openEvents(t, ctx, st.URL+"/api/v1/events?deployment=d1&wait=2s", viewer, got[0].ID)
	first = gap.until(t, 10*time.Second, func(evs []sse) bool { return len(evs) == 1 })
	assert.Equal(t, "resync", first[0].Event)

	// Bad input is a 4xx naming the field.
	status, body = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/events?deployment=nosuch", viewer, nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "%s", body)
	status, body = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/events?wait=soon", viewer, nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	assert.Contains(t, string(body), "wait")
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/events?wait=0s", "", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, status)
}
