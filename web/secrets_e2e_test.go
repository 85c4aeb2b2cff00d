package web_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/proxy"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/codec"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// syncBuffer collects the stack's log lines from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSecretNeverLeaves plants a secret, runs a transaction (a task on the
// node's agent and a master_shell task in the worker) and a Heat software
// deployment with a hidden input that use it, then searches everything
// anneal keeps or shows for the value: the Temporal histories (raw, and
// decoded with the codec), the API's answers, the stack's and the agent's
// logs, and every text, JSON and bytea column of every table. None holds
// it, while the task and the hook on the node did receive it (they write
// its hash where the test reads it).
func TestSecretNeverLeaves(t *testing.T) {
	logs := &syncBuffer{}
	st := testenv.NewStack(t, testenv.Options{LogSink: logs})
	agents := setup(t, st, map[string][]string{"ctl": {"controller"}})
	value := "s3cr3t-" + uuid.NewString()
	sum := sha256.Sum256([]byte(value))
	wantHash := hex.EncodeToString(sum[:])

	// Names in, names out; admin only.
	var sec models.Secret
	status, raw := st.Do(t, http.MethodPut, "/api/v1/deployments/d1/secrets/db-password", map[string]string{"value": value}, &sec)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	assert.Equal(t, testenv.Keys().PrimaryID(), sec.KeyID)
	status, raw = st.Do(t, http.MethodPut, "/api/v1/deployments/d1/secrets/db-password", map[string]string{"value": value}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	status, raw = st.Do(t, http.MethodPut, "/api/v1/deployments/d1/secrets/short", map[string]string{"value": "abc"}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s", raw)
	assert.Contains(t, string(raw), `"value"`)
	var names []models.Secret
	status, raw = getList(t, st, "/api/v1/deployments/d1/secrets", &names)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, names, 1)
	assert.Equal(t, "db-password", names[0].Name)

	// The graph: a task on the node and one in the worker get the secret
	// in their environment; a third references one that is not set.
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/graphs/secret-use", map[string]any{
		"tasks": []any{
			map[string]any{"id": "use", "tags": []string{"controller"}, "parameters": map[string]any{
				"cmd": `printf '%s' "$DB_PASSWORD" | sha256sum | cut -d' ' -f1 > secret-proof
echo "the password is $DB_PASSWORD"; echo "on stderr: $DB_PASSWORD" >&2
echo "echoed=$DB_PASSWORD" >> "$ANNEAL_OUTPUTS"`,
				"timeout": 30, "secrets": map[string]any{"DB_PASSWORD": map[string]string{"secret": "db-password"}},
			}},
			map[string]any{"id": "master", "type": "master_shell", "tags": []string{"controller"}, "requires": []string{"use"}, "parameters": map[string]any{
				"cmd": `if env | grep -i -E 'database_url|postgres://|secret_key|ANNEAL_TOKEN'; then echo "the worker's environment leaked" >&2; exit 9; fi
echo "master_hash=$(printf '%s' "$DB_PASSWORD" | sha256sum | cut -d' ' -f1)" >> "$ANNEAL_OUTPUTS"
echo "master sees $DB_PASSWORD"`,
				"timeout": 30, "secrets": map[string]any{"DB_PASSWORD": map[string]string{"secret": "db-password"}},
			}},
		},
	}, http.StatusCreated, nil)
	graphOK(t, st, http.MethodPut, "/api/v1/deployments/d1/graphs/secret-missing", map[string]any{
		"tasks": []any{map[string]any{"id": "x", "tags": []string{"controller"}, "parameters": map[string]any{
			"cmd": "true", "secrets": map[string]any{"TOKEN": map[string]string{"secret": "never-set"}}}}},
	}, http.StatusCreated, nil)

	// A secret referenced but not set: 422 naming it, nothing written.
	status, raw = st.Do(t, http.MethodPost, "/api/v1/graphs/execute",
		map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "secret-missing"}}}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s", raw)
	assert.Contains(t, string(raw), "never-set")

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "secret-use"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	require.Equal(t, models.TxReady, tx.Status, "%+v %+v", tx, runs)

	// The node received it.
	proof, err := os.ReadFile(filepath.Join(agents["ctl"].WorkDir, "secret-proof"))
	require.NoError(t, err)
	assert.Equal(t, wantHash, strings.TrimSpace(string(proof)))
	use := runs["use@"+nodeName("ctl")]
	assert.Contains(t, use.StdoutTail, "the password is ***")
	assert.Contains(t, use.StderrTail, "on stderr: ***")
	assert.Equal(t, "***", use.Outputs["echoed"])
	master := runs["master@"+nodeName("ctl")]
	assert.Equal(t, wantHash, master.Outputs["master_hash"], "master_shell got the secret")
	assert.Contains(t, master.StdoutTail, "master sees ***")

	// Heat: a hidden input takes a secret reference only.
	cfgBody := map[string]any{
		"name": "uses-secret",
		"config": `#!/bin/sh
printf '%s' "$password" | sha256sum | cut -d' ' -f1 > "$heat_outputs_path.hash"
printf '%s' "$password" > "$heat_outputs_path.leak"
echo "hook sees $password"`,
		"inputs":  []map[string]any{{"name": "password", "hidden": true}},
		"outputs": []map[string]any{{"name": "hash"}, {"name": "leak"}},
	}
	status, raw = st.Do(t, http.MethodPost, "/api/v1/software_configs", map[string]any{
		"name": "bad", "config": "true", "inputs": []map[string]any{{"name": "p", "hidden": true, "default": "plain"}}}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s", raw)
	assert.Contains(t, string(raw), "inputs[0].default")
	cfg := createConfig(t, st, cfgBody)
	for _, bad := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"password": value}, "hidden"},
		{map[string]any{"password": map[string]any{"get_secret": "never-set"}}, "never-set"},
	} {
		status, raw = st.Do(t, http.MethodPost, "/api/v1/software_deployments", map[string]any{
			"config_id": cfg.ID, "server_id": nodeName("ctl"), "input_values": bad.values}, nil)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s", raw)
		assert.Contains(t, string(raw), bad.want)
	}
	sw := createSoftware(t, st, map[string]any{"config_id": cfg.ID, "server_id": nodeName("ctl"),
		"input_values": map[string]any{"password": map[string]any{"get_secret": "db-password"}}})
	d := waitSoftware(t, st, sw.ID)
	require.Equal(t, contract.SoftwareComplete, d.Status, d.StatusReason)
	assert.Equal(t, wantHash, d.OutputValues["hash"], "the hook received the secret")
	assert.Equal(t, "***", d.OutputValues["leak"])
	assert.Contains(t, d.OutputValues["deploy_stdout"], "hook sees ***")

	// 1. The API's answers.
	var answers []string
	for _, path := range []string{
		"/api/v1/transactions/" + ans.TaskUUID, "/api/v1/transactions/" + ans.TaskUUID + "/runs",
		"/api/v1/deployments/d1", "/api/v1/deployments/d1/secrets", "/api/v1/deployments/d1/graphs/secret-use/tasks",
		"/api/v1/deployments/d1/graphs/secret-use/graph.gv", fmt.Sprintf("/api/v1/software_deployments/%d", sw.ID),
		"/api/v1/software_deployments?server_id=" + nodeName("ctl"), fmt.Sprintf("/api/v1/software_configs/%d", cfg.ID),
		"/api/v1/nodes/" + nodeName("ctl"), "/api/v1/transactions",
	} {
		status, raw := st.Do(t, http.MethodGet, path, nil, nil)
		require.Equal(t, http.StatusOK, status, "%s: %s", path, raw)
		answers = append(answers, string(raw))
	}
	assertNoLeak(t, value, "API answers", strings.Join(answers, "\n"))

	// 2. The Temporal histories of every workflow of this stack's queue,
	// raw as fetched and decoded with the codec.
	ctx := context.Background()
	list, err := st.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Query: fmt.Sprintf("TaskQueue = %q", st.TaskQueue), PageSize: 1000})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(list.Executions), 3, "the transaction, its node workflow(s) and the software deployment")
	dec := &codec.Codec{Keys: testenv.Keys()}
	var decodedAll strings.Builder
	encrypted := 0
	for _, ex := range list.Executions {
		iter := st.Temporal.GetWorkflowHistory(ctx, ex.Execution.WorkflowId, ex.Execution.RunId, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for iter.HasNext() {
			ev, err := iter.Next()
			require.NoError(t, err)
			rawBytes, err := proto.Marshal(ev)
			require.NoError(t, err)
			rawJSON, err := protojson.Marshal(ev)
			require.NoError(t, err)
			assertNoLeak(t, value, "raw history of "+ex.Execution.WorkflowId, string(rawBytes)+string(rawJSON))
			err = proxy.VisitPayloads(ctx, ev, proxy.VisitPayloadsOptions{
				SkipSearchAttributes: true,
				Visitor: func(_ *proxy.VisitPayloadsContext, ps []*commonpb.Payload) ([]*commonpb.Payload, error) {
					for _, p := range ps {
						if string(p.Metadata["encoding"]) == codec.Encoding {
							encrypted++
						}
					}
					out, err := dec.Decode(ps)
					if err != nil {
						return nil, err
					}
					for _, p := range out {
						decodedAll.Write(p.Data)
						decodedAll.WriteByte('\n')
					}
					return out, nil
				},
			})
			require.NoError(t, err)
		}
	}
	assert.Positive(t, encrypted, "payloads are encrypted")
	assert.Contains(t, decodedAll.String(), `"use"`, "the codec decodes the payloads (a run's task name)")
	assertNoLeak(t, value, "decoded histories", decodedAll.String())

	// 3. The stack's logs and the agent's log files and records.
	assert.Contains(t, logs.String(), "run reported", "the stack's log was captured")
	assertNoLeak(t, value, "the stack's log", logs.String())
	for _, dir := range []string{"logs", "records"} {
		n := 0
		root := filepath.Join(agents["ctl"].WorkDir, dir)
		require.NoError(t, filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			assertNoLeak(t, value, path, string(b))
			n++
			return nil
		}))
		assert.Positive(t, n, "files under %s", root)
	}
	runLog, err := os.ReadFile(filepath.Join(agents["ctl"].WorkDir, "logs", ans.TaskUUID, fmt.Sprintf("use.%d.1.log", use.ID)))
	require.NoError(t, err)
	assert.Contains(t, string(runLog), "out| the password is ***")

	// 4. Every plain column of every table.
	cols, checked := assertNotInDatabase(t, st, value, hex.EncodeToString([]byte(value)), base64.StdEncoding.EncodeToString([]byte(value)))
	t.Logf("searched %d columns (%d values), %d history executions, %d bytes of logs", cols, checked, len(list.Executions), len(logs.String()))
}

// assertNotInDatabase searches every text, JSON, bytea, array and enum
// column of every table of the stack's database for each needle, and
// fails naming the column where one is found. It returns how many columns
// and values it searched.
func assertNotInDatabase(t *testing.T, st *testenv.Stack, needles ...string) (columns, values int) {
	t.Helper()
	type column struct{ Table, Column string }
	var cols []column
	require.NoError(t, st.Store.DB.Raw(`SELECT table_name AS "table", column_name AS "column" FROM information_schema.columns
WHERE table_schema = 'public' AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'bytea', 'ARRAY', 'USER-DEFINED')`).Scan(&cols).Error)
	require.NotEmpty(t, cols)
	for _, c := range cols {
		var vals []string
		require.NoError(t, st.Store.DB.Raw(fmt.Sprintf(`SELECT %q::text FROM %q WHERE %q IS NOT NULL`, c.Column, c.Table, c.Column)).Scan(&vals).Error)
		for _, v := range vals {
			for i, n := range needles {
				if strings.Contains(v, n) {
					t.Errorf("needle %d (%.12s…) is in %s.%s", i, n, c.Table, c.Column)
				}
			}
		}
		values += len(vals)
	}
	return len(cols), values
}

// assertNoLeak fails naming where the value was found.
func assertNoLeak(t *testing.T, value, where, text string) {
	t.Helper()
	if strings.Contains(text, value) {
		i := strings.Index(text, value)
		t.Errorf("the secret's value leaked into %s: …%s…", where, text[max(0, i-120):i])
	}
}

// The codec server decodes what the stack encrypted for an operator token,
// refuses a viewer, and answers the Web UI's CORS preflight.
func TestCodecServer(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{TemporalUI: "http://127.0.0.1:8233"})
	p, err := codec.DataConverter(testenv.Keys()).ToPayload(map[string]string{"hello": "operator"})
	require.NoError(t, err)
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: []*commonpb.Payload{p}})
	require.NoError(t, err)
	var tok struct {
		Token string `json:"token"`
	}
	for _, scope := range []string{"operator", "viewer"} {
		status, raw := st.Do(t, http.MethodPost, "/api/v1/tokens", map[string]string{"name": "codec-" + scope, "scope": scope}, &tok)
		require.Equal(t, http.StatusCreated, status, "%s", raw)
		status, raw = testenv.Call(t, http.MethodPost, st.URL+"/api/v1/codec/decode", tok.Token, body, nil)
		if scope == "viewer" {
			assert.Equal(t, http.StatusForbidden, status, "%s", raw)
			continue
		}
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var out commonpb.Payloads
		require.NoError(t, protojson.Unmarshal(raw, &out))
		require.Len(t, out.Payloads, 1)
		assert.JSONEq(t, `{"hello":"operator"}`, string(out.Payloads[0].Data))
	}
	status, raw := st.Do(t, http.MethodPost, "/api/v1/codec/decode", "not payloads", nil)
	assert.Equal(t, http.StatusBadRequest, status, "%s", raw)
	assert.Contains(t, string(raw), "payloads")

	req, err := http.NewRequest(http.MethodOptions, st.URL+"/api/v1/codec/decode", nil)
	require.NoError(t, err)
	req.Header.Set("Origin", "http://127.0.0.1:8233")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-namespace")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "http://127.0.0.1:8233", resp.Header.Get("Access-Control-Allow-Origin"))
}
