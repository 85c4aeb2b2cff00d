package web_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// logsRelease: a task that prints several KB over a few seconds, then one
// whose log outgrows the server's cap.
const logsRelease = `
name: logs
version: "1"
roles_metadata:
  talker: {tags: [talker]}
graphs:
  deployment:
    tasks:
      - id: chatty
        tags: [talker]
        parameters:
          cmd: "i=0; while [ $i -lt 30 ]; do printf 'line %03d %0150d\n' $i 0; echo \"warn $i\" >&2; i=$((i+1)); sleep 0.1; done"
          timeout: 60
      - id: big
        tags: [talker]
        requires: [chatty]
        parameters: {cmd: "head -c 9000000 /dev/zero | tr '\\0' x | fold -w 200", timeout: 120}
`

// TestRunLogsE2E: a real agent ships a run's log while it runs; a follower
// gets it live and whole (byte for byte what the node wrote); a log past
// the cap keeps its head and says it was cut.
func TestRunLogsE2E(t *testing.T) {
	t.Parallel()
	// The big run's 9 MB of output keeps this process busy (the agent runs
	// in it, under -race): on a loaded machine its run heartbeats can fall
	// more than the default 3 s apart.
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 10})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(logsRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "logs", "release": "logs"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	node := nodeName("talker")
	agent := st.StartAgent(t, node)
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+node, map[string]any{"deployment": "logs", "roles": []string{"talker"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)

	tx := execute(t, st, map[string]any{"deployment": "logs", "graphs": []any{map[string]any{"type": "deployment"}}})
	var chatty models.TaskRun
	require.Eventually(t, func() bool {
		chatty = runsByKey(t, st, tx.TaskUUID, "")["chatty@"+node]
		return chatty.State == "running"
	}, 30*time.Second, 50*time.Millisecond)
	logPath := fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", tx.TaskUUID, chatty.ID)

	// Follow it from the start: pieces arrive while the run goes on.
	req, err := http.NewRequest(http.MethodGet, st.URL+logPath+"?follow=1", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+st.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
	var (
		mu       sync.Mutex
		followed bytes.Buffer
		arrivals []time.Time
	)
	streamed := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				mu.Lock()
				followed.Write(buf[:n])
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				streamed <- err
				return
			}
		}
	}()
	select {
	case err := <-streamed:
		require.NoError(t, err, "the follow ends by itself when the run ends")
	case <-time.After(60 * time.Second):
		t.Fatal("following the log did not end with the run")
	}
	chatty = runsByKey(t, st, tx.TaskUUID, "")["chatty@"+node]
	require.Equal(t, "succeeded", chatty.State)
	require.NotNil(t, chatty.FinishedAt)
	mu.Lock()
	got, first := followed.String(), arrivals[0]
	pieces := len(arrivals)
	mu.Unlock()
	assert.True(t, first.Before(chatty.FinishedAt.Add(-time.Second)),
		"the first bytes arrived at %s, the run finished at %s: not live", first, chatty.FinishedAt)
	assert.Greater(t, pieces, 1, "the log came in several pieces")

	onNode, err := os.ReadFile(filepath.Join(agent.WorkDir, "logs", tx.TaskUUID, fmt.Sprintf("chatty.%d.1.log", chatty.ID)))
	require.NoError(t, err)
	assert.Greater(t, len(onNode), 5000, "several KB")
	assert.Equal(t, string(onNode), got, "the followed log is what the node wrote")
	status, whole := st.Do(t, http.MethodGet, logPath, nil, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, string(onNode), string(whole), "read again: the same")
	assert.Contains(t, got, "out| line 029 ")
	assert.Contains(t, got, "err| warn 29\n")

	// The cap: the head is kept, the end says so.
	done := waitDone(t, st, tx.TaskUUID, 2*time.Minute)
	require.Equal(t, models.TxReady, done.Status)
	big := runsByKey(t, st, tx.TaskUUID, "")["big@"+node]
	bigOnNode, err := os.ReadFile(filepath.Join(agent.WorkDir, "logs", tx.TaskUUID, fmt.Sprintf("big.%d.1.log", big.ID)))
	require.NoError(t, err)
	require.Greater(t, len(bigOnNode), models.MaxRunLogBytes)
	req, err = http.NewRequest(http.MethodGet, st.URL+fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", tx.TaskUUID, big.ID), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+st.AdminToken)
	resp2, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp2.Body.Close()
	bigLog, err := io.ReadAll(resp2.Body)
	require.NoError(t, err)
	assert.Equal(t, "true", resp2.Header.Get("X-Anneal-Log-Truncated"))
	assert.Equal(t, fmt.Sprint(len(bigOnNode)), resp2.Header.Get("X-Anneal-Log-Size"), "the server knows the whole length")
	require.Greater(t, len(bigLog), models.MaxRunLogBytes)
	assert.True(t, bytes.Equal(bigOnNode[:models.MaxRunLogBytes], bigLog[:models.MaxRunLogBytes]), "the head, byte for byte")
	tail := string(bigLog[models.MaxRunLogBytes:])
	assert.Contains(t, tail, "# anneal: log truncated")
	assert.Contains(t, tail, fmt.Sprint(len(bigOnNode)))
	assert.Less(t, len(tail), 400, "nothing past the cap but the note")

	// Bad input names the field; another transaction's run is not found.
	status, raw := st.Do(t, http.MethodGet, logPath+"?attempt=2", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", raw)
	assert.Contains(t, string(raw), "attempt")
	status, raw = st.Do(t, http.MethodGet, logPath+"?follow=yes", nil, nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", raw)
	assert.Contains(t, string(raw), "follow")
	status, _ = st.Do(t, http.MethodGet, fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", "00000000-0000-4000-8000-000000000000", chatty.ID), nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	// An agent cannot ship into another node's run.
	other := st.StartAgent(t, nodeName("other"))
	req, err = http.NewRequest(http.MethodPost, st.URL+fmt.Sprintf("/api/v1/agent/runs/%d/log?attempt=1&offset=0", chatty.ID), strings.NewReader("forged\n"))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+other.Token(t))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp3, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp3.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp3.StatusCode)
}
