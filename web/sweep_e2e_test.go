package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/scenarios"
)

// TestSweepMalformedBodies sends, through the real API, a table of
// malformed bodies to every mutating route of the OpenAPI document that
// takes a body: generated from the route's schema (wrong types, missing or
// null required fields, strings over their maxLength or outside their
// pattern — control characters, traversal, SQL — numbers outside their
// range or 64 bits, lists over their maxItems and over the Postgres
// parameter limit, NUL characters, trailing garbage, null bodies), plus
// broken graphs at every level and verb and broken releases. Every answer
// must be a 4xx in the error envelope; afterwards every table has the rows
// it had and no workflow was started on the stack's task queue.
func TestSweepMalformedBodies(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	ctx := context.Background()
	fx := sweepFixture(t, st)

	status, raw := testenv.Call(t, http.MethodGet, st.URL+"/api/v1/openapi.json", "", nil, nil)
	require.Equal(t, http.StatusOK, status)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))

	rowsBefore := tableRows(t, st)
	workflowsBefore := workflowCount(t, st)

	sent, routes := 0, 0
	check := func(method, path, token, contentType string, body []byte, what string) {
		t.Helper()
		sent++
		status, answer := send(t, method, st.URL+path, token, contentType, body)
		label := fmt.Sprintf("%s %s (%s)", method, path, what)
		if !assert.True(t, status >= 400 && status < 500, "%s: want a 4xx, got %d: %.300s", label, status, answer) {
			return
		}
		var env struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if assert.NoError(t, json.Unmarshal(answer, &env), "%s: the answer is the error envelope: %.300s", label, answer) {
			assert.NotEmpty(t, env.Error.Code, "%s: %.300s", label, answer)
			assert.NotEmpty(t, env.Error.Message, "%s: %.300s", label, answer)
		}
	}

	paths := doc["paths"].(map[string]any)
	for _, p := range sortedKeys(paths) {
		item := paths[p].(map[string]any)
		for _, method := range []string{"post", "put", "patch", "delete"} {
			op, ok := item[method].(map[string]any)
			if !ok {
				continue
			}
			content := requestContent(doc, op)
			if content == nil {
				continue // takes no body: nothing to malform
			}
			routes++
			path, token := fx.fill(p), fx.token(p)
			m := strings.ToUpper(method)
			for _, ct := range sortedKeys(content) {
				if ct != "application/json" {
					for _, b := range documentBodies(ct) {
						check(m, path, token, ct, []byte(b.body), ct+" "+b.name)
					}
					continue
				}
				schema := resolve(doc, content[ct].(map[string]any)["schema"])
				base := fx.base(m, p)
				for _, b := range jsonBodies(doc, schema, base) {
					check(m, path, token, "application/json", b.body, b.name)
				}
			}
			if strings.Contains(p, "/graphs/{type}") {
				for _, b := range brokenGraphs() {
					check(m, path, token, "application/json", b.body, "graph: "+b.name)
				}
			}
		}
	}
	for _, b := range brokenReleases() {
		check(http.MethodPost, "/api/v1/releases", st.AdminToken, "application/json", b.body, "release: "+b.name)
	}
	t.Logf("sent %d malformed requests to %d routes", sent, routes)
	require.Greater(t, routes, 30, "every mutating route with a body is swept")

	assert.Equal(t, rowsBefore, tableRows(t, st), "no table gained or lost a row")
	// Visibility is eventually consistent: give a started workflow time to show.
	time.Sleep(2 * time.Second)
	assert.Equal(t, workflowsBefore, workflowCount(t, st), "no workflow was started")
	var txns int64
	require.NoError(t, st.Store.DB.WithContext(ctx).Model(&fuel.Transaction{}).Count(&txns).Error)
	assert.Zero(t, txns, "no transaction was recorded")
}

// sweepFixture is what the routes' paths point at: a release, a deployment
// with a node (created through the store, so that no workflow runs), a
// plugin, a tag and a software config.
type sweepFixtureT struct {
	st                *testenv.Stack
	node, agentToken  string
	releaseID, tagID  int64
	configID          int64
	plugin, noderole  string
	deployment, scene string
}

func sweepFixture(t *testing.T, st *testenv.Stack) *sweepFixtureT {
	t.Helper()
	ctx := context.Background()
	var rel struct {
		ID int64 `json:"id"`
	}
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(scenarios.SampleRelease), &rel)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "sweep", "release": "sample"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	node, secret, err := st.Store.CreateNode(ctx, models.NodeInput{Name: "sweep-1." + st.Store.Domain, Deployment: "sweep"}, true)
	require.NoError(t, err)
	status, body = st.Do(t, http.MethodPost, "/api/v1/plugins", map[string]string{"name": "sweep-plugin", "version": "1"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	var tag struct {
		ID int64 `json:"id"`
	}
	status, body = st.Do(t, http.MethodPost, "/api/v1/tags", map[string]any{"name": "sweep-tag", "deployment": "sweep"}, &tag)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	var cfg struct {
		ID int64 `json:"id"`
	}
	status, body = st.Do(t, http.MethodPost, "/api/v1/software_configs", map[string]any{"name": "sweep-config", "config": "true"}, &cfg)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	return &sweepFixtureT{st: st, node: node.Name, agentToken: secret, releaseID: rel.ID, tagID: tag.ID, configID: cfg.ID,
		plugin: "sweep-plugin", deployment: "sweep", scene: "deploy-changes", noderole: "1"}
}

// fill puts the fixture's objects into a path template.
func (f *sweepFixtureT) fill(p string) string {
	seg := strings.Split(p, "/")
	for i, s := range seg {
		if !strings.HasPrefix(s, "{") {
			continue
		}
		owner := ""
		if i > 0 {
			owner = seg[i-1]
		}
		switch s {
		case "{type}":
			s = "deployment"
		case "{plugin}":
			s = f.plugin
		case "{role}":
			s = "controller"
		case "{uuid}":
			s = uuid.NewString()
		case "{name}":
			s = f.scene
		default:
			switch owner {
			case "nodes":
				s = f.node
			case "deployments":
				s = f.deployment
			case "releases":
				s = strconv.FormatInt(f.releaseID, 10)
			case "plugins":
				s = f.plugin
			case "tags":
				s = strconv.FormatInt(f.tagID, 10)
			case "software_configs":
				s = strconv.FormatInt(f.configID, 10)
			default:
				s = "1" // snapshots, noderoles, runs, software deployments, deployables
			}
		}
		seg[i] = s
	}
	return strings.Join(seg, "/")
}

// token is the credential a route takes.
func (f *sweepFixtureT) token(p string) string {
	switch {
	case p == "/api/v1/agent/register":
		return f.st.EnrollToken
	case strings.HasPrefix(p, "/api/v1/agent/"):
		return f.agentToken
	}
	return f.st.AdminToken
}

// base is a valid body of a route, into which one malformed field is put,
// so that the malformed field is what is refused (not a missing one).
func (f *sweepFixtureT) base(method, p string) map[string]any {
	switch {
	case p == "/api/v1/deployments" && method == http.MethodPost:
		return map[string]any{"name": "sweep-new", "release": "sample"}
	case p == "/api/v1/nodes" && method == http.MethodPost:
		return map[string]any{"name": "sweep-2." + f.st.Store.Domain, "deployment": "sweep"}
	case p == "/api/v1/graphs/execute":
		return map[string]any{"deployment": "sweep", "graphs": []any{map[string]any{"type": "deployment"}}, "dry_run": true}
	case p == "/api/v1/scenarios" && method == http.MethodPost:
		return map[string]any{"name": "sweep-scenario", "scenario": []any{map[string]any{"graph_type": "deployment"}}}
	case p == "/api/v1/scenarios/{name}/execute":
		return map[string]any{"deployment": "sweep", "dry_run": true}
	case p == "/api/v1/software_configs" && method == http.MethodPost:
		return map[string]any{"name": "sweep-config-2", "config": "true"}
	case p == "/api/v1/software_deployments" && method == http.MethodPost:
		return map[string]any{"config_id": f.configID, "server_id": f.node}
	case p == "/api/v1/tags" && method == http.MethodPost:
		return map[string]any{"name": "sweep-tag-2", "deployment": "sweep"}
	case p == "/api/v1/plugins" && method == http.MethodPost:
		return map[string]any{"name": "sweep-plugin-2", "version": "1"}
	case strings.HasSuffix(p, "/graphs/{type}"):
		return map[string]any{"tasks": []any{map[string]any{"id": "sweep-task", "type": "noop"}}}
	}
	return map[string]any{}
}

type sweepBody struct {
	name string
	body []byte
}

// jsonBodies generates the malformed JSON bodies of a route from its schema:
// whole-body malformations, then, per property, values its schema refuses,
// each merged into the route's valid base.
func jsonBodies(doc map[string]any, schema map[string]any, base map[string]any) []sweepBody {
	raw := func(name, s string) sweepBody { return sweepBody{name, []byte(s)} }
	baseJSON, _ := json.Marshal(base)
	out := []sweepBody{
		raw("null body", "null"),
		raw("array body", "[]"),
		raw("string body", `"x"`),
		raw("number body", "42"),
		raw("empty body", ""),
		raw("truncated", `{"a":`),
		raw("not JSON", "\x00\xff\xfe garbage"),
		raw("trailing garbage", string(baseJSON)+" trailing"),
		raw("two objects", string(baseJSON)+string(baseJSON)),
		raw("unknown field", `{"__unknown__": 1}`),
	}
	with := func(name, key string, v any) {
		m := make(map[string]any, len(base)+1)
		for k, x := range base {
			m[k] = x
		}
		m[key] = v
		b, err := json.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = append(out, sweepBody{name + " " + key, b})
	}
	withRaw := func(name, key, value string) {
		m := make(map[string]json.RawMessage, len(base)+1)
		for k, x := range base {
			b, _ := json.Marshal(x)
			m[k] = b
		}
		m[key] = json.RawMessage(value)
		b, _ := json.Marshal(m)
		out = append(out, sweepBody{name + " " + key, b})
	}
	props, _ := schema["properties"].(map[string]any)
	required := map[string]bool{}
	if req, ok := schema["required"].([]any); ok {
		for _, r := range req {
			required[r.(string)] = true
		}
	}
	for _, key := range sortedKeys(props) {
		prop := resolve(doc, props[key])
		types := schemaTypes(prop)
		if required[key] {
			with("null", key, nil)
		}
		// A value of the wrong type.
		switch {
		case types["string"] && types["integer"]:
			with("wrong type", key, map[string]any{"an": "object"})
		case types["string"]:
			with("wrong type", key, 12345)
		case types["integer"] || types["number"]:
			with("wrong type", key, "not a number")
		case types["boolean"]:
			with("wrong type", key, "yes")
		case types["array"]:
			with("wrong type", key, map[string]any{"an": "object"})
		case types["object"]:
			with("wrong type", key, []any{1, 2})
		}
		if types["string"] {
			// NUL is refused everywhere text is stored.
			with("NUL in", key, "a\x00b")
			if n, ok := number(prop["maxLength"]); ok {
				with("over maxLength", key, strings.Repeat("a", int(n)+1))
			}
			if pat, ok := prop["pattern"].(string); ok {
				re := regexp.MustCompile(pat)
				for _, v := range []string{"../../etc/passwd", "a\x01b\x1b[2J", "has space", "x'; DROP TABLE nodes;--", "/", ""} {
					// An optional field left empty takes its default.
					if !re.MatchString(v) && (v != "" || required[key]) {
						with(fmt.Sprintf("outside pattern (%q)", v), key, v)
					}
				}
			}
			if enum, ok := prop["enum"].([]any); ok && len(enum) > 0 {
				first := enum[0].(string)
				for _, v := range []string{strings.ToLower(first), strings.ToUpper(first), "not-in-the-enum"} {
					if !containsAny(enum, v) {
						with(fmt.Sprintf("outside enum (%q)", v), key, v)
					}
				}
			}
		}
		if types["integer"] && !types["string"] {
			withRaw("2^63", key, "9223372036854775808")
			withRaw("-2^63-1", key, "-9223372036854775809")
			withRaw("1e400", key, "1e400")
			withRaw("fraction", key, "1.5")
			if n, ok := number(prop["maximum"]); ok {
				withRaw("over maximum", key, strconv.FormatInt(int64(n)+1, 10))
			}
			if n, ok := number(prop["minimum"]); ok {
				withRaw("under minimum", key, strconv.FormatInt(int64(n)-1, 10))
			}
		}
		if types["array"] {
			items := resolve(doc, prop["items"])
			it := schemaTypes(items)
			one := any("x")
			switch {
			case it["integer"]:
				one = 1
			case it["object"]:
				one = map[string]any{}
			}
			if n, ok := number(prop["maxItems"]); ok {
				list := make([]any, int(n)+1)
				for i := range list {
					if it["integer"] {
						list[i] = i + 1
					} else {
						list[i] = one
					}
				}
				with("over maxItems", key, list)
			}
			if it["integer"] {
				// More ids than Postgres takes parameters in one statement.
				ids := make([]string, 70000)
				for i := range ids {
					ids[i] = strconv.Itoa(i + 1)
				}
				withRaw("70000 ids in", key, "["+strings.Join(ids, ",")+"]")
			}
			withRaw("null item in", key, "[null]")
			if it["string"] {
				with("NUL item in", key, []any{"a\x00"})
			}
		}
	}
	return out
}

// brokenGraphs are graph bodies every graph write must refuse.
func brokenGraphs() []sweepBody {
	task := func(name string, tasks ...map[string]any) sweepBody {
		b, _ := json.Marshal(map[string]any{"tasks": tasks})
		return sweepBody{name, b}
	}
	return []sweepBody{
		{"null", []byte("null")},
		task("task requiring itself", map[string]any{"id": "a", "type": "noop", "requires": []string{"a"}}),
		task("two-task cycle", map[string]any{"id": "a", "type": "noop", "requires": []string{"b"}},
			map[string]any{"id": "b", "type": "noop", "requires": []string{"a"}}),
		task("blank id", map[string]any{"id": "  ", "type": "noop"}),
		task("64 KiB id", map[string]any{"id": strings.Repeat("x", 64*1024), "type": "noop"}),
		task("unknown type", map[string]any{"id": "a", "type": "teleport"}),
		task("lower-case type", map[string]any{"id": "a", "type": "Shell", "parameters": map[string]any{"cmd": "true"}}),
		task("shell without cmd", map[string]any{"id": "a", "type": "shell"}),
		task("upload_file without path", map[string]any{"id": "a", "type": "upload_file"}),
		task("upload_file escaping", map[string]any{"id": "a", "type": "upload_file", "parameters": map[string]any{"path": "../../etc/passwd"}}),
		task("upload_file absolute", map[string]any{"id": "a", "type": "upload_file", "parameters": map[string]any{"path": "/etc/passwd"}}),
		task("permissions 999", map[string]any{"id": "a", "type": "upload_file", "parameters": map[string]any{"path": "p", "permissions": "999"}}),
		task("timeout 2^63-1", map[string]any{"id": "a", "type": "noop", "parameters": map[string]any{"timeout": int64(1<<63 - 1)}}),
		task("retries 2^63-1", map[string]any{"id": "a", "type": "noop", "parameters": map[string]any{"retries": int64(1<<63 - 1)}}),
		task("negative timeout", map[string]any{"id": "a", "type": "noop", "parameters": map[string]any{"timeout": -1}}),
		task("bad regex", map[string]any{"id": "a", "type": "noop", "tags": []string{"/(/"}}),
		task("master_shell without cmd", map[string]any{"id": "a", "type": "master_shell"}),
		{"timeout 2^63", []byte(`{"tasks": [{"id": "a", "type": "noop", "parameters": {"timeout": 9223372036854775808}}]}`)},
		{"null task", []byte(`{"tasks": [null]}`)},
		{"NUL in cmd", []byte(`{"tasks": [{"id": "a", "type": "shell", "parameters": {"cmd": "echo \u0000"}}]}`)},
	}
}

// brokenReleases are release documents the import must refuse.
func brokenReleases() []sweepBody {
	rel := func(name string, r map[string]any) sweepBody {
		if _, ok := r["name"]; !ok {
			r["name"] = "sweep-release"
		}
		r["version"] = "1"
		b, _ := json.Marshal(r)
		return sweepBody{name, b}
	}
	graph := func(tasks ...map[string]any) map[string]any {
		return map[string]any{"graphs": map[string]any{"deployment": map[string]any{"tasks": tasks}}}
	}
	out := []sweepBody{
		rel("role cycle", map[string]any{"roles_metadata": map[string]any{"a": map[string]any{"requires": []string{"b"}}, "b": map[string]any{"requires": []string{"a"}}}}),
		rel("unknown jig", map[string]any{"roles_metadata": map[string]any{"a": map[string]any{"jig": "teleport"}}}),
		rel("role name with a slash", map[string]any{"roles_metadata": map[string]any{"../a": map[string]any{}}}),
		rel("8000-character name", map[string]any{"name": strings.Repeat("n", 8000)}),
		rel("name with a newline", map[string]any{"name": "a\nb"}),
		rel("traversal name", map[string]any{"name": "../../etc/passwd"}),
		rel("SQL name", map[string]any{"name": "x'; DROP TABLE releases;--"}),
		rel("tag with a space", map[string]any{"tags_metadata": map[string]any{"a b": map[string]any{}}}),
		rel("bad graph type", map[string]any{"graphs": map[string]any{"Deploy Ment": map[string]any{}}}),
		// A release is the base level: what it requires must be in it (a
		// plugin's or deployment's graph may name tasks below it).
		rel("graph: unknown requirement", graph(map[string]any{"id": "a", "type": "noop", "requires": []string{"nowhere"}})),
	}
	for _, g := range brokenGraphs() {
		var in struct {
			Tasks []map[string]any `json:"tasks"`
		}
		if json.Unmarshal(g.body, &in) == nil && len(in.Tasks) > 0 && in.Tasks[0] != nil {
			out = append(out, rel("graph: "+g.name, graph(in.Tasks...)))
		}
	}
	return out
}

// documentBodies are malformed YAML and XML documents.
func documentBodies(contentType string) []struct{ name, body string } {
	out := []struct{ name, body string }{
		{"empty", ""},
		{"null", "null"},
		{"garbage", "\x00\xff{<"},
		{"list", "- a\n- b\n"},
		{"two documents", "name: a\n---\nname: b\n"},
	}
	if strings.Contains(contentType, "xml") {
		out = append(out,
			struct{ name, body string }{"unclosed", "<deployable name='x'>"},
			struct{ name, body string }{"XXE", `<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><deployable name="&x;"/>`},
			struct{ name, body string }{"billion laughs", `<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><deployable name="&c;"/>`},
			struct{ name, body string }{"traversal name", `<deployable name="../../etc/passwd"><assemblies><assembly name="a" type="t"/></assemblies></deployable>`},
		)
	} else {
		out = append(out,
			struct{ name, body string }{"billion laughs", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"},
			struct{ name, body string }{"traversal name", "name: ../../etc/passwd\nversion: '1'\n"},
			struct{ name, body string }{"NUL name", "name: \"a\\0b\"\nversion: '1'\n"},
		)
	}
	return out
}

// requestContent is an operation's request body content by media type, or
// nil when it takes none.
func requestContent(doc map[string]any, op map[string]any) map[string]any {
	rb, ok := op["requestBody"].(map[string]any)
	if !ok {
		return nil
	}
	rb = resolve(doc, rb)
	content, _ := rb["content"].(map[string]any)
	return content
}

// resolve follows a $ref (and takes the first allOf part) of a schema.
func resolve(doc map[string]any, v any) map[string]any {
	m, _ := v.(map[string]any)
	for i := 0; m != nil && i < 10; i++ {
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		var cur any = doc
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		m, _ = cur.(map[string]any)
	}
	if m == nil {
		return map[string]any{}
	}
	return m
}

func schemaTypes(s map[string]any) map[string]bool {
	out := map[string]bool{}
	switch t := s["type"].(type) {
	case string:
		out[t] = true
	case []any:
		for _, x := range t {
			out[x.(string)] = true
		}
	}
	return out
}

func number(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok
}

func containsAny(list []any, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// send makes one request with a raw body.
func send(t *testing.T, method, url, token, contentType string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "%s %s", method, url)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, raw
}

// tableRows counts the rows of every table of the stack's database.
func tableRows(t *testing.T, st *testenv.Stack) map[string]int64 {
	t.Helper()
	var tables []string
	require.NoError(t, st.Store.DB.Raw(`SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name`).Scan(&tables).Error)
	require.NotEmpty(t, tables)
	out := make(map[string]int64, len(tables))
	for _, table := range tables {
		var n int64
		require.NoError(t, st.Store.DB.Raw(fmt.Sprintf(`SELECT count(*) FROM %q`, table)).Scan(&n).Error)
		out[table] = n
	}
	return out
}

// workflowCount counts the workflows ever started on the stack's task queue.
func workflowCount(t *testing.T, st *testenv.Stack) int64 {
	t.Helper()
	resp, err := st.Temporal.CountWorkflow(context.Background(), &workflowservice.CountWorkflowExecutionsRequest{
		Query: fmt.Sprintf("TaskQueue = %q", st.TaskQueue),
	})
	require.NoError(t, err)
	return resp.GetCount()
}
