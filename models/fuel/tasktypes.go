package fuel

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// Jigs: how a run reaches its node.
const (
	// JigAgent hands the run to the node's agent (pull).
	JigAgent = "agent"
	// JigOrchestrator runs it in the worker, with the node's context.
	JigOrchestrator = "orchestrator"
	// JigNone has nothing to execute.
	JigNone = "none"
)

// Task types beyond shell (Fuel's special tasks).
const (
	TaskNoop            = "noop"
	TaskSkipped         = "skipped"
	TaskUploadFile      = "upload_file"
	TaskSync            = "sync"
	TaskEraseNode       = "erase_node"
	TaskMasterShell     = "master_shell"
	TaskMoveToBootstrap = "move_to_bootstrap"
	TaskReboot          = "reboot"
)

var octalMode = regexp.MustCompile(`^0?[0-7]{3}$`)

// runSpec turns a task into what its jig executes. Tasks the agent runs
// become a shell command here, so the agent needs to know only shell:
// upload_file writes its data, sync copies a directory, erase_node wipes
// the node's state (its credential and logs stay, so it can come back).
func runSpec(t *plan.Task) (models.RunSpec, error) {
	p := t.Parameters
	spec := models.RunSpec{Jig: JigAgent, Cmd: p.Cmd, TimeoutSec: p.Timeout, Retries: p.Retries}
	if spec.TimeoutSec <= 0 {
		spec.TimeoutSec = models.DefaultTaskTimeoutSec
	}
	switch t.Kind() {
	case plan.TypeShell:
		if p.Cmd == "" {
			spec.Jig = JigNone
		}
	case TaskNoop, TaskSkipped:
		spec.Jig = JigNone
	case TaskUploadFile:
		if p.Path == "" {
			return spec, fmt.Errorf("task %q: upload_file needs parameters.path", t.ID)
		}
		mode := p.Permissions
		if mode == "" {
			mode = "0644"
		}
		if !octalMode.MatchString(mode) {
			return spec, fmt.Errorf("task %q: parameters.permissions %q is not an octal mode like 0644", t.ID, mode)
		}
		spec.Cmd = fmt.Sprintf("mkdir -p \"$(dirname %[1]s)\" && printf '%%s' '%[2]s' | base64 -d > %[1]s && chmod %[3]s %[1]s",
			shellQuote(p.Path), base64.StdEncoding.EncodeToString([]byte(p.Data)), mode)
	case TaskSync:
		if p.Src == "" || p.Dst == "" {
			return spec, fmt.Errorf("task %q: sync needs parameters.src and parameters.dst", t.ID)
		}
		spec.Cmd = fmt.Sprintf("mkdir -p %[2]s && cp -a %[1]s/. %[2]s/", shellQuote(p.Src), shellQuote(p.Dst))
	case TaskEraseNode:
		spec.Cmd = `find "$ANNEAL_WORKDIR" -mindepth 1 -maxdepth 1 ! -name credential.json ! -name logs -exec rm -rf {} + && echo "node state erased"`
	case TaskMasterShell:
		if p.Cmd == "" {
			return spec, fmt.Errorf("task %q: master_shell needs parameters.cmd", t.ID)
		}
		spec.Jig = JigOrchestrator
	case TaskMoveToBootstrap:
		spec.Jig = JigOrchestrator
	case TaskReboot:
		// The agent reboots; Timeout bounds how long the orchestrator waits
		// for the node to come back with a new boot id.
	default:
		return spec, fmt.Errorf("task %q: unknown task type %q", t.ID, t.Type)
	}
	return spec, nil
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
