package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/secrets"
)

// Defaults of the shell executor.
const (
	DefaultTimeout   = 300 * time.Second
	DefaultKillGrace = 3 * time.Second
	// MaxOutputsBytes bounds the outputs file a command may write.
	MaxOutputsBytes = 1 << 20
)

var errTimedOut = errors.New("run timed out")

// ShellExecutor runs "shell" work items with /bin/sh -c in the work
// directory.
//
// The command runs in its own process group. On timeout or cancellation the
// whole group gets SIGTERM; once the group is empty, or after KillGrace,
// whatever is left gets SIGKILL. When the command exits normally, background
// processes it left behind are not killed, but if they still hold its stdout
// or stderr the executor stops reading after KillGrace.
//
// The full output goes to <WorkDir>/logs/<transaction>/<task>.<run_id>.<attempt>.log
// (logs/noderole-<id>/... for a noderole's run):
// a few "# " header lines (run, task, command, start), then every line the
// command wrote, in the order the agent read it, prefixed with "out| " for
// stdout or "err| " for stderr (a last line without a newline gets one; a
// line longer than 64 KiB is split), then a "# " footer with the outcome.
//
// The command sees the agent's environment (minus the tokens, see
// SecretEnv; or BaseEnv when set), then
// the item's Env, then ANNEAL_NODE, ANNEAL_RUN_ID, ANNEAL_ATTEMPT,
// ANNEAL_TASK, ANNEAL_TRANSACTION, ANNEAL_GRAPH, ANNEAL_WORKDIR and
// ANNEAL_OUTPUTS (later ones win). The item's Redact values (its secrets)
// are replaced with "***" in the log file, the tails, the outputs, the
// attributes handed back and the error. ANNEAL_OUTPUTS names an empty file
// (see ReuseScratch); what the command writes there becomes the run's
// outputs: a JSON object of strings if it starts with "{" (after leading
// white space), else key=value lines (key and value trimmed of surrounding
// white space; blank lines and lines starting with # ignored; the last of
// repeated keys wins). A malformed outputs file fails the run.
//
// A run sent attributes (an item with Attrs: a noderole's run, or a graph
// task with its node's merged data) also gets ANNEAL_ATTRS, a file holding
// the attributes it sees as a JSON object, and ANNEAL_ATTRS_OUT, an empty
// file: a JSON object written there is deep-merged onto what was sent, and
// that is what the run hands back (the annealer stores its difference from
// what was sent as the noderole's wall); left empty, the attributes are
// unchanged, and nothing is handed back.
type ShellExecutor struct {
	// WorkDir is where commands run and logs are written. Required.
	WorkDir string
	// NodeName is passed to commands as ANNEAL_NODE.
	NodeName string
	// Shell is the shell binary; default /bin/sh.
	Shell string
	// DefaultTimeout applies to items with no timeout; default 300s.
	DefaultTimeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL; default 3s.
	KillGrace time.Duration
	// Logger receives anomalies (kills, unreadable outputs); default slog.Default().
	Logger *slog.Logger
	// BaseEnv, when not nil, is the environment commands start from
	// instead of the agent's own (the worker runs master_shell tasks with
	// a clean one: no database URL, no tokens).
	BaseEnv []string
	// ReuseScratch says this executor is the only one using WorkDir (an
	// agent's): a run's empty outputs and answer files are then a few
	// files emptied and reused, and runs sent the same attributes without
	// secrets share one ANNEAL_ATTRS file, instead of three files created
	// and removed per run, most of what an agent spent per run besides
	// the command (runScratch).
	ReuseScratch bool

	slots scratchSlots
}

var _ Executor = (*ShellExecutor)(nil)

// devNull is /dev/null opened once, the standard input of every command
// (nil if it cannot be opened: exec then opens it itself).
var devNull = sync.OnceValue(func() *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return nil
	}
	return f
})

// LogsDir is the directory, under the work directory, of the runs' log
// files, one subdirectory per transaction (or noderole).
const LogsDir = "logs"

// LogRetention is how long a run's log file stays on the node: the server
// keeps its own copy (up to its size limit; an older API none), and an
// operator reading logs on the node rarely needs older ones. Pruned at the
// agent's start and daily.
const LogRetention = 30 * 24 * time.Hour

// LogPath returns where the output of item is logged.
func (e *ShellExecutor) LogPath(item protocol.WorkItem) string {
	dir := item.TransactionID
	if item.NodeRoleID != 0 {
		dir = fmt.Sprintf("noderole-%d", item.NodeRoleID)
	}
	return filepath.Join(e.WorkDir, LogsDir, safeName(dir),
		fmt.Sprintf("%s.%d.%d.log", safeName(item.Task), item.RunID, item.Attempt))
}

// Execute runs item and returns its result. It never panics on bad input:
// everything that goes wrong ends up in the result's Error.
func (e *ShellExecutor) Execute(ctx context.Context, item protocol.WorkItem) (res protocol.RunResult) {
	res = protocol.RunResult{Attempt: item.Attempt, ExitCode: -1, StartedAt: time.Now().UTC()}
	defer func() {
		if res.FinishedAt.IsZero() {
			res.FinishedAt = time.Now().UTC()
		}
	}()
	log := e.logger().With(runAttrs(item)...)

	if item.Type != "" && item.Type != "shell" {
		res.Error = fmt.Sprintf("unsupported task type %q on the agent", item.Type)
		return res
	}
	if strings.TrimSpace(item.Command) == "" {
		res.Error = "shell task has no command"
		return res
	}
	timeout := item.Timeout()
	if timeout <= 0 {
		timeout = e.defaultTimeout()
	}

	// Log file.
	logPath := e.LogPath(item)
	f, err := createInDir(filepath.Dir(logPath), 0o755, func() (*os.File, error) {
		return openFile(logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	})
	if err != nil {
		res.Error = fmt.Sprintf("cannot open log file: %v", err)
		return res
	}
	red := secrets.NewRedactor(item.Redact...)
	lf := &logFile{w: bufio.NewWriter(f), red: red}
	defer func() {
		res.FinishedAt = time.Now().UTC()
		lf.comment("finished %s: %s", res.FinishedAt.Format(time.RFC3339Nano), outcome(res))
		if err := errors.Join(lf.flush(), f.Close()); err != nil {
			log.Warn("writing the run's log file failed", "path", logPath, "error", err)
		}
	}()
	// The header's lines in one write: nothing follows the log before
	// the command starts.
	lf.comment("anneal run %d attempt %d: task %q, graph %q, transaction %q, node %q\n# command: %s\n# started %s, timeout %s",
		item.RunID, item.Attempt, item.Task, item.Graph, item.TransactionID, e.NodeName,
		strings.ReplaceAll(item.Command, "\n", "\n#   "), res.StartedAt.Format(time.RFC3339Nano), timeout)

	// Outputs file, the run's first in the scratch directory: the
	// directory is made here when missing, and is there for the others.
	tmpDir := scratchDir(e.WorkDir)
	scratch := e.scratch(tmpDir, item)
	defer scratch.release()
	outputsPath, err := createInDir(tmpDir, 0o700, func() (string, error) {
		return scratch.empty("outputs", "")
	})
	if err != nil {
		res.Error = fmt.Sprintf("cannot create outputs file: %v", err)
		return res
	}
	attrs, err := newAttrsFiles(item, scratch)
	if err != nil {
		res.Error = err.Error()
		return res
	}

	shell := e.Shell
	if shell == "" {
		shell = "/bin/sh"
	}
	cmd := exec.Command(shell, "-c", item.Command)
	cmd.Dir = e.WorkDir
	cmd.Env = append(e.environ(item, outputsPath), attrs.environ()...)
	if null := devNull(); null != nil {
		cmd.Stdin = null // else exec opens it for each run
	}
	// Its own process group, so that a timeout stops everything it started;
	// and killed with the agent (Pdeathsig), so that an agent killed with
	// SIGKILL leaves no command running on that the next agent would then
	// run again: its record says the run was interrupted instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdoutTail, stderrTail := newTail(protocol.MaxTailBytes), newTail(protocol.MaxTailBytes)
	stdoutLog, stderrLog := &streamWriter{lf: lf, prefix: "out| "}, &streamWriter{lf: lf, prefix: "err| "}
	stdout, stderr, err := newOutputPipes()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	cmd.Stdout, cmd.Stderr = stdout.w, stderr.w

	runCtx, cancelRun := context.WithTimeoutCause(ctx, timeout, errTimedOut)
	defer cancelRun()
	if err := cmd.Start(); err != nil {
		stdout.close()
		stderr.close()
		res.Error = fmt.Sprintf("cannot start command: %v", err)
		lf.comment("%s", res.Error)
		return res
	}
	stdout.start(io.MultiWriter(stdoutTail, stdoutLog))
	stderr.start(io.MultiWriter(stderrTail, stderrLog))
	pgid := cmd.Process.Pid

	exited := make(chan struct{})
	killerDone := make(chan struct{})
	stopped := false // written by the killer before killerDone is closed
	go func() {
		defer close(killerDone)
		select {
		case <-exited:
			return
		case <-runCtx.Done():
		}
		stopped = true
		log.Info("stopping the command's process group", "pgid", pgid, "reason", context.Cause(runCtx))
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		e.waitGroupGone(pgid, exited)
		if groupAlive(pgid) {
			log.Warn("process group still alive after SIGTERM, sending SIGKILL", "pgid", pgid)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}()
	waitErr := cmd.Wait()
	close(exited)
	outputHeld := waitOutputs(e.killGrace(), stdout, stderr)
	stdoutLog.close()
	stderrLog.close()

	<-killerDone // when stopping, the group is gone or killed before we report
	if !stopped && groupAlive(pgid) {
		// Processes it started in the background still run, and may write
		// to its outputs or answer file later: once they are read, those
		// are never reused.
		defer scratch.retire()
	}

	var problems []string
	if stopped {
		if errors.Is(context.Cause(runCtx), errTimedOut) {
			problems = append(problems, "timed out after "+seconds(timeout))
		} else if c := context.Cause(ctx); c != nil && c != context.Canceled && c != context.DeadlineExceeded {
			problems = append(problems, "cancelled: "+c.Error())
		} else {
			problems = append(problems, "cancelled")
		}
	}
	if ps := cmd.ProcessState; ps != nil && ps.Exited() {
		res.ExitCode = ps.ExitCode()
	} else if ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() && !stopped {
			problems = append(problems, fmt.Sprintf("killed by signal %s", ws.Signal()))
		}
	}
	if outputHeld {
		log.Warn("the command exited but processes it started kept its output open; stopped reading it", "grace", e.killGrace())
	}
	if waitErr != nil && cmd.ProcessState == nil {
		problems = append(problems, fmt.Sprintf("waiting for command: %v", waitErr))
	}

	outputs, err := readOutputs(outputsPath)
	if err != nil {
		problems = append(problems, err.Error())
	}
	res.Outputs = red.Map(outputs)
	if back, err := attrs.read(item.Attrs); err != nil {
		problems = append(problems, err.Error())
	} else {
		res.Attrs = redactJSON(red, back)
	}
	res.StdoutTail = red.String(stdoutTail.String())
	res.StderrTail = red.String(stderrTail.String())
	res.Error = red.String(strings.Join(problems, "; "))
	return res
}

// waitGroupGone returns once process group pgid is empty (after the shell
// itself has exited) or KillGrace has passed.
func (e *ShellExecutor) waitGroupGone(pgid int, exited <-chan struct{}) {
	grace := time.NewTimer(e.killGrace())
	defer grace.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	shellDone := false
	for {
		select {
		case <-grace.C:
			return
		case <-exited:
			shellDone, exited = true, nil
		case <-tick.C:
		}
		if shellDone && !groupAlive(pgid) {
			return
		}
	}
}

// groupAlive reports whether process group pgid has a member that is not a
// zombie. Zombies count as gone: an orphan is reparented to PID 1, which in
// a container may be slow to reap it, and a zombie needs no more killing.
func groupAlive(pgid int) bool {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: assume alive
	}
	for _, ent := range entries {
		if ent.Name()[0] < '0' || ent.Name()[0] > '9' {
			continue
		}
		data, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		if f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}

func (e *ShellExecutor) environ(item protocol.WorkItem, outputsPath string) []string {
	var env []string
	if e.BaseEnv != nil {
		env = append(make([]string, 0, len(e.BaseEnv)+len(item.Env)+8), e.BaseEnv...)
	} else {
		env = agentEnviron(len(item.Env) + 8)
	}
	for k, v := range item.Env {
		env = append(env, k+"="+v)
	}
	return append(env,
		"ANNEAL_NODE="+e.NodeName,
		"ANNEAL_RUN_ID="+strconv.FormatInt(item.RunID, 10),
		"ANNEAL_ATTEMPT="+strconv.Itoa(item.Attempt),
		"ANNEAL_TASK="+item.Task,
		"ANNEAL_TRANSACTION="+item.TransactionID,
		"ANNEAL_GRAPH="+item.Graph,
		"ANNEAL_WORKDIR="+e.WorkDir,
		"ANNEAL_OUTPUTS="+outputsPath,
	)
}

// SecretEnv names the environment variables of the agent that commands and
// hooks never see: the enrollment token it may have been started with, and
// an operator token left in the environment that started it (.dev/env).
var SecretEnv = []string{"ANNEAL_ENROLL_TOKEN", "ANNEAL_TOKEN"}

// agentEnviron returns the agent's environment without SecretEnv, with
// room for extra more entries: the base environment of every command and
// hook the agent runs.
func agentEnviron(extra int) []string {
	all := os.Environ()
	env := make([]string, 0, len(all)+extra)
	for _, kv := range all {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(SecretEnv, name) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (e *ShellExecutor) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.Default()
}

func (e *ShellExecutor) defaultTimeout() time.Duration {
	if e.DefaultTimeout > 0 {
		return e.DefaultTimeout
	}
	return DefaultTimeout
}

func (e *ShellExecutor) killGrace() time.Duration {
	if e.KillGrace > 0 {
		return e.KillGrace
	}
	return DefaultKillGrace
}

// seconds formats d as "Ns" when it is whole seconds.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

func outcome(res protocol.RunResult) string {
	s := fmt.Sprintf("exit code %d after %s", res.ExitCode, res.FinishedAt.Sub(res.StartedAt).Round(time.Millisecond))
	if res.Error != "" {
		s += ", error: " + res.Error
	}
	return s
}

// readOutputs parses the outputs file (see ShellExecutor).
func readOutputs(path string) (map[string]string, error) {
	if leftEmpty(path) {
		return nil, nil
	}
	f, err := openFile(path, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil // the command removed it: no outputs
		}
		return nil, fmt.Errorf("cannot read outputs file: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxOutputsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read outputs file: %v", err)
	}
	if len(data) > MaxOutputsBytes {
		return nil, fmt.Errorf("outputs file is larger than %d bytes", MaxOutputsBytes)
	}
	return ParseOutputs(data)
}

// leftEmpty says whether the scratch file at path is still an empty
// regular file of its own (no other name links to it), as the run was
// given it: most commands write no outputs and no attributes, and a look
// (lstat) costs a fraction of opening and reading the file.
func leftEmpty(path string) bool {
	info, err := os.Lstat(path)
	return err == nil && info.Mode().IsRegular() && info.Size() == 0 && ownLink(info)
}

// ownLink says whether info is of a file with one name: a run must not be
// handed, nor truncate, a file a command linked to another name.
func ownLink(info os.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 1
}

// ParseOutputs parses what a command wrote to $ANNEAL_OUTPUTS: a JSON object
// of strings when it starts with "{", else key=value lines.
func ParseOutputs(data []byte) (map[string]string, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(trimmed) == 0 {
		return nil, nil
	}
	if !utf8.Valid(trimmed) {
		return nil, errors.New("outputs file is not valid UTF-8")
	}
	if trimmed[0] == '{' {
		var raw map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("outputs file starts with '{' but is not a JSON object: %v", err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, errors.New("outputs file: unexpected data after the JSON object")
		}
		out := make(map[string]string, len(raw))
		for k, v := range raw {
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, fmt.Errorf("outputs file: value of %q must be a JSON string, got %s", k, truncate(string(v), 60))
			}
			out[k] = s
		}
		return out, nil
	}
	out := map[string]string{}
	for i, line := range strings.Split(string(trimmed), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("outputs file line %d: expected key=value, got %q", i+1+lineOffset(data, trimmed), truncate(line, 60))
		}
		out[k] = strings.TrimSpace(v)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// lineOffset counts the newlines trimmed from the start of data.
func lineOffset(data, trimmed []byte) int {
	return bytes.Count(data[:len(data)-len(trimmed)], []byte("\n"))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// safeName makes s usable as one path element.
func safeName(s string) string {
	if s == "" {
		return "_"
	}
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == ':' || c == '@' || c == '+'
		if !ok {
			b[i] = '_'
		}
	}
	s = string(b)
	if strings.Trim(s, ".") == "" {
		return strings.Repeat("_", len(s))
	}
	return s
}

// tail keeps the last max bytes written to it.
type tail struct {
	max     int
	buf     []byte
	dropped bool
}

func newTail(max int) *tail { return &tail{max: max, buf: make([]byte, 0, max)} }

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.dropped = t.dropped || len(p) > t.max || len(t.buf) > 0
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.dropped = true
		copy(t.buf, t.buf[over:])
		t.buf = t.buf[:len(t.buf)-over]
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the tail as valid UTF-8 of at most max bytes, starting at a
// character boundary.
func (t *tail) String() string {
	b := t.buf
	if t.dropped {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	for len(s) > t.max {
		_, size := utf8.DecodeRuneInString(s)
		s = s[size:]
	}
	return s
}

// redactJSON redacts the strings of a JSON document (raw when it is not
// JSON: attrs.read hands back objects only).
func redactJSON(red *secrets.Redactor, raw json.RawMessage) json.RawMessage {
	if red.Empty() || raw == nil {
		return raw
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return red.Bytes(raw)
	}
	out, err := json.Marshal(red.Value(v))
	if err != nil {
		return red.Bytes(raw)
	}
	return out
}

// logFile is the run's log, shared by the stdout and stderr writers. Each
// line is redacted of the run's secrets before it is written.
type logFile struct {
	mu  sync.Mutex
	w   *bufio.Writer
	red *secrets.Redactor
	err error
}

func (l *logFile) write(parts ...[]byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.red.Empty() {
		parts = [][]byte{l.red.Bytes(bytes.Join(parts, nil))}
	}
	for _, p := range parts {
		if _, err := l.w.Write(p); err != nil && l.err == nil {
			l.err = err
		}
	}
	// Flush at every line so that the log can be followed while the run
	// executes; bufio only saves syscalls for the pieces of one line.
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
}

func (l *logFile) comment(format string, args ...any) {
	l.write([]byte("# "+fmt.Sprintf(format, args...)), []byte("\n"))
}

func (l *logFile) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
	return l.err
}

const maxLogLine = 64 << 10

// streamWriter writes one stream into the log file line by line, prefixed.
// Write never fails, so that the command's output keeps being drained.
type streamWriter struct {
	lf      *logFile
	prefix  string
	partial []byte
}

func (s *streamWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.partial = append(s.partial, p...)
			if len(s.partial) >= maxLogLine {
				s.lf.write([]byte(s.prefix), s.partial, []byte("\n"))
				s.partial = s.partial[:0]
			}
			break
		}
		s.lf.write([]byte(s.prefix), s.partial, p[:i+1])
		s.partial = s.partial[:0]
		p = p[i+1:]
	}
	return n, nil
}

func (s *streamWriter) close() {
	if len(s.partial) > 0 {
		s.lf.write([]byte(s.prefix), s.partial, []byte("\n"))
		s.partial = nil
	}
}
