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

// TestValidateTasks: a graph's tasks as written are refused, naming the
// task's field, for a blank or oversized id, an unknown type, a type's
// missing parameters, an escaping path, a non-octal mode, absurd numbers
// and oversized texts; the task types anneal runs pass.
func TestValidateTasks(t *testing.T) {
	huge := string(make([]byte, models.MaxTextLen+1))
	bad := []struct {
		name  string
		task  plan.Task
		field string
	}{
		{"blank id", plan.Task{ID: "  "}, "tasks[0].id"},
		{"oversized id", plan.Task{ID: string(make([]byte, 64*1024))}, "tasks[0].id"},
		{"id with a newline", plan.Task{ID: "a\nb"}, "tasks[0].id"},
		{"id reading as a regex", plan.Task{ID: "/x/"}, "tasks[0].id"},
		{"unknown type", plan.Task{ID: "a", Type: "teleport"}, "tasks[0].type"},
		{"type in the wrong case", plan.Task{ID: "a", Type: "Shell", Parameters: plan.Parameters{Cmd: "true"}}, "tasks[0].type"},
		{"shell without a command", plan.Task{ID: "a", Type: "shell"}, "tasks[0].parameters.cmd"},
		{"master_shell without a command", plan.Task{ID: "a", Type: "master_shell"}, "tasks[0].parameters.cmd"},
		{"upload_file without a path", plan.Task{ID: "a", Type: "upload_file"}, "tasks[0].parameters.path"},
		{"upload_file escaping", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "../../etc/passwd"}}, "tasks[0].parameters.path"},
		{"upload_file absolute", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "/etc/passwd"}}, "tasks[0].parameters.path"},
		{"upload_file bad mode", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "p", Permissions: "999"}}, "tasks[0].parameters.permissions"},
		{"sync escaping", plan.Task{ID: "a", Type: "sync", Parameters: plan.Parameters{Src: "conf", Dst: "a/../../b"}}, "tasks[0].parameters.dst"},
		{"sync without src", plan.Task{ID: "a", Type: "sync", Parameters: plan.Parameters{Dst: "b"}}, "tasks[0].parameters.src"},
		{"timeout 2^63-1", plan.Task{ID: "a", Parameters: plan.Parameters{Timeout: 1<<63 - 1}}, "tasks[0].parameters.timeout"},
		{"negative timeout", plan.Task{ID: "a", Parameters: plan.Parameters{Timeout: -1}}, "tasks[0].parameters.timeout"},
		{"retries 2^63-1", plan.Task{ID: "a", Parameters: plan.Parameters{Retries: 1<<63 - 1}}, "tasks[0].parameters.retries"},
		{"huge command", plan.Task{ID: "a", Parameters: plan.Parameters{Cmd: huge}}, "tasks[0].parameters.cmd"},
		{"NUL in data", plan.Task{ID: "a", Type: "upload_file", Parameters: plan.Parameters{Path: "p", Data: "\x00"}}, "tasks[0].parameters.data"},
		{"control character in a tag", plan.Task{ID: "a", Tags: []string{"x\x01"}}, "tasks[0].tags[0]"},
		{"too many requires", plan.Task{ID: "a", Requires: make([]string, models.MaxListLen+1)}, "tasks[0].requires"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateTasks("tasks", []plan.Task{tc.task})
			var ie *models.InputError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, tc.field, ie.Field, ie.Error())
		})
	}
	good := []plan.Task{
		{ID: "placeholder"},
		{ID: "s", Type: "stage"},
		{ID: "g", Type: "group", Requires: []string{"s"}},
		{ID: "sh", Type: "shell", Tags: []string{"/.*/", "mysql:1", "*"}, Parameters: plan.Parameters{Cmd: "true", Timeout: 60, Retries: 3}},
		{ID: "up", Type: "upload_file", Parameters: plan.Parameters{Path: "conf/app.conf", Data: "x", Permissions: "0600"}},
		{ID: "sy", Type: "sync", Parameters: plan.Parameters{Src: "conf", Dst: "backup/conf"}},
		{ID: "ms", Type: "master_shell", Parameters: plan.Parameters{Cmd: "hostname"}},
		{ID: "n", Type: "noop"}, {ID: "sk", Type: "skipped"}, {ID: "e", Type: "erase_node"},
		{ID: "m", Type: "move_to_bootstrap"}, {ID: "r", Type: "reboot", Parameters: plan.Parameters{Timeout: 600}},
	}
	assert.NoError(t, ValidateTasks("tasks", good))
	assert.Error(t, ValidateTasks("tasks", make([]plan.Task, maxGraphTasks+1)), "the task count is bounded")
}
