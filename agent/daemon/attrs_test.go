package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShellNodeRoleAttributes(t *testing.T) {
	sent := json.RawMessage(`{"db":{"port":5432},"name":"x"}`)
	cases := []struct {
		name    string
		cmd     string
		want    string // JSON handed back; "" with wantErr
		wantErr string
	}{
		{"left empty: unchanged", `test -s "$ANNEAL_ATTRS"`, "", ""},
		{"reads what it is sent", `grep -q '"port":5432' "$ANNEAL_ATTRS"`, "", ""},
		{"changes merge onto what was sent", `printf '{"db":{"port":6432,"user":"a"}}' > "$ANNEAL_ATTRS_OUT"`,
			`{"db":{"port":6432,"user":"a"},"name":"x"}`, ""},
		{"removed answer file: unchanged", `rm "$ANNEAL_ATTRS_OUT"`, "", ""},
		{"not an object", `echo '[1,2]' > "$ANNEAL_ATTRS_OUT"`, "", "must hold one JSON object"},
		{"not JSON", `echo 'port=1' > "$ANNEAL_ATTRS_OUT"`, "", "must hold one JSON object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newExecutor(t)
			it := item(c.cmd)
			it.NodeRoleID, it.Attrs = 7, sent
			res := e.Execute(context.Background(), it)
			if c.wantErr != "" {
				assert.Contains(t, res.Error, c.wantErr)
				return
			}
			require.True(t, res.Succeeded(), "error %q, stderr %q", res.Error, res.StderrTail)
			if c.want == "" {
				assert.Nil(t, res.Attrs, "unchanged: nothing handed back")
			} else {
				assert.JSONEq(t, c.want, string(res.Attrs))
			}
			// The files are gone after the run, and the log sits under the noderole.
			left, _ := filepath.Glob(filepath.Join(e.WorkDir, "tmp", "attrs-*"))
			assert.Empty(t, left)
			_, err := os.Stat(e.LogPath(it))
			assert.NoError(t, err)
			assert.Contains(t, e.LogPath(it), "noderole-7")
		})
	}
}

func TestShellNoAttributesForTaskRuns(t *testing.T) {
	res := newExecutor(t).Execute(context.Background(), item(`test -z "$ANNEAL_ATTRS" && test -z "$ANNEAL_ATTRS_OUT"`))
	require.True(t, res.Succeeded(), res.Error)
	assert.Nil(t, res.Attrs)
}
