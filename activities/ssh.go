package activities

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/temporal"
	"golang.org/x/crypto/ssh"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/attrs"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// SSHRuns is what the ssh jig needs: starting a run in the worker and
// recording its result like an agent's (as the orchestrator jig), the
// node's SSH settings with its key, pinning a host key on first use, and
// the outputs of the run's transaction so far.
type SSHRuns interface {
	StartLocalRun(ctx context.Context, runID int64) (*models.TaskRun, *models.Node, error)
	RecordRunResult(ctx context.Context, nodeID, runID int64, res protocol.RunResult) (*models.RecordedResult, error)
	NodeSSH(ctx context.Context, nodeID int64) (*models.NodeSSH, error)
	PinSSHHostKey(ctx context.Context, nodeID int64, line string) (string, error)
	RunContext(ctx context.Context, run *models.TaskRun) (*models.RunContext, error)
}

// Defaults of the ssh jig.
const (
	DefaultSSHKeepalive   = 10 * time.Second
	DefaultSSHDialTimeout = 20 * time.Second
	// sshKeepaliveMisses is how many keepalive intervals may pass without
	// an answer before the connection counts as dead.
	sshKeepaliveMisses = 3
)

// RunOverSSH runs a task (or a noderole's script) on its node over SSH
// (the ssh jig): the worker connects with the node's user, port and key,
// checks the host key against the node's pinned known_hosts (recording it
// on first use), runs the command in a fresh directory under the remote
// user's ~/.anneal, reads back $ANNEAL_OUTPUTS (and $ANNEAL_ATTRS_OUT), and
// records the result like an agent's. The full log stays in the worker's
// orchestrator directory. A timeout, a cancellation and a dead connection
// (keepalives unanswered) each end the run as failed; none hangs it.
func (a *Activities) RunOverSSH(ctx context.Context, in contract.RunTaskInput) (*contract.RunOutcome, error) {
	var run *models.TaskRun
	var node *models.Node
	err := a.whenNodeFree(ctx, in, func() error {
		var err error
		run, node, err = a.SSH.StartLocalRun(ctx, in.RunID)
		return err
	})
	if err != nil {
		return nil, err
	}
	if run.State == contract.RunSucceeded {
		return &contract.RunOutcome{}, nil // a retry after it succeeded: do not run twice
	}
	defer keepAlive(ctx)()
	res, err := a.sshRun(ctx, run, node)
	if err != nil {
		return nil, err
	}
	rec, err := a.SSH.RecordRunResult(ctx, node.ID, run.ID, res)
	if err != nil {
		return nil, err
	}
	a.Log.Info("ssh run finished", "node", node.Name, "task", run.TaskName, "run", run.ID, "attempt", run.Attempt,
		"state", rec.Run.State, "exit_code", res.ExitCode)
	if !res.Succeeded() {
		msg := fmt.Sprintf("task %s failed over ssh on %s with exit code %d", run.TaskName, node.Name, res.ExitCode)
		if res.Error != "" {
			msg = fmt.Sprintf("task %s failed over ssh on %s: %s", run.TaskName, node.Name, res.Error)
		}
		return nil, temporal.NewApplicationError(msg, contract.ErrTypeTaskFailed, contract.RunOutcome{ExitCode: res.ExitCode})
	}
	return &contract.RunOutcome{ExitCode: res.ExitCode}, nil
}

// HostKeyMismatchError is a node whose SSH server presented a key that
// none of its pinned known_hosts lines holds.
type HostKeyMismatchError struct {
	Node        string
	Fingerprint string   // the presented key, "type SHA256:..."
	Known       []string // the pinned keys' fingerprints
}

func (e *HostKeyMismatchError) Error() string {
	return fmt.Sprintf("host key mismatch for node %s: its SSH server presented %s, which is not among its pinned keys %v (if the node was reinstalled, set its known_hosts with PUT /api/v1/nodes/%s/ssh)",
		e.Node, e.Fingerprint, e.Known, e.Node)
}

// sshRun executes run on node over SSH and returns its result; the error
// is only for what must be retried (the store unreachable).
func (a *Activities) sshRun(ctx context.Context, run *models.TaskRun, node *models.Node) (protocol.RunResult, error) {
	res := protocol.RunResult{Attempt: run.Attempt, ExitCode: -1, StartedAt: time.Now().UTC()}
	fail := func(format string, args ...any) (protocol.RunResult, error) {
		res.Error = fmt.Sprintf(format, args...)
		res.FinishedAt = time.Now().UTC()
		return res, nil
	}
	settings, err := a.SSH.NodeSSH(ctx, node.ID)
	if errors.Is(err, models.ErrSSHKeyUnreadable) {
		// The key was sealed with a key this worker lacks: a retry would
		// meet the same, the operator must fix the keyring.
		return fail("the SSH key of node %s cannot be opened: %v", node.Name, err)
	}
	if err != nil {
		return res, err
	}
	if settings == nil || settings.PrivateKey == "" {
		return fail("node %s has no SSH key: set it with PUT /api/v1/nodes/%s/ssh", node.Name, node.Name)
	}
	signer, err := ssh.ParsePrivateKey([]byte(settings.PrivateKey))
	if err != nil {
		return fail("the SSH key of node %s cannot be read: %v", node.Name, err)
	}
	env := map[string]string{}
	item := protocol.WorkItem{RunID: run.ID, Attempt: run.Attempt, TransactionID: run.TransactionID.String(), Graph: run.GraphType,
		Task: run.TaskName, Command: run.Spec.Cmd, TimeoutSec: run.Spec.TimeoutSec, Env: env}
	if run.NodeRoleID != nil {
		raw, err := json.Marshal(run.AttrsIn)
		if err != nil {
			return res, fmt.Errorf("encode attributes of run %d: %w", run.ID, err)
		}
		item.TransactionID, item.NodeRoleID, item.Attrs = "", *run.NodeRoleID, raw
		env["ANNEAL_NODEROLE"] = strconv.FormatInt(*run.NodeRoleID, 10)
	} else {
		rc, err := a.SSH.RunContext(ctx, run)
		if err != nil {
			return res, err
		}
		// Only this node's outputs, as ANNEAL_OUT_<TASK>_<KEY>.
		for _, o := range rc.Outputs {
			if o.NodeName != node.Name {
				continue
			}
			for k, v := range o.Outputs {
				env["ANNEAL_OUT_"+envName(o.TaskName)+"_"+envName(k)] = v
			}
		}
	}
	host := settings.Host
	if host == "" {
		host = node.Address
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	if host == "" {
		host = node.Name
	}
	x := &sshExec{
		a: a, node: node, settings: settings, signer: signer, item: item,
		addr:    net.JoinHostPort(host, strconv.Itoa(settings.Port)),
		logPath: filepath.Join(a.orchestratorDir(), node.Name, "logs", logDir(item), fmt.Sprintf("%s.%d.%d.log", safeFile(item.Task), item.RunID, item.Attempt)),
	}
	return x.run(ctx, res), nil
}

// sshExec is one run over SSH.
type sshExec struct {
	a        *Activities
	node     *models.Node
	settings *models.NodeSSH
	signer   ssh.Signer
	item     protocol.WorkItem
	addr     string
	logPath  string
}

func (x *sshExec) keepalive() time.Duration {
	if x.a.SSHKeepalive > 0 {
		return x.a.SSHKeepalive
	}
	return DefaultSSHKeepalive
}

// hostKey checks the presented key against the node's known_hosts,
// pinning it when there are none (first use).
func (x *sshExec) hostKey(ctx context.Context) ssh.HostKeyCallback {
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		known := x.settings.KnownHosts
		keys, err := models.ParseKnownHosts(known)
		if err != nil {
			return fmt.Errorf("the known_hosts of node %s cannot be read: %v", x.node.Name, err)
		}
		if len(keys) == 0 {
			line := strings.TrimSpace(knownHostsLine(x.addr, key))
			if known, err = x.a.SSH.PinSSHHostKey(ctx, x.node.ID, line); err != nil {
				return err
			}
			x.a.Log.Info("ssh host key pinned on first use", "node", x.node.Name, "fingerprint", key.Type()+" "+ssh.FingerprintSHA256(key))
			if keys, err = models.ParseKnownHosts(known); err != nil {
				return err
			}
		}
		var fps []string
		for _, k := range keys {
			if bytes.Equal(k.Marshal(), key.Marshal()) {
				return nil
			}
			fps = append(fps, k.Type()+" "+ssh.FingerprintSHA256(k))
		}
		return &HostKeyMismatchError{Node: x.node.Name, Fingerprint: key.Type() + " " + ssh.FingerprintSHA256(key), Known: fps}
	}
}

// knownHostsLine is key as a known_hosts line for addr ("[host]:port" when
// the port is not 22, as OpenSSH writes it).
func knownHostsLine(addr string, key ssh.PublicKey) string {
	host, port, _ := net.SplitHostPort(addr)
	if port != "22" {
		host = "[" + host + "]:" + port
	}
	return host + " " + string(ssh.MarshalAuthorizedKey(key))
}

// connect dials the node and completes the SSH handshake within the dial
// timeout (a server that accepts but never speaks does not hold the run).
func (x *sshExec) connect(ctx context.Context) (*ssh.Client, error) {
	d := net.Dialer{Timeout: DefaultSSHDialTimeout, KeepAlive: x.keepalive()}
	conn, err := d.DialContext(ctx, "tcp", x.addr)
	if err != nil {
		return nil, fmt.Errorf("cannot reach node %s over ssh at %s: %v", x.node.Name, x.addr, err)
	}
	_ = conn.SetDeadline(time.Now().Add(DefaultSSHDialTimeout))
	cfg := &ssh.ClientConfig{User: x.settings.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(x.signer)},
		HostKeyCallback: x.hostKey(ctx), Timeout: DefaultSSHDialTimeout}
	c, chans, reqs, err := ssh.NewClientConn(conn, x.addr, cfg)
	if err != nil {
		conn.Close()
		var mismatch *HostKeyMismatchError
		if errors.As(err, &mismatch) {
			return nil, mismatch
		}
		return nil, fmt.Errorf("ssh to node %s at %s as %s: %v", x.node.Name, x.addr, x.settings.User, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// run executes the item and fills res.
func (x *sshExec) run(ctx context.Context, res protocol.RunResult) protocol.RunResult {
	timeout := x.item.Timeout()
	if timeout <= 0 {
		timeout = time.Duration(models.DefaultTaskTimeoutSec) * time.Second
	}
	lf, err := newRunLog(x.logPath)
	if err != nil {
		res.Error = err.Error()
		res.FinishedAt = time.Now().UTC()
		return res
	}
	defer func() {
		res.FinishedAt = time.Now().UTC()
		lf.comment("finished %s: exit code %d, error: %s", res.FinishedAt.Format(time.RFC3339Nano), res.ExitCode, res.Error)
		if err := lf.close(); err != nil {
			x.a.Log.Warn("writing the ssh run's log failed", "path", x.logPath, "error", err)
		}
	}()
	lf.comment("anneal run %d attempt %d: task %q, graph %q, transaction %q, node %q over ssh %s@%s",
		x.item.RunID, x.item.Attempt, x.item.Task, x.item.Graph, x.item.TransactionID, x.node.Name, x.settings.User, x.addr)
	lf.comment("command: %s", strings.ReplaceAll(x.item.Command, "\n", "\n#   "))
	lf.comment("started %s, timeout %s", res.StartedAt.Format(time.RFC3339Nano), timeout)

	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, errSSHTimedOut)
	defer cancel()
	client, err := x.connect(runCtx)
	if err != nil {
		if errors.Is(context.Cause(runCtx), errSSHTimedOut) {
			err = fmt.Errorf("timed out after %s connecting to node %s: %v", timeout, x.node.Name, err)
		}
		res.Error = err.Error()
		lf.comment("%s", res.Error)
		return res
	}
	// The watchdog closes the connection on timeout, cancellation or
	// unanswered keepalives: every blocked read below then returns.
	var mu sync.Mutex
	var lost error
	stopping := make(chan struct{}, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(x.keepalive())
		defer tick.Stop()
		answered := make(chan error, 1)
		waiting := false
		misses := 0
		for {
			select {
			case <-done:
				client.Close()
				return
			case <-runCtx.Done():
				// Ask the wrapper to stop the command's group, then give up
				// on the connection.
				stopping <- struct{}{}
				select {
				case <-done:
				case <-time.After(sshStopGrace):
				}
				client.Close()
				return
			case err := <-answered:
				waiting = false
				if err != nil {
					mu.Lock()
					lost = fmt.Errorf("connection to node %s lost: %v", x.node.Name, err)
					mu.Unlock()
					client.Close()
					return
				}
				misses = 0
			case <-tick.C:
				if waiting {
					misses++
					if misses >= sshKeepaliveMisses {
						mu.Lock()
						lost = fmt.Errorf("connection to node %s lost: no answer to %d keepalives in %s", x.node.Name, misses, time.Duration(misses)*x.keepalive())
						mu.Unlock()
						client.Close()
						return
					}
					continue
				}
				waiting = true
				go func() {
					_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
					answered <- err
				}()
			}
		}
	}()
	why := func(err error) string {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case lost != nil:
			return lost.Error()
		case errors.Is(context.Cause(runCtx), errSSHTimedOut):
			return "timed out after " + timeout.String()
		case ctx.Err() != nil:
			return "cancelled"
		}
		return fmt.Sprintf("connection to node %s lost: %v", x.node.Name, err)
	}

	dir := fmt.Sprintf(".anneal/runs/%d.%d", x.item.RunID, x.item.Attempt)
	// A fresh run directory, with the attributes of a noderole's run.
	prep, err := client.NewSession()
	if err != nil {
		res.Error = why(err)
		lf.comment("%s", res.Error)
		return res
	}
	prepare := fmt.Sprintf("cd && rm -rf %[1]s && mkdir -p %[1]s && : > %[1]s/outputs", dir)
	if x.item.Attrs != nil {
		prepare += fmt.Sprintf(" && cat > %[1]s/attrs.json && : > %[1]s/attrs_out.json", dir)
		prep.Stdin = bytes.NewReader(x.item.Attrs)
	}
	var prepErr bytes.Buffer
	prep.Stderr = &prepErr
	err = prep.Run(prepare)
	prep.Close()
	if err != nil {
		res.Error = fmt.Sprintf("cannot prepare the run's directory ~/%s on node %s: %s", dir, x.node.Name, strings.TrimSpace(prepErr.String()))
		if _, ok := err.(*ssh.ExitError); !ok {
			res.Error = why(err)
		}
		lf.comment("%s", res.Error)
		return res
	}
	sess, err := client.NewSession()
	if err != nil {
		res.Error = why(err)
		lf.comment("%s", res.Error)
		return res
	}
	// The wrapper watches its stdin: closing it (a timeout, a
	// cancellation) or losing the connection stops the command's group.
	stdin, err := sess.StdinPipe()
	if err != nil {
		res.Error = why(err)
		return res
	}
	go func() {
		select {
		case <-stopping:
			stdin.Close()
		case <-done:
		}
	}()
	stdoutTail, stderrTail := newByteTail(protocol.MaxTailBytes), newByteTail(protocol.MaxTailBytes)
	sess.Stdout = io.MultiWriter(stdoutTail, lf.stream("out| "))
	sess.Stderr = io.MultiWriter(stderrTail, lf.stream("err| "))
	waitErr := sess.Run(x.script(dir))
	stdin.Close()
	sess.Close()
	var exitErr *ssh.ExitError
	var missing *ssh.ExitMissingError
	var problems []string
	switch {
	case waitErr == nil:
		res.ExitCode = 0
	case errors.As(waitErr, &exitErr) && exitErr.Signal() == "":
		res.ExitCode = exitErr.ExitStatus()
	case errors.As(waitErr, &exitErr):
		problems = append(problems, "killed by signal "+exitErr.Signal())
	case errors.As(waitErr, &missing), waitErr != nil:
		res.Error = why(waitErr)
		lf.comment("%s", res.Error)
		res.StdoutTail, res.StderrTail = stdoutTail.String(), stderrTail.String()
		return res
	}
	if runCtx.Err() != nil || func() bool { mu.Lock(); defer mu.Unlock(); return lost != nil }() {
		// Stopped by the worker (timeout, cancellation): whatever code the
		// stopped command left is not its own.
		res.ExitCode = -1
		problems = append(problems, why(waitErr))
	}
	// Read back what the command wrote, then clean up.
	outputs, err := x.readFile(client, dir+"/outputs", daemon.MaxOutputsBytes)
	if err != nil {
		problems = append(problems, why(err))
	} else if res.Outputs, err = daemon.ParseOutputs(outputs); err != nil {
		problems = append(problems, err.Error())
	}
	if x.item.Attrs != nil {
		back, err := x.readFile(client, dir+"/attrs_out.json", daemon.MaxAttrsBytes)
		if err != nil {
			problems = append(problems, why(err))
		} else if res.Attrs, err = mergeAttrs(x.item.Attrs, back); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if sess, err := client.NewSession(); err == nil {
		_ = sess.Run("rm -rf " + dir)
		sess.Close()
	}
	res.StdoutTail, res.StderrTail = stdoutTail.String(), stderrTail.String()
	res.Error = strings.Join(problems, "; ")
	return res
}

var errSSHTimedOut = errors.New("ssh run timed out")

// sshStopGrace is how long a stopped run's wrapper has to stop its command
// (SIGTERM, then SIGKILL after 2 s) before the connection is closed.
const sshStopGrace = 4 * time.Second

// script is what the remote shell runs in the prepared run directory: the
// environment an agent's command gets, then the command with /bin/sh -c.
func (x *sshExec) script(dir string) string {
	env := map[string]string{}
	for k, v := range x.item.Env {
		env[k] = v
	}
	env["ANNEAL_NODE"] = x.node.Name
	env["ANNEAL_RUN_ID"] = strconv.FormatInt(x.item.RunID, 10)
	env["ANNEAL_ATTEMPT"] = strconv.Itoa(x.item.Attempt)
	env["ANNEAL_TASK"] = x.item.Task
	env["ANNEAL_TRANSACTION"] = x.item.TransactionID
	env["ANNEAL_GRAPH"] = x.item.Graph
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("cd || exit 125\n")
	b.WriteString("ANNEAL_WORKDIR=\"$HOME/.anneal\"; ANNEAL_OUTPUTS=\"$HOME/" + dir + "/outputs\"; export ANNEAL_WORKDIR ANNEAL_OUTPUTS\n")
	if x.item.Attrs != nil {
		b.WriteString("ANNEAL_ATTRS=\"$HOME/" + dir + "/attrs.json\"; ANNEAL_ATTRS_OUT=\"$HOME/" + dir + "/attrs_out.json\"; export ANNEAL_ATTRS ANNEAL_ATTRS_OUT\n")
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s; export %s\n", k, shellQuote(env[k]), k)
	}
	// The command runs in a session (setsid) of its own, so that a stop
	// reaches all it started, as the agent stops a command's group. A
	// watcher reads the wrapper's stdin (kept on fd 3: an asynchronous
	// list's stdin is /dev/null): when the worker closes it, or the
	// connection is gone, the group gets SIGTERM, then SIGKILL after 2 s.
	b.WriteString("cd \"$ANNEAL_WORKDIR\" || exit 125\nexec 3<&0\n")
	fmt.Fprintf(&b, "if command -v setsid >/dev/null 2>&1; then setsid /bin/sh -c %[1]s </dev/null & else /bin/sh -c %[1]s </dev/null & fi\n", shellQuote(x.item.Command))
	b.WriteString("job=$!\n")
	b.WriteString("(cat <&3 >/dev/null; kill -TERM -$job 2>/dev/null || kill -TERM $job 2>/dev/null; sleep 2; kill -KILL -$job 2>/dev/null || kill -KILL $job 2>/dev/null) >/dev/null 2>&1 &\n")
	b.WriteString("watch=$!\nexec 3<&-\nwait $job\nrc=$?\nkill $watch 2>/dev/null\nexit $rc\n")
	return b.String()
}

// readFile reads a remote file (relative to the home directory) in a new
// session; a missing file reads as empty.
func (x *sshExec) readFile(client *ssh.Client, path string, max int) ([]byte, error) {
	sess, err := client.NewSession()
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	var out bytes.Buffer
	sess.Stdout = &limitWriter{w: &out, n: max + 1}
	if err := sess.Run("cd && cat " + path + " 2>/dev/null; true"); err != nil {
		return nil, err
	}
	if out.Len() > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", filepath.Base(path), max)
	}
	return out.Bytes(), nil
}

// mergeAttrs deep-merges the JSON object a noderole's script wrote to
// $ANNEAL_ATTRS_OUT onto what it was sent, as the agent does.
func mergeAttrs(sent json.RawMessage, written []byte) (json.RawMessage, error) {
	written = bytes.TrimSpace(written)
	if len(written) == 0 {
		return sent, nil
	}
	var w, base map[string]any
	if err := json.Unmarshal(written, &w); err != nil || w == nil {
		return nil, fmt.Errorf("$ANNEAL_ATTRS_OUT must hold one JSON object")
	}
	if err := json.Unmarshal(sent, &base); err != nil {
		return nil, fmt.Errorf("attributes sent are not a JSON object: %v", err)
	}
	return json.Marshal(attrs.DeepMerge(base, w))
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// envName makes an environment variable name part of a task or key name:
// upper case, anything but letters and digits an underscore (as the API
// does for the agent).
func envName(s string) string {
	b := []byte(strings.ToUpper(s))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

func logDir(item protocol.WorkItem) string {
	if item.NodeRoleID != 0 {
		return fmt.Sprintf("noderole-%d", item.NodeRoleID)
	}
	return safeFile(item.TransactionID)
}

// safeFile makes s a file name.
func safeFile(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == '\\' {
			return '_'
		}
		return r
	}, s)
}

// runLog is the full log of a run over SSH, in the agent's format: "# "
// comments, then "out| " and "err| " lines.
type runLog struct {
	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	streams []*prefixWriter
}

func newRunLog(path string) (*runLog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("cannot create log directory: %v", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot open log file: %v", err)
	}
	return &runLog{f: f, w: bufio.NewWriter(f)}, nil
}

func (l *runLog) comment(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "# "+format+"\n", args...)
}

func (l *runLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.streams {
		if len(p.partial) > 0 { // a last line without a newline gets one
			l.w.WriteString(p.prefix)
			l.w.Write(p.partial)
			l.w.WriteString("\n")
			p.partial = nil
		}
	}
	return errors.Join(l.w.Flush(), l.f.Close())
}

// stream returns a writer that logs whole lines with prefix.
func (l *runLog) stream(prefix string) io.Writer {
	p := &prefixWriter{l: l, prefix: prefix}
	l.mu.Lock()
	l.streams = append(l.streams, p)
	l.mu.Unlock()
	return p
}

type prefixWriter struct {
	l       *runLog
	prefix  string
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		p.l.w.WriteString(p.prefix)
		p.l.w.Write(p.partial[:i+1])
		p.partial = p.partial[i+1:]
	}
	if len(p.partial) > 64<<10 {
		p.l.w.WriteString(p.prefix)
		p.l.w.Write(p.partial)
		p.l.w.WriteString("\n")
		p.partial = p.partial[:0]
	}
	return len(b), nil
}

// byteTail keeps the last max bytes written.
type byteTail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newByteTail(max int) *byteTail { return &byteTail{max: max} }

func (t *byteTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *byteTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(string(t.buf), "\uFFFD")
}

// limitWriter keeps at most n bytes and drops the rest.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if len(q) > l.n {
		q = q[:l.n]
	}
	l.n -= len(q)
	if _, err := l.w.Write(q); err != nil {
		return 0, err
	}
	return len(p), nil
}
