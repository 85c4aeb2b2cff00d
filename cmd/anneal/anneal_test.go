package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
)

// binary is the anneal CLI, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "anneal-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "anneal")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the anneal CLI:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cliRelease: a controller and compute nodes (the compute's hypervisor
// waits for the controller's api across nodes), a graph that fails on the
// node with the broken role, one that fails until a file exists, a slow
// one, and a Crowbar role (web) for the snapshot commands.
const cliRelease = `
name: clirel
version: "1"
roles_metadata:
  controller: {tags: [controller]}
  compute: {tags: [compute]}
  broken: {tags: [flaky]}
  web: {script: "echo web up"}
graphs:
  deployment:
    tasks:
      - {id: base, tags: ["/.*/"], parameters: {cmd: "echo base on $ANNEAL_NODE", timeout: 30}}
      - {id: api, tags: [controller], requires: [base], parameters: {cmd: "echo api up", timeout: 30}}
      - id: hypervisor
        tags: [compute]
        requires: [base]
        cross_depends: [{name: api, tags: [controller]}]
        parameters: {cmd: "echo joined", timeout: 30}
  failing:
    tasks:
      - {id: prepare, tags: [flaky], parameters: {cmd: "echo preparing", timeout: 30}}
      - {id: fails, tags: [flaky], requires: [prepare], parameters: {cmd: "echo about to fail >&2; exit 3", timeout: 30}}
      - {id: after-fails, tags: [flaky], requires: [fails], parameters: {cmd: "echo never", timeout: 30}}
  fixable:
    tasks:
      - {id: needs-fix, tags: [controller], parameters: {cmd: "test -f fixed || { echo not fixed >&2; exit 4; }", timeout: 30}}
      - {id: after-fix, tags: [controller], requires: [needs-fix], parameters: {cmd: "echo after", timeout: 30}}
  slow:
    tasks:
      - {id: long, tags: [controller], parameters: {cmd: "sleep 3; echo finished anyway", timeout: 30}}
      - {id: next, tags: [controller], requires: [long], parameters: {cmd: "echo next", timeout: 30}}
  chatty:
    tasks:
      - {id: talk, tags: [controller], parameters: {cmd: "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.5; done", timeout: 30}}
`

func nodeName(short string) string { return short + ".anneal.test" }

// result is one run of the CLI.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the anneal binary with a clean environment: its own empty
// config directory, and the given variables (ANNEAL_URL, ANNEAL_TOKEN...).
func cli(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	if _, ok := env["XDG_CONFIG_HOME"]; !ok {
		cmd.Env = append(cmd.Env, "XDG_CONFIG_HOME="+t.TempDir())
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err, "run anneal %v", args)
	}
	r := result{stdout: out.String(), stderr: errb.String(), code: code}
	t.Logf("anneal %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, r.stdout, r.stderr)
	return r
}

// env is the stack's URL and admin token, as ANNEAL_URL/ANNEAL_TOKEN.
func env(st *testenv.Stack) map[string]string {
	return map[string]string{"ANNEAL_URL": st.URL, "ANNEAL_TOKEN": st.AdminToken}
}

// decode parses a command's -o json output.
func decode[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "stdout is not the expected JSON: %s", r.stdout)
	return v
}

// errLine returns stderr's single line (every failure is one line).
func errLine(t *testing.T, r result) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(last, "anneal: "), "stderr does not end with the error line: %q", r.stderr)
	return last
}

type txJSON struct {
	UUID       string         `json:"uuid"`
	Status     string         `json:"status"`
	Deployment string         `json:"deployment"`
	Progress   int            `json:"progress"`
	Counts     map[string]int `json:"counts"`
	DryRun     bool           `json:"dry_run"`
}

type runJSON struct {
	NodeName   string `json:"node_name"`
	TaskName   string `json:"task_name"`
	State      string `json:"state"`
	ExitCode   *int   `json:"exit_code"`
	StderrTail string `json:"stderr_tail"`
}

type txShowJSON struct {
	Transaction txJSON    `json:"transaction"`
	Runs        []runJSON `json:"runs"`
}

func runStates(runs []runJSON) map[string]string {
	out := map[string]string{}
	for _, r := range runs {
		out[r.TaskName+"@"+r.NodeName] = r.State
	}
	return out
}

// uuidOf finds the transaction uuid in a "transaction <uuid> started" line.
func uuidOf(t *testing.T, text string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "transaction "); ok && strings.Contains(rest, " started") {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("no 'transaction <uuid> started' line in %q", text)
	return ""
}

// TestCLI drives a real stack (API, worker, Temporal, Postgres, three
// agents) through the built anneal binary only, checking exit codes and
// parsing what it prints.
func TestCLI(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(cliRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "clirel"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	agents := map[string]*testenv.Agent{}
	for short, roles := range map[string][]string{"ctl": {"controller"}, "cmp": {"compute"}, "odd": {"compute", "broken"}} {
		agents[short] = st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short), map[string]any{"deployment": "d1", "roles": roles}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	e := env(st)

	t.Run("usage errors exit 2", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "deployment", "--bogus")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, errLine(t, r), "unknown flag: --bogus")
		r = cli(t, e, "graph", "execute", "-d", "d1")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, errLine(t, r), `"type" not set`)
		r = cli(t, e, "tx", "show")
		assert.Equal(t, 2, r.code)
		r = cli(t, e, "nodes", "-o", "yaml")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, errLine(t, r), "table or json")
		r = cli(t, nil, "nodes") // no URL, no token, no config file
		assert.Equal(t, 2, r.code)
		assert.Contains(t, errLine(t, r), "ANNEAL_URL")
	})

	t.Run("nodes", func(t *testing.T) {
		r := cli(t, e, "nodes", "-d", "d1", "-o", "json")
		require.Equal(t, 0, r.code)
		nodes := decode[[]struct {
			Name  string   `json:"name"`
			Alive bool     `json:"alive"`
			Roles []string `json:"roles"`
		}](t, r)
		got := map[string][]string{}
		for _, n := range nodes {
			got[n.Name] = n.Roles
			assert.True(t, n.Alive, n.Name)
		}
		assert.Equal(t, map[string][]string{nodeName("ctl"): {"controller"}, nodeName("cmp"): {"compute"},
			nodeName("odd"): {"compute", "broken"}}, got)
		r = cli(t, e, "nodes", "-d", "d1")
		require.Equal(t, 0, r.code)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 4, "a header and three nodes")
		assert.Equal(t, []string{"ID", "NAME", "DEPLOYMENT", "STATUS", "PROGRESS", "ALIVE", "AVAILABLE", "ROLES", "ADDRESS"}, strings.Fields(lines[0]))
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			assert.Equal(t, "d1", f[2], line)
			assert.Equal(t, "yes", f[5], line)
		}
		assert.Contains(t, r.stdout, nodeName("odd"))
	})

	t.Run("graph show", func(t *testing.T) {
		r := cli(t, e, "graph", "show", "-d", "d1", "-t", "deployment", "--dot")
		require.Equal(t, 0, r.code)
		assert.True(t, strings.HasPrefix(r.stdout, `digraph "d1/deployment"`), r.stdout)
		for _, want := range []string{nodeName("ctl"), nodeName("cmp"), "hypervisor", "api"} {
			assert.Contains(t, r.stdout, want)
		}
		assert.Equal(t, 3, strings.Count(r.stdout, "subgraph "), "one cluster per node")
		r = cli(t, e, "graph", "show", "-d", "d1", "-t", "deployment", "-o", "json")
		require.Equal(t, 0, r.code)
		g := decode[struct {
			Tasks []struct {
				ID       string   `json:"id"`
				Requires []string `json:"requires"`
			} `json:"tasks"`
		}](t, r)
		ids := map[string][]string{}
		for _, tk := range g.Tasks {
			ids[tk.ID] = tk.Requires
		}
		assert.Equal(t, []string{"base"}, ids["api"])
		assert.Contains(t, ids, "hypervisor")
	})

	t.Run("API 4xx is one line naming the field", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "teleport")
		assert.Equal(t, 1, r.code)
		line := errLine(t, r)
		assert.Equal(t, 1, strings.Count(strings.TrimSpace(r.stderr), "\n")+1, "one line: %q", r.stderr)
		assert.Contains(t, line, "graphs[0].type")
		assert.Contains(t, line, `no graph of type "teleport"`)
		assert.Contains(t, line, "fix --type")
		r = cli(t, e, "graph", "execute", "-d", "nope", "-t", "deployment")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "fix --deployment")
		r = cli(t, e, "tx", "show", "not-a-uuid")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "uuid")
	})

	var failedTx string
	t.Run("graph execute follows to success and failure", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "deployment")
		require.Equal(t, 0, r.code, r.stderr)
		id := uuidOf(t, r.stdout)
		// One line per run state change, then the summary per node.
		assert.Regexp(t, `\d\d:\d\d:\d\d  `+nodeName("ctl")+` +api +succeeded`, r.stdout)
		assert.Regexp(t, `\d\d:\d\d:\d\d  `+nodeName("cmp")+` +hypervisor +succeeded`, r.stdout)
		// odd runs base, hypervisor and the task of its broken role.
		assert.Regexp(t, `(?m)^`+nodeName("odd")+` +3 +3 +0 `, r.stdout)
		assert.Contains(t, r.stdout, "transaction "+id+" ready")

		show := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
		assert.Equal(t, "ready", show.Transaction.Status)
		assert.Equal(t, map[string]int{"succeeded": 7}, show.Transaction.Counts)
		assert.Len(t, show.Runs, 7)

		r = cli(t, e, "graph", "execute", "-d", "d1", "-t", "failing")
		assert.Equal(t, 1, r.code)
		failedTx = uuidOf(t, r.stdout)
		line := errLine(t, r)
		assert.Contains(t, line, "ended error")
		assert.Contains(t, line, "task fails on node "+nodeName("odd"))
		assert.Contains(t, line, "exit 3")
		assert.Contains(t, line, "about to fail")
		show = decode[txShowJSON](t, cli(t, e, "tx", "show", failedTx, "-o", "json"))
		assert.Equal(t, map[string]string{"prepare@" + nodeName("odd"): "succeeded", "fails@" + nodeName("odd"): "failed",
			"after-fails@" + nodeName("odd"): "blocked"}, runStates(show.Runs))
	})

	t.Run("graph execute options", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "deployment", "--nodes", nodeName("ctl"), "--tasks", "api",
			"--dry-run", "--force", "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		tx := decode[txJSON](t, r) // stdout is only the final transaction
		assert.True(t, tx.DryRun)
		// api is unchanged since it succeeded: only --force plans it.
		assert.Equal(t, "ready", tx.Status)
		assert.Equal(t, map[string]int{"planned": 1}, tx.Counts)
		assert.Contains(t, r.stderr, "transaction "+tx.UUID+" started", "progress goes to stderr with -o json")
		r = cli(t, e, "graph", "execute", "-d", "d1", "-t", "deployment", "--nodes", "ghost.anneal.test")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "ghost.anneal.test")
	})

	t.Run("tx show table and logs", func(t *testing.T) {
		r := cli(t, e, "tx", "show", failedTx)
		require.Equal(t, 0, r.code)
		assert.Contains(t, r.stdout, "Status       error")
		assert.Regexp(t, `fails +failed +1 +3 .*about to fail`, r.stdout)
		r = cli(t, e, "logs", failedTx, "--task", "fails")
		require.Equal(t, 0, r.code)
		assert.Contains(t, r.stdout, "==> fails on "+nodeName("odd"))
		assert.Contains(t, r.stdout, "err| about to fail\n", "the full log the agent shipped")
		assert.Contains(t, r.stdout, "# command: echo about to fail >&2; exit 3")
		assert.NotContains(t, r.stderr, "no full-log endpoint")
		assert.NotContains(t, r.stdout, "preparing", "--task limits the runs")
		// Following a transaction that has ended prints its logs and returns.
		r = cli(t, e, "logs", failedTx, "-f")
		require.Equal(t, 0, r.code)
		assert.Contains(t, r.stdout, "==> prepare on "+nodeName("odd"))
		assert.Contains(t, r.stdout, "about to fail")
		assert.NotContains(t, r.stdout, "after-fails", "a blocked run has no log")
		logs := decode[[]struct {
			Task string `json:"task"`
			Full bool   `json:"full"`
			Log  string `json:"log"`
		}](t, cli(t, e, "logs", failedTx, "--node", nodeName("odd"), "-o", "json"))
		require.Len(t, logs, 2, "prepare and fails ran; after-fails never did")
		assert.Equal(t, "prepare", logs[0].Task)
		assert.Contains(t, logs[0].Log, "out| preparing\n")
		assert.Contains(t, logs[1].Log, "err| about to fail\n")
		for _, l := range logs {
			assert.True(t, l.Full, "the whole log, not the tails")
			assert.Contains(t, l.Log, "# finished ")
		}
	})

	t.Run("logs follow a running run", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "chatty", "--detach")
		require.Equal(t, 0, r.code)
		id := uuidOf(t, r.stdout)
		require.Eventually(t, func() bool {
			s := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
			return runStates(s.Runs)["talk@"+nodeName("ctl")] == "running"
		}, 30*time.Second, 200*time.Millisecond)
		r = cli(t, e, "logs", id, "-f")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "==> talk on "+nodeName("ctl"))
		assert.Contains(t, r.stdout, "following", "streamed while it ran")
		for i := 1; i <= 8; i++ {
			assert.Contains(t, r.stdout, fmt.Sprintf("out| tick %d\n", i))
		}
		assert.Contains(t, r.stdout, "# finished ", "to the end of the log")
		assert.Equal(t, 1, strings.Count(r.stdout, "out| tick 8\n"), "printed once")
	})

	t.Run("tx stop and watch", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "slow", "--detach")
		require.Equal(t, 0, r.code)
		id := uuidOf(t, r.stdout)
		require.Eventually(t, func() bool {
			s := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
			return runStates(s.Runs)["long@"+nodeName("ctl")] == "running"
		}, 30*time.Second, 200*time.Millisecond)
		r = cli(t, e, "tx", "stop", id, "--wait")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "transaction "+id+" stopped")
		show := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
		assert.Equal(t, "stopped", show.Transaction.Status)
		assert.Equal(t, "succeeded", runStates(show.Runs)["long@"+nodeName("ctl")], "the running task finishes")
		assert.Equal(t, "cancelled", runStates(show.Runs)["next@"+nodeName("ctl")])
		// Watching a stopped transaction: it did not end ready.
		r = cli(t, e, "tx", "watch", id)
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "ended stopped")
		// Stopping it again is a 409, one line.
		r = cli(t, e, "tx", "stop", id)
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "nothing to stop")
	})

	t.Run("tx retry after the fix", func(t *testing.T) {
		r := cli(t, e, "graph", "execute", "-d", "d1", "-t", "fixable")
		require.Equal(t, 1, r.code)
		id := uuidOf(t, r.stdout)
		assert.Contains(t, errLine(t, r), "task needs-fix on node "+nodeName("ctl")+" (exit 4: not fixed)")
		require.NoError(t, os.WriteFile(filepath.Join(agents["ctl"].WorkDir, "fixed"), nil, 0o644))
		r = cli(t, e, "tx", "retry", id)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "transaction "+id+" ready")
		show := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
		assert.Equal(t, map[string]string{"needs-fix@" + nodeName("ctl"): "succeeded", "after-fix@" + nodeName("ctl"): "succeeded"},
			runStates(show.Runs))
	})

	t.Run("scenario run", func(t *testing.T) {
		status, body := st.Do(t, http.MethodPost, "/api/v1/scenarios", map[string]any{"name": "computes-only",
			"scenario": []map[string]any{{"graph_type": "deployment", "nodes": map[string]string{"expr": `"compute" in node.roles`}}}}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
		r := cli(t, e, "scenario", "run", "computes-only", "-d", "d1", "--force")
		require.Equal(t, 0, r.code, r.stderr)
		id := uuidOf(t, r.stdout)
		show := decode[txShowJSON](t, cli(t, e, "tx", "show", id, "-o", "json"))
		assert.Equal(t, "ready", show.Transaction.Status)
		nodes := map[string]bool{}
		for _, run := range show.Runs {
			nodes[run.NodeName] = true
			assert.Equal(t, "succeeded", run.State, run.TaskName+"@"+run.NodeName)
		}
		assert.Equal(t, map[string]bool{nodeName("cmp"): true, nodeName("odd"): true}, nodes, "only the compute nodes")
		r = cli(t, e, "scenario", "run", "nope", "-d", "d1")
		assert.Equal(t, 1, r.code)
	})

	t.Run("snapshot propose bind commit, then status", func(t *testing.T) {
		r := cli(t, e, "snapshot", "propose", "d1", "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		snap := decode[struct {
			ID    int64  `json:"id"`
			State string `json:"state"`
		}](t, r)
		assert.Equal(t, "proposed", snap.State)
		id := fmt.Sprint(snap.ID)
		r = cli(t, e, "snapshot", "bind", id, "--node", nodeName("ctl"), "--role", "web")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `noderole \d+: role web on node `+nodeName("ctl")+` in snapshot `+id+` \(proposed\)`, r.stdout)
		r = cli(t, e, "snapshot", "bind", id, "--node", nodeName("ctl"), "--role", "no-such-role")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "--role")
		r = cli(t, e, "snapshot", "bind", "x", "--node", nodeName("ctl"), "--role", "web")
		assert.Equal(t, 2, r.code, "a snapshot id is a number")
		// The proposal against the committed snapshot: web on ctl is new.
		r = cli(t, e, "snapshot", "diff", id)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "+ web on "+nodeName("ctl")+"\n")
		r = cli(t, e, "snapshot", "diff", id, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		diff := decode[struct {
			Added   []map[string]any `json:"added"`
			Removed []map[string]any `json:"removed"`
			Changed []map[string]any `json:"changed"`
		}](t, r)
		require.Len(t, diff.Added, 1)
		assert.Equal(t, "web", diff.Added[0]["role"])
		assert.Empty(t, diff.Removed)
		assert.Empty(t, diff.Changed)
		r = cli(t, e, "snapshot", "commit", id, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		committed := decode[struct {
			State     string `json:"state"`
			NodeRoles []struct {
				Role string `json:"role"`
				Node string `json:"node"`
			} `json:"noderoles"`
		}](t, r)
		assert.Equal(t, "committed", committed.State)
		assert.Contains(t, fmt.Sprint(committed.NodeRoles), "web "+nodeName("ctl"))

		// The annealer runs web on ctl: status shows it active.
		type statusJSON struct {
			Deployment string `json:"deployment"`
			Nodes      []struct {
				Name     string `json:"name"`
				Progress int    `json:"progress"`
			} `json:"nodes"`
			NodeRoles map[string][]struct {
				Role string `json:"role"`
				Node string `json:"node"`
			} `json:"noderoles_by_state"`
		}
		var s statusJSON
		require.Eventually(t, func() bool {
			s = decode[statusJSON](t, cli(t, e, "status", "d1", "-o", "json"))
			for _, nr := range s.NodeRoles["active"] {
				if nr.Role == "web" && nr.Node == nodeName("ctl") {
					return true
				}
			}
			return false
		}, 60*time.Second, 500*time.Millisecond, "web never became active on ctl")
		assert.Equal(t, "d1", s.Deployment)
		assert.Len(t, s.Nodes, 3)
		r = cli(t, e, "status", "d1")
		require.Equal(t, 0, r.code)
		assert.Contains(t, r.stdout, "Deployment  d1")
		assert.Regexp(t, `(?m)^active +\d+ +.*web@`+nodeName("ctl"), r.stdout)
		assert.Regexp(t, `(?m)^`+nodeName("odd")+` +d1 +`, r.stdout)
		r = cli(t, e, "status", "nope")
		assert.Equal(t, 1, r.code)
	})

	t.Run("login writes the config file", func(t *testing.T) {
		home := t.TempDir()
		cfgEnv := map[string]string{"XDG_CONFIG_HOME": home}
		// A refused token stores nothing.
		r := cli(t, cfgEnv, "login", "--url", st.URL, "--token", "wrong")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "anneal login")
		_, err := os.Stat(filepath.Join(home, "anneal", "config.json"))
		assert.True(t, os.IsNotExist(err), "a refused login wrote the config")

		r = cli(t, cfgEnv, "login", "--url", st.URL, "--token", st.AdminToken)
		require.Equal(t, 0, r.code, r.stderr)
		path := filepath.Join(home, "anneal", "config.json")
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var cfg map[string]string
		require.NoError(t, json.Unmarshal(raw, &cfg))
		assert.Equal(t, map[string]string{"url": st.URL, "token": st.AdminToken}, cfg)

		// No environment: the file is used.
		r = cli(t, cfgEnv, "nodes", "-d", "d1", "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Len(t, decode[[]map[string]any](t, r), 3)
		// The environment overrides the file, and a flag the environment.
		r = cli(t, map[string]string{"XDG_CONFIG_HOME": home, "ANNEAL_TOKEN": "wrong"}, "nodes")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "ANNEAL_TOKEN")
		r = cli(t, map[string]string{"XDG_CONFIG_HOME": home, "ANNEAL_TOKEN": "wrong"}, "nodes", "--token", st.AdminToken)
		assert.Equal(t, 0, r.code)

		// A token typed on stdin.
		home2 := t.TempDir()
		cmd := exec.Command(binary, "login", "--url", st.URL)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "XDG_CONFIG_HOME=" + home2}
		cmd.Stdin = strings.NewReader(st.AdminToken + "\n")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		raw, err = os.ReadFile(filepath.Join(home2, "anneal", "config.json"))
		require.NoError(t, err)
		assert.Contains(t, string(raw), st.AdminToken)
	})

	t.Run("tx list", func(t *testing.T) {
		// Two dry runs on d1, the newest first in the list.
		var ids []string
		for range 2 {
			var out struct {
				TaskUUID string `json:"task_uuid"`
			}
			status, body := st.Do(t, http.MethodPost, "/api/v1/graphs/execute",
				map[string]any{"deployment": "d1", "dry_run": true, "graphs": []map[string]any{{"type": "deployment"}}}, &out)
			require.Equal(t, http.StatusAccepted, status, "%s", body)
			ids = append(ids, out.TaskUUID)
			require.Equal(t, 0, cli(t, e, "tx", "watch", out.TaskUUID).code)
		}
		r := cli(t, e, "tx", "list", "-d", "d1", "--limit", "1", "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		page := decode[struct {
			Items      []txJSON `json:"items"`
			NextCursor string   `json:"next_cursor"`
		}](t, r)
		require.Len(t, page.Items, 1)
		assert.Equal(t, ids[1], page.Items[0].UUID, "newest first")
		assert.True(t, page.Items[0].DryRun)
		require.NotEmpty(t, page.NextCursor)
		r = cli(t, e, "tx", "list", "-d", "d1", "--limit", "1", "--cursor", page.NextCursor, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		next := decode[struct {
			Items []txJSON `json:"items"`
		}](t, r)
		require.Len(t, next.Items, 1)
		assert.Equal(t, ids[0], next.Items[0].UUID)

		r = cli(t, e, "tx", "list", "-d", "d1", "--status", "ready", "--limit", "1")
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 3, "a header, one transaction and the next page's command")
		assert.Equal(t, []string{"UUID", "DEPLOYMENT", "GRAPHS", "STATUS", "PROGRESS", "CREATED", "ERROR"}, strings.Fields(lines[0]))
		f := strings.Fields(lines[1])
		assert.Equal(t, []string{ids[1], "d1", "deployment", "ready", "100%"}, f[:5])
		assert.True(t, strings.HasPrefix(lines[2], "more: anneal tx list --cursor "), lines[2])

		r = cli(t, e, "tx", "list", "--status", "finished")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "status")
	})

	t.Run("token create list revoke", func(t *testing.T) {
		r := cli(t, e, "token", "create", "--name", "cli-viewer", "--scope", "viewer", "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		tok := decode[struct {
			ID    int64  `json:"id"`
			Name  string `json:"name"`
			Scope string `json:"scope"`
			Token string `json:"token"`
		}](t, r)
		assert.Equal(t, "cli-viewer", tok.Name)
		assert.Equal(t, "viewer", tok.Scope)
		require.True(t, strings.HasPrefix(tok.Token, "ann_"))

		// The viewer token reads, and is refused a write with one line.
		viewer := map[string]string{"ANNEAL_URL": st.URL, "ANNEAL_TOKEN": tok.Token}
		require.Equal(t, 0, cli(t, viewer, "nodes").code)
		r = cli(t, viewer, "token", "create", "--name", "x")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "scope admin")

		r = cli(t, e, "token", "list")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, fmt.Sprintf(`(?m)^%d +cli-viewer +viewer +`, tok.ID), r.stdout)
		assert.NotContains(t, r.stdout, tok.Token, "never a secret")
		r = cli(t, e, "token", "list", "-o", "json")
		require.Equal(t, 0, r.code)
		list := decode[struct {
			Items []struct {
				ID    int64  `json:"id"`
				Scope string `json:"scope"`
			} `json:"items"`
		}](t, r)
		require.NotEmpty(t, list.Items)
		assert.Equal(t, tok.ID, list.Items[0].ID, "newest first")

		r = cli(t, e, "token", "revoke", fmt.Sprint(tok.ID))
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, fmt.Sprintf("token %d revoked\n", tok.ID), r.stdout)
		r = cli(t, viewer, "nodes")
		assert.Equal(t, 1, r.code, "a revoked token is refused")
		r = cli(t, e, "token", "revoke", fmt.Sprint(tok.ID))
		assert.Equal(t, 1, r.code, "revoking twice: not found")
		r = cli(t, e, "token", "create", "--name", "x", "--scope", "root")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, errLine(t, r), "scope")
	})
}
