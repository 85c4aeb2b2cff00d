package web_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/web"
)

// httpMethods are the operation keys of an OpenAPI path item.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// TestOpenAPIServed fetches the document from a whole stack, without a
// token, as a client would.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodGet, st.URL+"/api/v1/openapi.json", "", nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(body, &doc), "the document must be JSON")
	version, _ := doc["openapi"].(string)
	assert.True(t, strings.HasPrefix(version, "3.1"), "openapi is %q, want 3.1.x", version)
	assert.NotEmpty(t, doc["paths"])
}

// openAPIServer is an API server built without a database or Temporal:
// enough to list its routes and serve the document, which needs neither.
func openAPIServer(t *testing.T) (*web.Server, map[string]any) {
	t.Helper()
	srv := web.New(web.Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	resp, err := http.Get(ts.URL + "/api/v1/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	var doc map[string]any
	require.NoError(t, json.Unmarshal(body, &doc))
	return srv, doc
}

var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// TestOpenAPIMatchesRoutes keeps the document in step with the server: the
// set of (method, path) it documents must be the set of routes web.New
// registers, Echo's ":id" written "{id}". A route added without
// documentation, or documentation left for a removed route, fails here by
// name.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	srv, doc := openAPIServer(t)

	registered := map[string]bool{}
	for _, r := range srv.Routes() {
		method, path, ok := strings.Cut(r, " ")
		require.True(t, ok, "route %q", r)
		registered[method+" "+echoParam.ReplaceAllString(path, "{$1}")] = true
	}
	require.NotEmpty(t, registered)

	documented := map[string]bool{}
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		ops, _ := item.(map[string]any)
		for _, m := range httpMethods {
			if _, ok := ops[m]; ok {
				documented[strings.ToUpper(m)+" "+path] = true
			}
		}
	}

	var undocumented, stale []string
	for r := range registered {
		if !documented[r] {
			undocumented = append(undocumented, r)
		}
	}
	for r := range documented {
		if !registered[r] {
			stale = append(stale, r)
		}
	}
	sort.Strings(undocumented)
	sort.Strings(stale)
	assert.Empty(t, undocumented, "routes the server registers that web/openapi.yaml does not document:\n  %s", strings.Join(undocumented, "\n  "))
	assert.Empty(t, stale, "operations web/openapi.yaml documents that the server does not register:\n  %s", strings.Join(stale, "\n  "))
}

// TestOpenAPIStructure checks what a validator would catch cheaply (no
// maintained Go validator of OpenAPI 3.1 is a dependency of the module):
// references resolve, operations are complete, path parameters match their
// templates, errors use the shared envelope and security names defined
// schemes.
func TestOpenAPIStructure(t *testing.T) {
	t.Parallel()
	_, doc := openAPIServer(t)

	version, _ := doc["openapi"].(string)
	assert.True(t, strings.HasPrefix(version, "3.1."), "openapi is %q, want 3.1.x", version)
	info, _ := doc["info"].(map[string]any)
	assert.NotEmpty(t, info["title"], "info.title")
	assert.NotEmpty(t, info["version"], "info.version")

	// No key holds a space: in a YAML flow mapping an unquoted comma in a
	// description silently starts a new key ("{description: a, b}").
	walkKeys(doc, "", func(at, key string) {
		assert.NotContains(t, key, " ", "key %q at %s: quote the value before it", key, at)
	})

	// Every $ref points at something in the document.
	walkRefs(doc, func(ref string) {
		_, ok := resolvePointer(doc, ref)
		assert.True(t, ok, "$ref %q does not resolve", ref)
	})

	schemes := object(object(doc["components"])["securitySchemes"])
	checkSecurity := func(where string, v any) {
		reqs, ok := v.([]any)
		require.True(t, ok, "%s: security must be a list", where)
		for _, r := range reqs {
			for name := range object(r) {
				assert.Contains(t, schemes, name, "%s: security scheme %q is not defined", where, name)
			}
		}
	}
	require.Contains(t, doc, "security", "a default security requirement (admin) is expected")
	checkSecurity("top level", doc["security"])
	errorSchema := "#/components/schemas/Error"

	operationIDs := map[string]string{}
	templateParam := regexp.MustCompile(`\{([^}]+)\}`)
	for path, rawItem := range object(doc["paths"]) {
		item := object(rawItem)
		assert.True(t, strings.HasPrefix(path, "/"), "path %q", path)
		want := map[string]bool{}
		for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
			want[m[1]] = true
		}
		for _, method := range httpMethods {
			rawOp, ok := item[method]
			if !ok {
				continue
			}
			op := object(rawOp)
			where := strings.ToUpper(method) + " " + path

			id, _ := op["operationId"].(string)
			if assert.NotEmpty(t, id, "%s: operationId", where) {
				if prev, dup := operationIDs[id]; dup {
					t.Errorf("%s: operationId %q is also %s's", where, id, prev)
				}
				operationIDs[id] = where
			}
			summary, _ := op["summary"].(string)
			assert.NotEmpty(t, summary, "%s: summary", where)
			assert.NotContains(t, summary, "\n", "%s: the summary is one line", where)
			if sec, ok := op["security"]; ok {
				checkSecurity(where, sec)
			}

			// Path parameters: exactly the template's, required.
			got := map[string]bool{}
			params := append(append([]any{}, list(item["parameters"])...), list(op["parameters"])...)
			for _, p := range params {
				param := object(deref(t, doc, p))
				if param["in"] != "path" {
					continue
				}
				name, _ := param["name"].(string)
				got[name] = true
				assert.Equal(t, true, param["required"], "%s: path parameter %q must be required", where, name)
				assert.True(t, want[name], "%s: path parameter %q is not in the path", where, name)
			}
			for name := range want {
				assert.True(t, got[name], "%s: path parameter %q is not declared", where, name)
			}

			// Responses: some, one of them an answer the handler gives
			// on success (or the 405 of an immutable resource), and
			// every error in the shared envelope.
			responses := object(op["responses"])
			if !assert.NotEmpty(t, responses, "%s: responses", where) {
				continue
			}
			success := false
			for code, rawResp := range responses {
				resp := object(deref(t, doc, rawResp))
				assert.NotEmpty(t, resp["description"], "%s %s: description", where, code)
				n, err := strconv.Atoi(code)
				if code != "default" {
					require.NoError(t, err, "%s: response code %q", where, code)
				}
				if code != "default" && n < 400 {
					success = true
					continue
				}
				if code == "405" {
					success = true
				}
				schema := object(object(object(resp["content"])["application/json"])["schema"])
				assert.Equal(t, errorSchema, schema["$ref"], "%s %s: errors use the shared error envelope", where, code)
			}
			assert.True(t, success, "%s: no success response", where)
		}
	}
}

// object returns v as a JSON object, or nil.
func object(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// list returns v as a JSON array, or nil.
func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// deref follows a {"$ref": ...} object to what it names.
func deref(t *testing.T, doc map[string]any, v any) any {
	t.Helper()
	for range 10 {
		ref, ok := object(v)["$ref"].(string)
		if !ok {
			return v
		}
		target, found := resolvePointer(doc, ref)
		if !found {
			t.Errorf("$ref %q does not resolve", ref)
			return nil
		}
		v = target
	}
	t.Errorf("$ref chain too long")
	return nil
}

// walkRefs calls fn with every $ref string in v.
func walkRefs(v any, fn func(string)) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if s, ok := e.(string); ok && k == "$ref" {
				fn(s)
				continue
			}
			walkRefs(e, fn)
		}
	case []any:
		for _, e := range t {
			walkRefs(e, fn)
		}
	}
}

// walkKeys calls fn with every object key in v and where it is.
func walkKeys(v any, at string, fn func(at, key string)) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			fn(at, k)
			walkKeys(e, at+"/"+k, fn)
		}
	case []any:
		for i, e := range t {
			walkKeys(e, at+"/"+strconv.Itoa(i), fn)
		}
	}
}

// resolvePointer resolves a local reference "#/a/b" (RFC 6901 escapes).
func resolvePointer(doc map[string]any, ref string) (any, bool) {
	pointer, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, false
	}
	var cur any = doc
	for _, part := range strings.Split(pointer, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}
