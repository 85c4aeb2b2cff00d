package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
)

func TestScriptHookInputsAndOutputs(t *testing.T) {
	h := &Hooks{WorkDir: t.TempDir(), NodeName: "n1"}
	d := protocol.SoftwareDeployment{
		ID: 4, Round: 2, Action: "DEPLOY", Group: "script", TimeoutSec: 10,
		Config:      `echo "in $who $(cat $ANNEAL_INPUTS_DIR/n)"; echo "$who-$n" > $heat_outputs_path.result; echo warn >&2`,
		InputValues: map[string]any{"who": "me", "n": 3.0},
		Outputs:     []protocol.SoftwareIO{{Name: "result"}, {Name: "missing"}},
	}
	sig := h.Run(context.Background(), d)
	assert.Equal(t, 0, sig.StatusCode, sig.StatusReason)
	assert.Equal(t, 2, sig.Round)
	assert.Equal(t, map[string]any{"result": "me-3"}, sig.Outputs)
	assert.Equal(t, "in me 3\n", sig.Stdout)
	assert.Equal(t, "warn\n", sig.Stderr)
	assert.FileExists(t, filepath.Join(h.WorkDir, "software", "4", "round-2", "inputs", "who"))

	d.Config = "exit 4"
	sig = h.Run(context.Background(), d)
	assert.Equal(t, 4, sig.StatusCode)
	assert.Empty(t, sig.Outputs, "outputs of an earlier run of the round are removed")

	d.Config, d.TimeoutSec = "sleep 5", 1
	start := time.Now()
	sig = h.Run(context.Background(), d)
	assert.Equal(t, HookTimedOut, sig.StatusCode)
	assert.Less(t, time.Since(start), 4*time.Second)
}

func TestHooksDirAndUnknownGroup(t *testing.T) {
	h := &Hooks{WorkDir: t.TempDir()}
	d := protocol.SoftwareDeployment{ID: 1, Round: 1, Group: "salt", Config: "state", InputValues: map[string]any{"x": "1"}}
	sig := h.Run(context.Background(), d)
	assert.Equal(t, HookUnknownGroup, sig.StatusCode)
	assert.Contains(t, sig.StatusReason, `"salt"`)

	require.NoError(t, os.MkdirAll(filepath.Join(h.WorkDir, "hooks"), 0o755))
	hook := `#!/bin/sh
input=$(cat)
case "$input" in *'"config":"state"'*) ;; *) echo "bad stdin: $input" >&2; exit 9;; esac
echo '{"applied": "yes", "deploy_stdout": "ran salt", "deploy_status_code": 0}'
`
	require.NoError(t, os.WriteFile(filepath.Join(h.WorkDir, "hooks", "salt"), []byte(hook), 0o755))
	sig = h.Run(context.Background(), d)
	assert.Equal(t, 0, sig.StatusCode, sig.Stderr)
	assert.Equal(t, map[string]any{"applied": "yes"}, sig.Outputs)
	assert.Equal(t, "ran salt", sig.Stdout)

	d.Group = "../etc"
	sig = h.Run(context.Background(), d)
	assert.Equal(t, HookUnknownGroup, sig.StatusCode)
}
