package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

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
			// The files are gone after the run (an executor that does not
			// reuse its scratch files), and the log sits under the noderole.
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

// TestShellAttributesFileShared: on an agent (ReuseScratch), runs sent the
// same attributes read one file, which no run creates again; a run that
// changed it in place (even to the same length, once the agent knows the
// file and no longer reads it) does not change what the next one reads;
// other attributes get their own file.
func TestShellAttributesFileShared(t *testing.T) {
	e := newExecutor(t)
	e.ReuseScratch = true
	sent := json.RawMessage(`{"db":{"port":5432}}`)
	run := func(id int64, attrs json.RawMessage, cmd string) string {
		it := item(`echo "path=$ANNEAL_ATTRS" >> "$ANNEAL_OUTPUTS"; ` + cmd)
		it.RunID, it.Attrs = id, attrs
		res := e.Execute(context.Background(), it)
		require.True(t, res.Succeeded(), "error %q, stderr %q", res.Error, res.StderrTail)
		return res.Outputs["path"]
	}
	first := run(1, sent, `echo '{"spoiled":true}' > "$ANNEAL_ATTRS"`)
	info, err := os.Stat(first)
	require.NoError(t, err)
	again := run(2, sent, `test "$(cat "$ANNEAL_ATTRS")" = '{"db":{"port":5432}}'`)
	assert.Equal(t, first, again, "the same attributes, the same file")
	// A second on, the file's change time is not recent: the third run
	// stamps it (holding), and the fifth does not read it again.
	time.Sleep(1100 * time.Millisecond)
	third := run(3, sent, "true")
	assert.Equal(t, first, third)
	now, err := os.Stat(third)
	require.NoError(t, err)
	assert.False(t, os.SameFile(info, now), "the spoiled file was replaced")
	// Known to hold the attributes since the third run, without being read
	// again; changed in place to the same length, it is read and replaced.
	run(5, sent, `printf '%s' '{"db":{"port":9999}}' > "$ANNEAL_ATTRS"`)
	run(6, sent, `test "$(cat "$ANNEAL_ATTRS")" = '{"db":{"port":5432}}'`)
	other := run(4, json.RawMessage(`{"db":{"port":6432}}`), `grep -q 6432 "$ANNEAL_ATTRS"`)
	assert.NotEqual(t, first, other)
}
