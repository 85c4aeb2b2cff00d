package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
)

func newExecutor(t *testing.T) *daemon.ShellExecutor {
	t.Helper()
	return &daemon.ShellExecutor{WorkDir: t.TempDir(), NodeName: "node1.example.com", KillGrace: 500 * time.Millisecond}
}

func item(cmd string) protocol.WorkItem {
	return protocol.WorkItem{RunID: 42, Attempt: 2, TransactionID: "tx-1", Graph: "deployment", Task: "hello", Type: "shell", Command: cmd, TimeoutSec: 30}
}

func TestShellExitCodeAndLog(t *testing.T) {
	e := newExecutor(t)
	res := e.Execute(context.Background(), item("echo out1; echo err1 >&2; echo out2; printf partial; exit 3"))
	assert.Equal(t, 3, res.ExitCode)
	assert.Empty(t, res.Error)
	assert.False(t, res.Succeeded())
	assert.Equal(t, 2, res.Attempt)
	assert.Equal(t, "out1\nout2\npartial", res.StdoutTail)
	assert.Equal(t, "err1\n", res.StderrTail)
	assert.False(t, res.StartedAt.IsZero())
	assert.False(t, res.FinishedAt.Before(res.StartedAt))

	path := filepath.Join(e.WorkDir, "logs", "tx-1", "hello.42.2.log")
	assert.Equal(t, path, e.LogPath(item("")))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	log := string(data)
	assert.Contains(t, log, "out| out1\n")
	assert.Contains(t, log, "err| err1\n")
	assert.Contains(t, log, "out| out2\n")
	assert.Contains(t, log, "out| partial\n")
	assert.Contains(t, log, "# command: echo out1")
	assert.Contains(t, log, "exit code 3")
	assert.Less(t, strings.Index(log, "out| out1"), strings.Index(log, "out| out2"))
}

func TestShellSuccessAndEnvironment(t *testing.T) {
	t.Setenv("ANNEAL_ENROLL_TOKEN", "secret")
	t.Setenv("ANNEAL_TOKEN", "operator-secret")
	t.Setenv("AGENT_OWN_VAR", "inherited")
	e := newExecutor(t)
	it := item(`echo "$ANNEAL_NODE|$ANNEAL_RUN_ID|$ANNEAL_ATTEMPT|$ANNEAL_TASK|$ANNEAL_TRANSACTION|$ANNEAL_GRAPH|$ANNEAL_WORKDIR|$FOO|$AGENT_OWN_VAR|${ANNEAL_ENROLL_TOKEN:-none}${ANNEAL_TOKEN:-}|$(pwd)"
test -f "$ANNEAL_OUTPUTS" && test ! -s "$ANNEAL_OUTPUTS"`)
	it.Env = map[string]string{"FOO": "bar baz", "ANNEAL_NODE": "spoofed"}
	res := e.Execute(context.Background(), it)
	require.True(t, res.Succeeded(), "error %q, stderr %q", res.Error, res.StderrTail)
	want := strings.Join([]string{"node1.example.com", "42", "2", "hello", "tx-1", "deployment", e.WorkDir, "bar baz", "inherited", "none", e.WorkDir}, "|")
	assert.Equal(t, want+"\n", res.StdoutTail)
	assert.Nil(t, res.Outputs)
}

func TestShellTailsAreTruncated(t *testing.T) {
	e := newExecutor(t)
	res := e.Execute(context.Background(), item(`i=0; while [ $i -lt 2000 ]; do echo "line $i"; echo "eline $i" >&2; i=$((i+1)); done; printf END; printf EEND >&2`))
	require.True(t, res.Succeeded(), res.Error)
	assert.Len(t, res.StdoutTail, protocol.MaxTailBytes)
	assert.Len(t, res.StderrTail, protocol.MaxTailBytes)
	assert.True(t, strings.HasSuffix(res.StdoutTail, "line 1999\nEND"))
	assert.True(t, strings.HasSuffix(res.StderrTail, "eline 1999\nEEND"))

	data, err := os.ReadFile(e.LogPath(item("")))
	require.NoError(t, err)
	assert.Contains(t, string(data), "out| line 0\n")
	assert.Contains(t, string(data), "err| eline 0\n")
	assert.Contains(t, string(data), "out| line 1999\n")
	assert.Equal(t, 2000, strings.Count(string(data), "err| eline "))
}

func TestShellTailKeepsValidUTF8(t *testing.T) {
	e := newExecutor(t)
	// 3000 two-byte characters, then an odd byte so that the cut falls inside one.
	res := e.Execute(context.Background(), item(`i=0; while [ $i -lt 3000 ]; do printf 'é'; i=$((i+1)); done; printf x`))
	require.True(t, res.Succeeded(), res.Error)
	assert.LessOrEqual(t, len(res.StdoutTail), protocol.MaxTailBytes)
	assert.Greater(t, len(res.StdoutTail), protocol.MaxTailBytes-4)
	assert.Equal(t, strings.Repeat("é", (len(res.StdoutTail)-1)/2)+"x", res.StdoutTail)
}

func TestShellOutputs(t *testing.T) {
	cases := map[string]struct {
		cmd  string
		want map[string]string
	}{
		"json": {
			cmd:  `printf '  {"ip": "10.0.0.1", "note": "a = b", "empty": ""}\n' > "$ANNEAL_OUTPUTS"`,
			want: map[string]string{"ip": "10.0.0.1", "note": "a = b", "empty": ""},
		},
		"key=value": {
			cmd: `cat > "$ANNEAL_OUTPUTS" <<'EOF'
# a comment

ip=10.0.0.1
 url = http://x/?a=b 
dup=1
dup=2
empty=
EOF`,
			want: map[string]string{"ip": "10.0.0.1", "url": "http://x/?a=b", "dup": "2", "empty": ""},
		},
		"appended lines": {
			cmd:  `echo a=1 >> "$ANNEAL_OUTPUTS"; echo b=2 >> "$ANNEAL_OUTPUTS"`,
			want: map[string]string{"a": "1", "b": "2"},
		},
		"nothing written": {cmd: `true`},
		"file removed":    {cmd: `rm "$ANNEAL_OUTPUTS"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res := newExecutor(t).Execute(context.Background(), item(c.cmd))
			require.True(t, res.Succeeded(), res.Error)
			assert.Equal(t, c.want, res.Outputs)
		})
	}
}

// TestShellReusesScratchFiles: an agent's executor (ReuseScratch) gives
// each run the same empty outputs and answer files, emptied of what the
// last run left there and made again if a command removed them; no file
// is left per run.
func TestShellReusesScratchFiles(t *testing.T) {
	e := newExecutor(t)
	e.ReuseScratch = true
	attrs := json.RawMessage(`{"a":1}`)
	first := scratchRun(t, e, 1, attrs, `echo k=v >> "$ANNEAL_OUTPUTS"; echo '{"b":2}' > "$ANNEAL_ATTRS_OUT"`)
	assert.Equal(t, map[string]string{"k": "v", "out": first.Outputs["out"], "attrs": first.Outputs["attrs"]}, first.Outputs)
	assert.JSONEq(t, `{"a":1,"b":2}`, string(first.Attrs))
	second := scratchRun(t, e, 2, attrs, `rm "$ANNEAL_ATTRS_OUT"`)
	assert.Nil(t, second.Attrs)
	third := scratchRun(t, e, 3, attrs, "true")
	assert.Equal(t, first.Outputs["out"], third.Outputs["out"], "the same outputs file")
	// The answer file the third run left empty is handed on untouched.
	answer := filepath.Join(filepath.Dir(first.Outputs["out"]), "attrs-out-"+strconv.Itoa(os.Getpid())+"-0.json")
	hourAgo := time.Now().Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, os.Chtimes(answer, hourAgo, hourAgo))
	scratchRun(t, e, 4, attrs, "true")
	info, err := os.Stat(answer)
	require.NoError(t, err)
	assert.Equal(t, hourAgo, info.ModTime(), "an empty answer file is not emptied again")
	pid := strconv.Itoa(os.Getpid())
	assert.ElementsMatch(t, []string{"outputs-" + pid + "-0", "attrs-out-" + pid + "-0.json", filepath.Base(first.Outputs["attrs"])}, scratchFiles(t, e))
}

// TestShellScratchLeftoversAndLinks: a run that leaves a process behind
// gives up its slot, so the process's late writes never reach a later run's
// outputs; a symbolic link or a hard link planted at a slot's path is
// replaced, not followed or emptied; attributes with secrets go to a file
// of the run alone.
func TestShellScratchLeftoversAndLinks(t *testing.T) {
	e := newExecutor(t)
	e.ReuseScratch = true
	first := scratchRun(t, e, 1, nil, `(sleep 1; echo late=1 >> "$ANNEAL_OUTPUTS") >/dev/null 2>&1 &`)
	second := scratchRun(t, e, 2, nil, "sleep 1.5")
	assert.NotEqual(t, first.Outputs["out"], second.Outputs["out"], "the first run's slot is retired")
	assert.Equal(t, map[string]string{"out": second.Outputs["out"]}, second.Outputs, "nothing written late")

	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep me\n"), 0o600))
	require.NoError(t, os.Remove(second.Outputs["out"]))
	require.NoError(t, os.Symlink(victim, second.Outputs["out"]))
	third := scratchRun(t, e, 3, nil, "true")
	assert.Equal(t, second.Outputs["out"], third.Outputs["out"])
	kept, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "keep me\n", string(kept))
	// Nor is a file linked to another name emptied, or handed on.
	require.NoError(t, os.Remove(third.Outputs["out"]))
	require.NoError(t, os.Link(victim, third.Outputs["out"]))
	fourth := scratchRun(t, e, 5, nil, "true")
	assert.Equal(t, third.Outputs["out"], fourth.Outputs["out"])
	kept, err = os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "keep me\n", string(kept), "the linked file was not emptied")

	it := item(`grep -q s3cret "$ANNEAL_ATTRS" && echo "attrs=$ANNEAL_ATTRS" >> "$ANNEAL_OUTPUTS"`)
	it.RunID, it.Attrs, it.Redact = 4, json.RawMessage(`{"pw":"s3cret"}`), []string{"s3cret"}
	res := e.Execute(context.Background(), it)
	require.True(t, res.Succeeded(), "error %q, stderr %q", res.Error, res.StderrTail)
	_, err = os.Stat(res.Outputs["attrs"])
	assert.ErrorIs(t, err, os.ErrNotExist, "the secret's file is removed with its run")
}

// scratchRun runs cmd after checking that its outputs and answer files are
// there and empty; its outputs name the files (out, attrs).
func scratchRun(t *testing.T, e *daemon.ShellExecutor, id int64, attrs json.RawMessage, cmd string) protocol.RunResult {
	t.Helper()
	check := `test -f "$ANNEAL_OUTPUTS" && test ! -s "$ANNEAL_OUTPUTS" && echo "out=$ANNEAL_OUTPUTS" >> "$ANNEAL_OUTPUTS" && `
	if attrs != nil {
		check += `test -f "$ANNEAL_ATTRS_OUT" && test ! -s "$ANNEAL_ATTRS_OUT" && echo "attrs=$ANNEAL_ATTRS" >> "$ANNEAL_OUTPUTS" && `
	}
	it := item(check + cmd)
	it.RunID, it.Attrs = id, attrs
	res := e.Execute(context.Background(), it)
	require.True(t, res.Succeeded(), "error %q, stderr %q", res.Error, res.StderrTail)
	return res
}

// scratchFiles lists the executor's scratch directory.
func scratchFiles(t *testing.T, e *daemon.ShellExecutor) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(e.WorkDir, "tmp", "*"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	return names
}

func TestShellMalformedOutputs(t *testing.T) {
	cases := map[string]struct{ cmd, errPart string }{
		"line without =":   {`printf 'a=1\n\njust text\n' > "$ANNEAL_OUTPUTS"`, `line 3: expected key=value, got "just text"`},
		"empty key":        {`echo '=1' > "$ANNEAL_OUTPUTS"`, "line 1: expected key=value"},
		"bad json":         {`echo '{"a": ' > "$ANNEAL_OUTPUTS"`, "not a JSON object"},
		"non-string value": {`echo '{"a": 1}' > "$ANNEAL_OUTPUTS"`, `value of "a" must be a JSON string`},
		"trailing data":    {`echo '{"a": "1"} x' > "$ANNEAL_OUTPUTS"`, "after the JSON object"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res := newExecutor(t).Execute(context.Background(), item(c.cmd))
			assert.Equal(t, 0, res.ExitCode)
			assert.False(t, res.Succeeded())
			assert.Contains(t, res.Error, c.errPart)
			assert.Contains(t, res.Error, "outputs file")
		})
	}
}

func TestShellOutputsKeptOnFailure(t *testing.T) {
	res := newExecutor(t).Execute(context.Background(), item(`echo reason=disk full > "$ANNEAL_OUTPUTS"; exit 1`))
	assert.Equal(t, 1, res.ExitCode)
	assert.Equal(t, map[string]string{"reason": "disk full"}, res.Outputs)
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	require.NoError(t, err)
	return pid
}

func TestShellTimeoutKillsProcessGroup(t *testing.T) {
	e := newExecutor(t)
	it := item(`sleep 60 & echo $! > "$ANNEAL_WORKDIR/grandchild.pid"; echo started; sleep 60`)
	it.TimeoutSec = 1
	start := time.Now()
	res := e.Execute(context.Background(), it)
	elapsed := time.Since(start)

	assert.Less(t, elapsed, 3*time.Second)
	assert.GreaterOrEqual(t, elapsed, time.Second)
	assert.Equal(t, "timed out after 1s", res.Error)
	assert.Equal(t, -1, res.ExitCode)
	assert.Equal(t, "started\n", res.StdoutTail)
	pid := readPID(t, filepath.Join(e.WorkDir, "grandchild.pid"))
	assert.Eventually(t, func() bool { return !alive(pid) }, 2*time.Second, 20*time.Millisecond, "grandchild %d survived", pid)
}

func TestShellTimeoutEscalatesToSIGKILL(t *testing.T) {
	e := newExecutor(t)
	it := item(`trap '' TERM; sleep 60 & echo $! > "$ANNEAL_WORKDIR/grandchild.pid"; while :; do sleep 1; done`)
	it.TimeoutSec = 1
	start := time.Now()
	res := e.Execute(context.Background(), it)
	elapsed := time.Since(start)

	assert.Less(t, elapsed, 1*time.Second+e.KillGrace+1500*time.Millisecond)
	assert.GreaterOrEqual(t, elapsed, 1*time.Second+e.KillGrace)
	assert.Equal(t, "timed out after 1s", res.Error)
	assert.Equal(t, -1, res.ExitCode)
	pid := readPID(t, filepath.Join(e.WorkDir, "grandchild.pid"))
	assert.Eventually(t, func() bool { return !alive(pid) }, 2*time.Second, 20*time.Millisecond, "grandchild %d survived", pid)
}

func TestShellCancel(t *testing.T) {
	e := newExecutor(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	res := e.Execute(ctx, item(`sleep 60`))
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Equal(t, "cancelled", res.Error)
	assert.Equal(t, -1, res.ExitCode)
}

func TestShellCancelWithCause(t *testing.T) {
	e := newExecutor(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(assert.AnError) })
	res := e.Execute(ctx, item(`sleep 60`))
	assert.Equal(t, "cancelled: "+assert.AnError.Error(), res.Error)
	assert.Equal(t, -1, res.ExitCode)
}

func TestShellBackgroundProcessHoldingOutput(t *testing.T) {
	e := newExecutor(t)
	start := time.Now()
	res := e.Execute(context.Background(), item(`sleep 5 & echo done`))
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.True(t, res.Succeeded(), res.Error)
	assert.Equal(t, "done\n", res.StdoutTail)
}

func TestShellUnsupportedType(t *testing.T) {
	it := item("true")
	it.Type = "reboot"
	res := newExecutor(t).Execute(context.Background(), it)
	assert.Equal(t, `unsupported task type "reboot" on the agent`, res.Error)
	assert.Equal(t, -1, res.ExitCode)

	it.Type = ""
	res = newExecutor(t).Execute(context.Background(), it)
	assert.True(t, res.Succeeded(), res.Error)
}

func TestShellCannotStart(t *testing.T) {
	e := newExecutor(t)
	e.Shell = "/nonexistent/sh"
	res := e.Execute(context.Background(), item("true"))
	assert.Equal(t, -1, res.ExitCode)
	assert.Contains(t, res.Error, "cannot start command")
	assert.False(t, res.FinishedAt.IsZero())
}

func TestShellEmptyCommand(t *testing.T) {
	res := newExecutor(t).Execute(context.Background(), item("  "))
	assert.Equal(t, "shell task has no command", res.Error)
	assert.Equal(t, -1, res.ExitCode)
}

func TestShellDefaultTimeout(t *testing.T) {
	e := newExecutor(t)
	e.DefaultTimeout = 300 * time.Millisecond
	it := item("sleep 60")
	it.TimeoutSec = 0
	res := e.Execute(context.Background(), it)
	assert.Equal(t, "timed out after 300ms", res.Error)
}

func TestShellUnsafeNamesStayInLogDir(t *testing.T) {
	e := newExecutor(t)
	it := item("echo hi")
	it.TransactionID = ".."
	it.Task = "../../etc/passwd"
	res := e.Execute(context.Background(), it)
	require.True(t, res.Succeeded(), res.Error)
	path := e.LogPath(it)
	assert.True(t, strings.HasPrefix(path, filepath.Join(e.WorkDir, "logs")+string(filepath.Separator)), path)
	assert.FileExists(t, path)
}

// TestShellRemakesMissingDirectories: a run makes its log and scratch
// directories only when they are missing (it does not look first), so a
// directory removed between runs (pruned, or by a command) is made again,
// with or without reused scratch files, and the run's files land in it.
func TestShellRemakesMissingDirectories(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		e := newExecutor(t)
		e.ReuseScratch = reuse
		attrs := json.RawMessage(`{"a":1}`)
		first := scratchRun(t, e, 1, attrs, "true")
		logDir := filepath.Dir(e.LogPath(item("true")))
		tmpDir := filepath.Dir(first.Outputs["out"])
		require.DirExists(t, logDir)
		require.NoError(t, os.RemoveAll(logDir))
		require.NoError(t, os.RemoveAll(tmpDir))

		second := scratchRun(t, e, 2, attrs, "echo again")
		assert.Equal(t, tmpDir, filepath.Dir(second.Outputs["out"]), "reuse %v", reuse)
		it := item("true")
		it.RunID = 2
		log, err := os.ReadFile(e.LogPath(it))
		require.NoError(t, err, "reuse %v", reuse)
		assert.Contains(t, string(log), "out| again")
		info, err := os.Stat(tmpDir)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "the scratch directory is the agent's alone")
	}
}

// openDescriptors counts this process's open pipes and files under dir:
// what a run opens (other descriptors, such as connections an earlier
// test left closing, come and go on their own).
func openDescriptors(t *testing.T, dir string) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, dir)) {
			n++
		}
	}
	return n
}

// The output pipes are the agent's own (outputPipe): every end is closed
// after a run, whether its command wrote, held its output open in the
// background, or could not start.
func TestShellLeavesNoDescriptorsOpen(t *testing.T) {
	e := newExecutor(t)
	e.Execute(context.Background(), item("true")) // the first run opens what later runs reuse
	before := openDescriptors(t, e.WorkDir)
	for _, cmd := range []string{"true", "echo out; echo err >&2; exit 2", "sleep 5 & echo done"} {
		res := e.Execute(context.Background(), item(cmd))
		assert.Empty(t, res.Error, cmd)
	}
	e.Shell = "/nonexistent/sh"
	res := e.Execute(context.Background(), item("true"))
	assert.Contains(t, res.Error, "cannot start command")
	assert.Equal(t, before, openDescriptors(t, e.WorkDir))
}
