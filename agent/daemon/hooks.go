package daemon

// Software deployment hooks (Heat software config). A deployment's config
// is run by the hook its group names:
//
// Built-in group "script" (Heat's heat-config-script): the config is a
// script, written to <dir>/script and run with /bin/sh (or directly when it
// starts with "#!"), in <dir> = <WorkDir>/software/<deployment id>/round-<n>.
// Each input is passed both as an environment variable named after it and
// as the file <dir>/inputs/<name> (strings as they are, other JSON values
// JSON-encoded); deploy_server_id, deploy_action and deploy_round are
// passed the same way. heat_outputs_path is set to <dir>/outputs; the
// script writes each output <name> of the config's outputs schema to the
// file "$heat_outputs_path.<name>", read back verbatim except for one
// trailing newline. Its stdout, stderr and exit code become deploy_stdout,
// deploy_stderr (the last 4 KiB) and deploy_status_code.
//
// Any other group G: the executable <HooksDir>/G (default <WorkDir>/hooks)
// gets the deployment as JSON on stdin (protocol.SoftwareDeployment: id,
// round, action, server, name, group, config, inputs with their values,
// outputs, options, input_values), runs in <dir> with the same environment
// variables, and writes on stdout one JSON object in the shape of a signal:
// {"<output>": value, ..., "deploy_stdout": "...", "deploy_stderr": "...",
// "deploy_status_code": 0}. Missing deploy_* keys are filled from the
// hook's own stdout (when it is not the JSON), stderr and exit code. An
// unknown group (no such executable) fails the deployment with
// deploy_status_code 127 and a reason naming the group.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/secrets"
)

// ScriptGroup is the built-in hook's group.
const ScriptGroup = "script"

// Status codes the agent reports when a hook could not do its job.
const (
	HookUnknownGroup = 127
	HookTimedOut     = 124
	HookBroken       = 126
)

// Hooks runs software deployments with the hook their group names.
type Hooks struct {
	// WorkDir holds software/<id>/round-<n> per deployment round.
	WorkDir string
	// HooksDir holds one executable per group; default <WorkDir>/hooks.
	HooksDir string
	// NodeName is passed as ANNEAL_NODE.
	NodeName string
	// DefaultTimeout applies to deployments with no timeout; default 600s.
	DefaultTimeout time.Duration
	Logger         *slog.Logger
}

// Dir is where a deployment round runs.
func (h *Hooks) Dir(d protocol.SoftwareDeployment) string {
	return filepath.Join(h.WorkDir, "software", strconv.FormatInt(d.ID, 10), "round-"+strconv.Itoa(d.Round))
}

func (h *Hooks) hooksDir() string {
	if h.HooksDir != "" {
		return h.HooksDir
	}
	return filepath.Join(h.WorkDir, "hooks")
}

// Run runs one deployment round and returns the signal to send. Whatever
// goes wrong is described in the signal (deploy_status_code != 0 and
// deploy_status_reason). The secret values the deployment was sent
// (d.Redact) are replaced with "***" in the signal, and the round's input
// files are removed afterwards when there were any.
func (h *Hooks) Run(ctx context.Context, d protocol.SoftwareDeployment) protocol.SoftwareSignal {
	if len(d.Redact) == 0 {
		return h.run(ctx, d)
	}
	defer os.RemoveAll(filepath.Join(h.Dir(d), "inputs"))
	red := secrets.NewRedactor(d.Redact...)
	sig := h.run(ctx, d)
	sig.Outputs, _ = red.Value(sig.Outputs).(map[string]any)
	sig.Stdout, sig.Stderr, sig.StatusReason = red.String(sig.Stdout), red.String(sig.Stderr), red.String(sig.StatusReason)
	return sig
}

func (h *Hooks) run(ctx context.Context, d protocol.SoftwareDeployment) protocol.SoftwareSignal {
	sig := protocol.SoftwareSignal{Round: d.Round, Outputs: map[string]any{}}
	fail := func(code int, format string, args ...any) protocol.SoftwareSignal {
		sig.StatusCode, sig.StatusReason = code, fmt.Sprintf(format, args...)
		if sig.Stderr == "" {
			sig.Stderr = sig.StatusReason
		}
		return sig
	}
	var hookPath string
	if d.Group != ScriptGroup {
		if !validGroup(d.Group) {
			return fail(HookUnknownGroup, "unknown group %q: not a valid hook name", d.Group)
		}
		hookPath = filepath.Join(h.hooksDir(), d.Group)
		st, err := os.Stat(hookPath)
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return fail(HookUnknownGroup, "unknown group %q: no hook for it (the built-in group is %q; no executable %s)", d.Group, ScriptGroup, hookPath)
		}
	}
	dir := h.Dir(d)
	if err := os.MkdirAll(filepath.Join(dir, "inputs"), 0o700); err != nil {
		return fail(HookBroken, "cannot create the deployment directory: %v", err)
	}
	outputsPath := filepath.Join(dir, "outputs")
	old, _ := filepath.Glob(outputsPath + ".*")
	for _, f := range old {
		_ = os.Remove(f)
	}
	env := h.environ(d, dir, outputsPath)
	for name, v := range d.InputValues {
		if !validGroup(name) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "inputs", name), []byte(inputText(v)), 0o600); err != nil {
			return fail(HookBroken, "cannot write input %s: %v", name, err)
		}
	}
	timeout := d.Timeout()
	if timeout <= 0 {
		timeout = h.DefaultTimeout
	}
	if timeout <= 0 {
		timeout = 600 * time.Second
	}
	var cmd *exec.Cmd
	var stdin io.Reader
	if hookPath == "" {
		script := filepath.Join(dir, "script")
		if err := os.WriteFile(script, []byte(d.Config), 0o700); err != nil {
			return fail(HookBroken, "cannot write the script: %v", err)
		}
		if strings.HasPrefix(d.Config, "#!") {
			cmd = exec.Command(script)
		} else {
			cmd = exec.Command("/bin/sh", script)
		}
	} else {
		b, err := json.Marshal(d)
		if err != nil {
			return fail(HookBroken, "cannot encode the deployment: %v", err)
		}
		cmd, stdin = exec.Command(hookPath), bytes.NewReader(b)
	}
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env, stdin
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 3 * time.Second
	stdoutTail, stderrTail := newTail(protocol.MaxTailBytes), newTail(protocol.MaxTailBytes)
	var stdoutAll limitedBuffer
	stdoutAll.max = MaxOutputsBytes
	cmd.Stdout = io.MultiWriter(stdoutTail, &stdoutAll)
	cmd.Stderr = stderrTail
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := cmd.Start(); err != nil {
		return fail(HookBroken, "cannot start the %s hook: %v", d.Group, err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-runCtx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	waitErr := cmd.Wait()
	close(done)
	sig.Stdout, sig.Stderr = stdoutTail.String(), stderrTail.String()
	exit := -1
	if ps := cmd.ProcessState; ps != nil && ps.Exited() {
		exit = ps.ExitCode()
	}
	switch {
	case errors.Is(runCtx.Err(), context.DeadlineExceeded):
		return fail(HookTimedOut, "the %s hook timed out after %s", d.Group, seconds(timeout))
	case ctx.Err() != nil:
		return fail(HookBroken, "cancelled: the agent is stopping")
	case exit < 0:
		return fail(HookBroken, "the %s hook did not exit normally: %v", d.Group, waitErr)
	}
	sig.StatusCode = exit
	if hookPath == "" {
		for _, o := range d.Outputs {
			v, ok, err := readOutputFile(outputsPath + "." + o.Name)
			if err != nil {
				return fail(HookBroken, "output %s: %v", o.Name, err)
			}
			if ok {
				sig.Outputs[o.Name] = v
			}
		}
		return sig
	}
	// A hooks-directory executable answers with a signal on stdout.
	out := bytes.TrimSpace(stdoutAll.Bytes())
	if len(out) == 0 {
		return sig
	}
	var hs protocol.SoftwareSignal
	if err := json.Unmarshal(out, &hs); err != nil {
		if exit != 0 {
			return sig
		}
		return fail(HookBroken, "the %s hook %s did not write a JSON object on stdout: %v", d.Group, hookPath, err)
	}
	hs.Round = d.Round
	if hs.Outputs == nil {
		hs.Outputs = map[string]any{}
	}
	if hs.Stderr == "" {
		hs.Stderr = sig.Stderr
	}
	if hs.StatusCode == 0 {
		hs.StatusCode = exit
	}
	return hs
}

func (h *Hooks) environ(d protocol.SoftwareDeployment, dir, outputsPath string) []string {
	env := agentEnviron(len(d.InputValues) + 8)
	for name, v := range d.InputValues {
		if validGroup(name) && !strings.ContainsAny(name, ".:+-") {
			env = append(env, name+"="+inputText(v))
		}
	}
	return append(env,
		"heat_outputs_path="+outputsPath,
		"ANNEAL_NODE="+h.NodeName,
		"ANNEAL_SOFTWARE_DEPLOYMENT="+strconv.FormatInt(d.ID, 10),
		"ANNEAL_SOFTWARE_DIR="+dir,
		"ANNEAL_INPUTS_DIR="+filepath.Join(dir, "inputs"),
	)
}

// inputText is an input value as a string: strings as they are, other JSON
// values encoded.
func inputText(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func validGroup(g string) bool {
	if g == "" || g == "." || g == ".." || len(g) > 100 {
		return false
	}
	for _, c := range g {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_.:+-", c)
		if !ok {
			return false
		}
	}
	return true
}

func readOutputFile(path string) (string, bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxOutputsBytes+1))
	if err != nil {
		return "", false, err
	}
	if len(b) > MaxOutputsBytes {
		return "", false, fmt.Errorf("larger than %d bytes", MaxOutputsBytes)
	}
	s := strings.TrimSuffix(string(b), "\n")
	return strings.ToValidUTF8(s, "\uFFFD"), true, nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.Len(); room > 0 {
		if len(p) > room {
			l.Buffer.Write(p[:room])
		} else {
			l.Buffer.Write(p)
		}
	}
	return len(p), nil
}
