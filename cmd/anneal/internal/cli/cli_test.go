package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResolveOrder(t *testing.T) {
	file := Config{URL: "http://file", Token: "file-token"}
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	assert.Equal(t, file, resolve(file, getenv, "", ""), "the file alone")
	env[EnvToken] = "env-token"
	assert.Equal(t, Config{URL: "http://file", Token: "env-token"}, resolve(file, getenv, "", ""), "env overrides the file")
	env[EnvURL] = "http://env/"
	assert.Equal(t, Config{URL: "http://env", Token: "flag-token"}, resolve(file, getenv, "", "flag-token"), "a flag overrides env")
	assert.Equal(t, "http://flag", resolve(file, getenv, "http://flag/", "").URL)
}

func TestSaveConfigIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "anneal", "config.json")
	require.NoError(t, SaveConfig(path, Config{URL: "http://a", Token: "t1"}))
	require.NoError(t, SaveConfig(path, Config{URL: "http://b", Token: "t2"}), "replaces an older file")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	got, err := LoadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, Config{URL: "http://b", Token: "t2"}, got)
	missing, err := LoadConfig(filepath.Join(t.TempDir(), "none.json"))
	require.NoError(t, err)
	assert.Equal(t, Config{}, missing)
	require.NoError(t, os.WriteFile(path, []byte("{"), 0o600))
	_, err = LoadConfig(path)
	assert.ErrorContains(t, err, "anneal login")
}

func TestDescribeAPIErrors(t *testing.T) {
	cmd := &cobra.Command{Annotations: fieldFlags("graphs[0].nodes", "--nodes", "deployment", "--deployment")}
	cases := []struct {
		err  *APIError
		want string
	}{
		{&APIError{Status: 422, Message: "graphs[0].nodes[1]: node 7 is not in deployment d1",
			Details: map[string]any{"field": "graphs[0].nodes[1]"}},
			"graphs[0].nodes[1]: node 7 is not in deployment d1 (field graphs[0].nodes[1]; fix --nodes)"},
		{&APIError{Status: 400, Message: "unknown field", Details: map[string]any{"field": "colour"}},
			"colour: unknown field (field colour; fix the value of colour)"},
		{&APIError{Status: 404, Method: "GET", Path: "/api/v1/transactions?limit=20", Message: "Not Found"},
			"this server has no GET /api/v1/transactions endpoint; it is older than this CLI: upgrade the server"},
		{&APIError{Status: 404, Message: "deployment x: not found"}, "deployment x: not found (check the name or id"},
		{&APIError{Status: 401, Message: "unknown or revoked token"}, "run 'anneal login'"},
		{&APIError{Status: 409, Message: "transaction t is ready:\nthere is nothing to stop"}, "transaction t is ready: there is nothing to stop (the current state"},
	}
	for _, tc := range cases {
		got := describe(tc.err, cmd)
		assert.True(t, strings.HasPrefix(got, tc.want) || strings.Contains(got, tc.want), "%q does not contain %q", got, tc.want)
		assert.NotContains(t, got, "\n")
	}
	assert.Equal(t, "plain", describe(errors.New("plain"), nil))
}

func TestExitCodes(t *testing.T) {
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		t.Setenv(EnvURL, "")
		t.Setenv(EnvToken, "")
		code := Main(args, strings.NewReader(""), &out, &errb)
		return code, errb.String()
	}
	code, msg := run("nodes", "--nope")
	assert.Equal(t, ExitUsage, code, msg)
	code, msg = run("no-such-command")
	assert.Equal(t, ExitUsage, code, msg)
	code, msg = run("tx", "watch")
	assert.Equal(t, ExitUsage, code, msg)
	code, msg = run("nodes")
	assert.Equal(t, ExitUsage, code, "no configuration: %s", msg)
	assert.Contains(t, msg, "anneal login")
	code, msg = run("nodes", "--url", "http://127.0.0.1:1", "--token", "x")
	assert.Equal(t, ExitFailure, code, "nothing listens there: %s", msg)
	assert.Contains(t, msg, "cannot reach the API")
	code, _ = run("--help")
	assert.Equal(t, ExitOK, code)
}

// A changed binding's changes read as field.path: old → new, as the
// server's diff gives them.
func TestDescribeChanges(t *testing.T) {
	got := describeChanges([]any{
		map[string]any{"field": "user_data", "path": "port", "old": 5432.0, "new": 6543.0},
		map[string]any{"field": "user_data", "path": "tls", "new": true},
		map[string]any{"field": "parents", "old": []any{"db@n1"}, "new": []any{"db@n2"}},
	})
	assert.Equal(t, `user_data.port: 5432 → 6543; user_data.tls: (none) → true; parents: ["db@n1"] → ["db@n2"]`, got)
}
