package fuel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

func TestRunSpec(t *testing.T) {
	cases := []struct {
		name    string
		task    plan.Task
		jig     string
		cmd     string
		wantErr string
	}{
		{"shell", plan.Task{ID: "a", Parameters: plan.Parameters{Cmd: "true"}}, JigAgent, "true", ""},
		{"shell without a command", plan.Task{ID: "a"}, JigNone, "", ""},
		{"noop", plan.Task{ID: "a", Type: "noop"}, JigNone, "", ""},
		{"upload_file", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "it's/x", Data: "hi"}}, JigAgent,
			`mkdir -p "$(dirname 'it'\''s/x')" && printf '%s' 'aGk=' | base64 -d > 'it'\''s/x' && chmod 0644 'it'\''s/x'`, ""},
		{"upload_file without path", plan.Task{ID: "a", Type: "upload_file"}, "", "", "needs parameters.path"},
		{"upload_file bad mode", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "p", Permissions: "rw"}}, "", "", "octal"},
		{"sync", plan.Task{ID: "a", Type: "sync", Parameters: plan.Parameters{Src: "s", Dst: "d"}}, JigAgent, "mkdir -p 'd' && cp -a 's'/. 'd'/", ""},
		{"sync without dst", plan.Task{ID: "a", Type: "sync", Parameters: plan.Parameters{Src: "s"}}, "", "", "needs parameters.src and parameters.dst"},
		{"master_shell", plan.Task{ID: "a", Type: "master_shell", Parameters: plan.Parameters{Cmd: "hostname"}}, JigOrchestrator, "hostname", ""},
		{"move_to_bootstrap", plan.Task{ID: "a", Type: "move_to_bootstrap"}, JigOrchestrator, "", ""},
		{"reboot", plan.Task{ID: "a", Type: "reboot"}, JigAgent, "", ""},
		{"unknown", plan.Task{ID: "a", Type: "puppet"}, "", "", `unknown task type "puppet"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := runSpec(&tc.task)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.jig, spec.Jig)
			assert.Equal(t, tc.cmd, spec.Cmd)
			assert.Equal(t, models.DefaultTaskTimeoutSec, spec.TimeoutSec)
		})
	}
}
