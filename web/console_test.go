package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/worker/server"
)

// The scope matrix, as issue 12 states it, written here independently of
// the server's table (web/access.go):
//   - admin: every operators' route;
//   - operator: every read but the tokens', plus the writes below (execute,
//     stop, retry, bind, commit and tag);
//   - viewer: every read but the tokens';
//   - enroll: only agent registration;
//   - a node's agent: only /api/v1/agent/* (registration aside).
var (
	matrixOperatorWrites = map[string]bool{
		"POST /api/v1/graphs/execute":                     true, // execute
		"POST /api/v1/scenarios/{name}/execute":           true, // execute
		"POST /api/v1/transactions/{uuid}/stop":           true, // stop
		"POST /api/v1/transactions/{uuid}/retry":          true, // retry
		"POST /api/v1/noderoles/{id}/retry":               true, // retry
		"POST /api/v1/deployments/{id}/snapshots/propose": true, // bind (a proposal to bind into)
		"POST /api/v1/snapshots/{id}/noderoles":           true, // bind
		"DELETE /api/v1/noderoles/{id}":                   true, // bind (undo a binding of a proposal)
		"POST /api/v1/deployments/{id}/snapshots/commit":  true, // commit
		"POST /api/v1/snapshots/{id}/commit":              true, // commit
		"POST /api/v1/nodes/{id}/tags":                    true, // tag
		"DELETE /api/v1/nodes/{id}/tags":                  true, // tag
		"POST /api/v1/codec/decode":                       true, // read payloads in the Web UI
		"POST /api/v1/codec/encode":                       true, // the codec server's other half
	}
	matrixAdminReads = map[string]bool{"GET /api/v1/tokens": true, "GET /api/v1/nodes/{id}/ssh": true}
)

// mayUse says whether a principal may use an operation of the document.
func mayUse(who, op string) bool {
	method, path, _ := strings.Cut(op, " ")
	switch {
	case path == "/api/v1/agent/register":
		return who == "admin" || who == "enroll"
	case strings.HasPrefix(path, "/api/v1/agent/"):
		return who == "agent"
	}
	read := method == http.MethodGet && !matrixAdminReads[op]
	switch who {
	case "admin":
		return true
	case "operator":
		return read || matrixOperatorWrites[op]
	case "viewer":
		return read
	}
	return false // enroll, agent
}

// TestScopeMatrix walks every operation of the OpenAPI document under
// /api/v1 (but the public health and document routes) with a token of every
// scope and a node agent's credential, and checks that each is refused
// (403) exactly where the matrix above says so. Parameters name nothing
// that exists and bodies are empty, so nothing is written.
func TestScopeMatrix(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	ctx := context.Background()
	tokens := map[string]string{"admin": st.AdminToken, "enroll": st.EnrollToken}
	for _, scope := range []string{models.ScopeOperator, models.ScopeViewer} {
		secret, err := st.Store.CreateAPIToken(ctx, "matrix-"+scope, scope)
		require.NoError(t, err)
		tokens[scope] = secret
	}
	agent := st.StartAgent(t, nodeName("matrix"))
	tokens["agent"] = agent.Token(t)

	_, doc := openAPIServer(t)
	var ops []string
	for path, item := range object(doc["paths"]) {
		if !strings.HasPrefix(path, "/api/v1/") || path == "/api/v1/health" || path == "/api/v1/openapi.json" {
			continue
		}
		for _, m := range httpMethods {
			if _, ok := object(item)[m]; ok {
				ops = append(ops, strings.ToUpper(m)+" "+path)
			}
		}
	}
	sort.Strings(ops)
	require.Greater(t, len(ops), 80, "the document's operations")
	fill := strings.NewReplacer("{uuid}", uuid.NewString(), "{id}", "999999", "{name}", "matrix-nosuch",
		"{type}", "nosuch", "{plugin}", "nosuch", "{role}", "nosuch")
	who := []string{"admin", "operator", "viewer", "enroll", "agent"}
	for _, op := range ops {
		method, path, _ := strings.Cut(op, " ")
		target := st.URL + fill.Replace(path)
		if method == http.MethodGet {
			target += "?wait=0s" // the agents' long polls answer at once
		}
		for _, w := range who {
			var body any
			if method != http.MethodGet {
				body = "{}"
			}
			status, raw := testenv.Call(t, method, target, tokens[w], body, nil)
			if mayUse(w, op) {
				assert.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, status, "%s with the %s token: %s", op, w, raw)
				if status >= 500 {
					t.Logf("note: %s with the %s token answered %d: %s", op, w, status, raw)
				}
			} else {
				assert.Equal(t, http.StatusForbidden, status, "%s with the %s token must be refused: %s", op, w, raw)
			}
		}
		status, _ := testenv.Call(t, method, target, "", nil, nil)
		assert.Equal(t, http.StatusUnauthorized, status, "%s without a token", op)
	}
}

type tokenJSON struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	Scope      string     `json:"scope"`
	Token      string     `json:"token"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

// TestTokensAPI creates, lists and revokes tokens; a revoked token stops
// working at once although the server had cached it.
func TestTokensAPI(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	var tok tokenJSON
	status, raw := st.Do(t, http.MethodPost, "/api/v1/tokens", map[string]string{"name": "ci", "scope": "operator"}, &tok)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	assert.Equal(t, "ci", tok.Name)
	assert.Equal(t, "operator", tok.Scope)
	require.True(t, strings.HasPrefix(tok.Token, "ann_"), tok.Token)

	// The operator token runs things but manages no tokens.
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes", tok.Token, nil, nil)
	require.Equal(t, http.StatusOK, status)
	status, raw = testenv.Call(t, http.MethodPost, st.URL+"/api/v1/tokens", tok.Token, map[string]string{"name": "x", "scope": "admin"}, nil)
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, string(raw), "scope admin")

	var list []tokenJSON
	status, raw = getList(t, st, "/api/v1/tokens", &list)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.NotEmpty(t, list)
	assert.Equal(t, tok.ID, list[0].ID, "newest first")
	assert.NotNil(t, list[0].LastUsedAt, "its use is recorded")
	assert.NotContains(t, string(raw), tok.Token, "a list never shows a secret")
	assert.NotContains(t, string(raw), `"token"`)

	status, _ = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/tokens/%d", tok.ID), nil, nil)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes", tok.Token, nil, nil)
	assert.Equal(t, http.StatusUnauthorized, status, "revoked at once, cache or not")
	status, _ = st.Do(t, http.MethodDelete, fmt.Sprintf("/api/v1/tokens/%d", tok.ID), nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	// Bad input names the field and writes nothing.
	requireError(t, st, http.MethodPost, "/api/v1/tokens", map[string]string{"name": "x", "scope": "root"}, http.StatusUnprocessableEntity, "scope")
	requireError(t, st, http.MethodPost, "/api/v1/tokens", map[string]string{"name": " ", "scope": "viewer"}, http.StatusUnprocessableEntity, "name")
	requireError(t, st, http.MethodPost, "/api/v1/tokens", map[string]string{"name": strings.Repeat("n", 201), "scope": "viewer"}, http.StatusUnprocessableEntity, "name")
	requireError(t, st, http.MethodPost, "/api/v1/tokens", map[string]any{"name": "x", "scope": "viewer", "ttl": 3}, http.StatusBadRequest, "ttl")
	requireError(t, st, http.MethodDelete, "/api/v1/tokens/abc", nil, http.StatusBadRequest, "id")
	requireError(t, st, http.MethodGet, "/api/v1/tokens?limit=0", nil, http.StatusBadRequest, "limit")
	requireError(t, st, http.MethodGet, "/api/v1/tokens?limit=1001", nil, http.StatusBadRequest, "limit")
	requireError(t, st, http.MethodGet, "/api/v1/tokens?cursor=%21%21", nil, http.StatusBadRequest, "cursor")
	var after []tokenJSON
	getList(t, st, "/api/v1/tokens", &after)
	assert.Len(t, after, len(list)-1, "refused requests create nothing")
}

// TestFirstAdminToken: a fresh install's first admin token, made by the
// command line path (server.CreateToken, what `worker token create` runs)
// and by the bootstrap token, which is stored only while no admin token
// exists.
func TestFirstAdminToken(t *testing.T) {
	store, dbURL := testenv.Store(t)
	ctx := context.Background()
	secret := models.NewSecret("ann_")
	created, err := store.BootstrapAdminToken(ctx, "bootstrap", secret)
	require.NoError(t, err)
	assert.True(t, created, "no admin token yet: stored")
	p, err := store.Authenticate(ctx, secret)
	require.NoError(t, err)
	assert.Equal(t, models.ScopeAdmin, p.Scope)
	created, err = store.BootstrapAdminToken(ctx, "bootstrap", models.NewSecret("ann_"))
	require.NoError(t, err)
	assert.False(t, created, "an admin token exists: ignored")
	_, err = store.BootstrapAdminToken(ctx, "bootstrap", "short")
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)

	tok, cli, err := server.CreateToken(ctx, dbURL, "first-admin", models.ScopeAdmin)
	require.NoError(t, err)
	assert.Equal(t, "first-admin", tok.Name)
	p, err = store.Authenticate(ctx, cli)
	require.NoError(t, err)
	assert.Equal(t, "first-admin", p.Name)
	_, _, err = server.CreateToken(ctx, dbURL, "x", "root")
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "scope", ie.Field)
}

// TestEnrollNodeCreatedThroughTheAPI: a node created with POST /nodes has
// no credential; a real agent registering under its name enrolls it (it
// becomes alive and gets work), and a second registration is refused with
// what to do.
func TestEnrollNodeCreatedThroughTheAPI(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	name := nodeName("pre")
	var created models.Node
	status, raw := st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": name}, &created)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	assert.False(t, created.Alive)

	agent := st.StartAgent(t, name)
	var node models.Node
	status, raw = st.Do(t, http.MethodGet, "/api/v1/nodes/"+name, nil, &node)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, created.ID, node.ID, "the same node, enrolled")
	assert.True(t, node.Alive)
	// Its own credential works on the agents' routes.
	var beat protocol.HeartbeatResponse
	status, raw = testenv.Call(t, http.MethodPost, st.URL+"/api/v1/agent/heartbeat", agent.Token(t), map[string]any{"boot_id": "b1"}, &beat)
	assert.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, created.ID, beat.NodeID)
	assert.Equal(t, 10, beat.EverySec, "the heartbeat period asked for: a third of the node silence (the heartbeat timeout, 3 s in tests, but at least 30 s)")

	status, raw = testenv.Call(t, http.MethodPost, st.URL+"/api/v1/agent/register", st.EnrollToken, map[string]any{"name": name}, nil)
	assert.Equal(t, http.StatusConflict, status, "%s", raw)
	assert.Contains(t, string(raw), "already has an agent credential")
	assert.Contains(t, string(raw), "DELETE /api/v1/nodes/"+name)

	// The enrolled node runs work: a graph executed on it succeeds.
	status, raw = testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(testRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	status, raw = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "e2e"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	status, raw = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+name, map[string]any{"deployment": "d1", "roles": []string{"controller"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	tx := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	done := waitDone(t, st, tx.TaskUUID, 60*time.Second)
	assert.Equal(t, models.TxReady, done.Status, "%+v", done)
}

type txItem struct {
	UUID       string            `json:"uuid"`
	Deployment string            `json:"deployment"`
	Status     string            `json:"status"`
	CreatedAt  time.Time         `json:"created_at"`
	Total      int               `json:"total"`
	Links      map[string]string `json:"links"`
}

// TestConsoleLists: GET /transactions (newest first, filters, pages, links
// to the Temporal UI), GET /releases, the deletes and their refusals, and
// 405 with Allow.
func TestConsoleLists(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{TemporalUI: "http://ui.example:8233"})
	setup(t, st, map[string][]string{"c1": {"controller"}})
	var ids []string
	for range 3 {
		tx := execute(t, st, map[string]any{"deployment": "d1", "dry_run": true, "graphs": []map[string]any{{"type": "deployment"}}})
		waitDone(t, st, tx.TaskUUID, 30*time.Second)
		ids = append(ids, tx.TaskUUID)
	}

	var page struct {
		Items      []txItem `json:"items"`
		NextCursor string   `json:"next_cursor"`
	}
	status, raw := st.Do(t, http.MethodGet, "/api/v1/transactions?deployment=d1&limit=2", nil, &page)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, page.Items, 2)
	assert.Equal(t, []string{ids[2], ids[1]}, []string{page.Items[0].UUID, page.Items[1].UUID}, "newest first")
	assert.Equal(t, "d1", page.Items[0].Deployment)
	assert.Positive(t, page.Items[0].Total)
	assert.Equal(t, "http://ui.example:8233/namespaces/default/workflows/tx-"+ids[2], page.Items[0].Links["temporal_ui"])
	require.NotEmpty(t, page.NextCursor)
	first := page.Items
	status, raw = st.Do(t, http.MethodGet, "/api/v1/transactions?deployment=d1&limit=2&cursor="+url.QueryEscape(page.NextCursor), nil, &page)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Len(t, page.Items, 1)
	assert.Equal(t, ids[0], page.Items[0].UUID)
	assert.Empty(t, page.NextCursor, "the last page")

	var all []txItem
	getList(t, st, "/api/v1/transactions?status=ready", &all)
	assert.Len(t, all, 3)
	getList(t, st, "/api/v1/transactions?status=error", &all)
	assert.Empty(t, all)
	since := first[1].CreatedAt.Format(time.RFC3339Nano)
	getList(t, st, "/api/v1/transactions?since="+url.QueryEscape(since), &all)
	assert.Len(t, all, 2, "since is inclusive")
	getList(t, st, "/api/v1/transactions?until="+url.QueryEscape(since), &all)
	assert.Len(t, all, 1, "until is exclusive")
	requireError(t, st, http.MethodGet, "/api/v1/transactions?status=done", nil, http.StatusBadRequest, "status")
	requireError(t, st, http.MethodGet, "/api/v1/transactions?since=yesterday", nil, http.StatusBadRequest, "since")
	requireError(t, st, http.MethodGet, "/api/v1/transactions?deployment=ghost", nil, http.StatusUnprocessableEntity, "deployment")
	requireError(t, st, http.MethodGet, "/api/v1/transactions?cursor=bogus", nil, http.StatusBadRequest, "cursor")

	var one txItem
	status, _ = st.Do(t, http.MethodGet, "/api/v1/transactions/"+ids[0], nil, &one)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "http://ui.example:8233/namespaces/default/workflows/tx-"+ids[0], one.Links["temporal_ui"])

	// Runs page in plan order.
	var runs []models.TaskRun
	status, raw = getList(t, st, "/api/v1/transactions/"+ids[0]+"/runs?limit=1", &runs)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	assert.Equal(t, one.Total, len(runs), "one run a page, all of them")

	// Releases, newest first.
	var rels []models.Release
	getList(t, st, "/api/v1/releases", &rels)
	require.NotEmpty(t, rels)
	assert.Equal(t, "e2e", rels[0].Name)

	// Deletes: refused while in use, naming what holds it.
	e := requireError(t, st, http.MethodDelete, "/api/v1/releases/e2e", nil, http.StatusConflict, "")
	assert.Contains(t, e.Error.Message, "d1")
	e = requireError(t, st, http.MethodDelete, "/api/v1/deployments/d1", nil, http.StatusConflict, "")
	assert.Contains(t, e.Error.Message, nodeName("c1"))
	requireError(t, st, http.MethodDelete, "/api/v1/deployments/system", nil, http.StatusConflict, "")
	status, raw = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("c1"), map[string]any{"deployment": "system", "roles": []string{}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	status, raw = st.Do(t, http.MethodDelete, "/api/v1/deployments/d1", nil, nil)
	require.Equal(t, http.StatusNoContent, status, "%s", raw)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/transactions/"+ids[0], nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "its finished transactions went with it")
	status, raw = st.Do(t, http.MethodDelete, "/api/v1/releases/e2e", nil, nil)
	require.Equal(t, http.StatusNoContent, status, "%s", raw)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/releases/e2e", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	// A wrong method: 405 with Allow, with or without a token.
	for _, token := range []string{st.AdminToken, ""} {
		req, err := http.NewRequest(http.MethodPut, st.URL+"/api/v1/transactions", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		assert.Equal(t, "GET", resp.Header.Get("Allow"))
	}
	req, err := http.NewRequest(http.MethodPatch, st.URL+"/api/v1/releases/1", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, DELETE", resp.Header.Get("Allow"))
	status, _ = st.Do(t, http.MethodGet, "/api/v1/no-such-thing", nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "an unknown path stays 404")
}
