package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/anneal-dev/anneal/models/secrets"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/worker/server"
)

// The fault scenarios of `dev chaos`, in the order they run.
const (
	chaosNone       = "none"        // the control: nothing is killed
	chaosCombined   = "worker+api"  // SIGKILL the process serving the worker and the API
	chaosAPIOnly    = "api-only"    // split processes; SIGKILL the API-only one (-no-worker)
	chaosWorkerOnly = "worker-only" // split processes; SIGKILL the worker-only one (no -api)
	chaosTwoWorkers = "two-workers" // an API-only process and two worker-only ones; SIGKILL one worker for good
	chaosAgent      = "agent"       // SIGKILL an agent with a task running, restart it
	chaosTemporal   = "temporal"    // SIGKILL the Temporal dev server, restart it on its file
	chaosPostgres   = "postgres"    // restart the private Postgres cluster
)

var chaosScenarios = []string{chaosNone, chaosCombined, chaosAPIOnly, chaosWorkerOnly, chaosTwoWorkers, chaosAgent, chaosTemporal, chaosPostgres}

// chaosConfig is what the flags of `dev chaos` say.
type chaosConfig struct {
	nodes, tasks, retries, heartbeatSec int
	taskTime, down, timeout             time.Duration
	killAt                              float64
	scenarios                           []string
	postgres                            string
	database                            string // the database the stack uses (reset first)
}

// chaos starts a whole stack of real processes (Postgres, a Temporal dev
// server on a persisted file, the worker and API, one agent process per
// node), and for each scenario runs a transaction of nodes × tasks, kills
// one part of the stack mid-run and brings it back, and counts from the
// nodes' own records what ran: every task appends "<node> <task> <start>
// <end>" to a file per node outside the agent's work directory. It prints
// a table and fails when a scenario lost or doubled a run.
func chaos(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	cfg := chaosConfig{}
	fs.IntVar(&cfg.nodes, "nodes", 30, "simulated nodes (one agent process each)")
	fs.IntVar(&cfg.tasks, "tasks", 10, "tasks per node (a chain)")
	fs.IntVar(&cfg.retries, "retries", 1, "retries of each task (a run lost with its agent is retried this often)")
	fs.IntVar(&cfg.heartbeatSec, "heartbeat-timeout", 30, "seconds without an agent heartbeat before a run counts as lost (the worker's -heartbeat-timeout)")
	fs.DurationVar(&cfg.taskTime, "task-time", 500*time.Millisecond, "how long each task sleeps")
	fs.DurationVar(&cfg.down, "down", 2*time.Second, "how long a killed process stays down before it is restarted")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "how long a scenario's transaction may take to end")
	fs.Float64Var(&cfg.killAt, "kill-at", 0.3, "kill when this fraction of the runs has executed")
	list := fs.String("scenarios", strings.Join(chaosScenarios, ","), "comma-separated scenarios to run, in this order: "+strings.Join(chaosScenarios, ", "))
	cfg.database = "anneal_chaos"
	fs.StringVar(&cfg.postgres, "postgres", "private", `"private": a private cluster under .dev/chaos-pg that dev owns, so it may restart it; "auto": dev's usual choice (the postgres scenario is skipped unless that is a private cluster)`)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if cfg.nodes < 1 || cfg.tasks < 1 || cfg.retries < 0 || cfg.heartbeatSec < 1 || cfg.killAt <= 0 || cfg.killAt >= 1 {
		return errors.New("chaos: --nodes and --tasks at least 1, --retries at least 0, --heartbeat-timeout at least 1, --kill-at between 0 and 1")
	}
	for _, s := range strings.Split(*list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slicesContains(chaosScenarios, s) {
			return fmt.Errorf("chaos: --scenarios: unknown scenario %q (known: %s)", s, strings.Join(chaosScenarios, ", "))
		}
		cfg.scenarios = append(cfg.scenarios, s)
	}
	if cfg.postgres != "private" && cfg.postgres != "auto" {
		return fmt.Errorf(`chaos: --postgres: %q is neither "private" nor "auto"`, cfg.postgres)
	}

	h, err := newChaosHarness(ctx, root, state, cfg, log)
	if h != nil {
		defer h.close()
	}
	if err != nil {
		return err
	}
	var results []chaosResult
	for _, s := range cfg.scenarios {
		r := h.run(ctx, s)
		results = append(results, r)
		fmt.Println(r.line())
		if ctx.Err() != nil {
			break
		}
	}
	printChaosTable(os.Stdout, cfg, results)
	for _, r := range results {
		if r.failed() {
			return &exitError{code: 1}
		}
	}
	return nil
}

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// chaosHarness is the running stack of `dev chaos`.
type chaosHarness struct {
	cfg                     chaosConfig
	log                     *slog.Logger
	dir, runsDir, bin       string
	dbURL, apiAddr          string
	pg                      *devenv.Postgres
	pgSkip                  string // why the postgres scenario cannot run, if it cannot
	tmpOpts                 devenv.TemporalOptions
	tmp                     *devenv.Temporal
	api                     *apiClient
	enrollToken, adminToken string
	// secretKey is the servers' secret key (ANNEAL_SECRET_KEY), one per harness.
	secretKey             string
	names                 []string
	agents                map[string]*devenv.Proc
	combined, apiP, workP *devenv.Proc // the server processes of the current topology
	workP2                *devenv.Proc // a second worker-only process (two-workers)
}

func newChaosHarness(ctx context.Context, root, state string, cfg chaosConfig, log *slog.Logger) (*chaosHarness, error) {
	h := &chaosHarness{cfg: cfg, log: log, dir: filepath.Join(state, "chaos"), agents: map[string]*devenv.Proc{}}
	h.runsDir = filepath.Join(h.dir, "runs")
	if err := os.RemoveAll(h.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(h.runsDir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if cfg.postgres == "private" {
		h.pg, err = devenv.EnsurePrivatePostgres(ctx, filepath.Join(state, "chaos-pg"), log)
		if err != nil {
			log.Warn("no private PostgreSQL cluster; using dev's usual server, and the postgres scenario is skipped", "error", err)
		}
	}
	if h.pg == nil {
		if h.pg, err = devenv.EnsurePostgres(ctx, state, log); err != nil {
			return h, err
		}
	}
	if h.pg.Source != devenv.PostgresPrivate {
		h.pgSkip = fmt.Sprintf("Postgres is the %s server (%s), not a private cluster dev owns; run with --postgres private", h.pg.Source, redactURL(h.pg.URL))
	}
	if h.dbURL, err = h.pg.ResetDatabase(ctx, cfg.database); err != nil {
		return h, err
	}

	// A Temporal server of its own, on fixed ports and a file, so that it
	// can be killed and come back where the processes look for it.
	if os.Getenv(devenv.EnvTemporalAddress) != "" {
		log.Warn("ignoring " + devenv.EnvTemporalAddress + ": chaos kills its Temporal server, so it runs its own")
		os.Unsetenv(devenv.EnvTemporalAddress)
	}
	port, err := devenv.FreePort()
	if err != nil {
		return h, err
	}
	uiPort, err := devenv.FreePort()
	if err != nil {
		return h, err
	}
	h.tmpOpts = devenv.DefaultTemporalOptions(h.dir)
	h.tmpOpts.Port, h.tmpOpts.UIPort = port, uiPort
	if h.tmp, err = devenv.EnsureTemporal(ctx, h.tmpOpts, log); err != nil {
		return h, err
	}
	if h.bin, err = buildBinaries(ctx, root, state); err != nil {
		return h, err
	}
	// The admin token reaches the database as an install's first one does:
	// the server takes it as its bootstrap token (serverArgs).
	env := loadOrCreateEnv(h.dir)
	h.adminToken = env["ANNEAL_TOKEN"]
	h.secretKey = secrets.GenerateKey()
	apiPort, err := devenv.FreePort()
	if err != nil {
		return h, err
	}
	h.apiAddr = fmt.Sprintf("127.0.0.1:%d", apiPort)
	h.api = newAPIClient("http://"+h.apiAddr, env["ANNEAL_TOKEN"])
	if err := h.topology(ctx, false); err != nil {
		return h, err
	}
	if err := ensureEnrollToken(ctx, h.api, env); err != nil {
		return h, err
	}
	h.enrollToken = env["ANNEAL_ENROLL_TOKEN"]
	if _, err := h.api.call(ctx, http.MethodPost, "/api/v1/releases", "application/yaml", []byte(chaosRelease(cfg, h.runsDir)), nil); err != nil {
		return h, fmt.Errorf("import the chaos release: %w", err)
	}
	if _, err := h.api.call(ctx, http.MethodPost, "/api/v1/deployments", "", map[string]string{"name": "chaos", "release": "chaos"}, nil); err != nil {
		return h, fmt.Errorf("create the chaos deployment: %w", err)
	}
	fmt.Printf("starting %d agent processes...\n", cfg.nodes)
	for i := 1; i <= cfg.nodes; i++ {
		name := fmt.Sprintf("chaos-%03d.%s", i, server.DefaultDomain)
		h.names = append(h.names, name)
		if err := h.startAgent(name); err != nil {
			return h, err
		}
	}
	for _, name := range h.names {
		if err := waitNode(ctx, h.api, name, h.agents[name]); err != nil {
			return h, err
		}
		if _, err := h.api.call(ctx, http.MethodPatch, "/api/v1/nodes/"+name, "", map[string]any{"deployment": "chaos", "roles": []string{"chaos"}}, nil); err != nil {
			return h, fmt.Errorf("put %s into the chaos deployment: %w", name, err)
		}
	}
	fmt.Printf("stack up: API %s, Temporal %s (UI %s), Postgres %s (%s); state and logs in %s\n",
		h.api.base, h.tmp.Address, h.tmp.UIURL, redactURL(h.dbURL), h.pg.Source, h.dir)
	return h, nil
}

func redactURL(u string) string {
	if i := strings.Index(u, "?"); i >= 0 {
		return u[:i]
	}
	return u
}

// chaosRelease is a release whose "chaos" graph is a chain of tasks on
// every node; each sleeps, then appends "<node> <task> <start> <end>" to
// runsDir/<node> (outside the agent's work directory, so that it is the
// node's own record of what ran).
func chaosRelease(cfg chaosConfig, runsDir string) string {
	var b strings.Builder
	b.WriteString("name: chaos\nversion: \"1\"\nroles_metadata:\n  chaos: {tags: [chaos]}\ngraphs:\n  chaos:\n    tasks:\n")
	sleep := strconv.FormatFloat(cfg.taskTime.Seconds(), 'f', 3, 64)
	for i := 1; i <= cfg.tasks; i++ {
		fmt.Fprintf(&b, "      - id: t%02d\n        tags: [chaos]\n", i)
		if i > 1 {
			fmt.Fprintf(&b, "        requires: [t%02d]\n", i-1)
		}
		fmt.Fprintf(&b, "        parameters:\n          timeout: 120\n          retries: %d\n          cmd: |\n", cfg.retries)
		fmt.Fprintf(&b, "            s=$(date +%%s.%%N); sleep %s\n", sleep)
		fmt.Fprintf(&b, "            echo \"$ANNEAL_NODE $ANNEAL_TASK $s $(date +%%s.%%N)\" >> %s/\"$ANNEAL_NODE\"\n", shellQuote(runsDir))
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (h *chaosHarness) logFile(name string) string {
	return filepath.Join(h.dir, "logs", strings.ReplaceAll(name, "/", "-")+".log")
}

// startAgent starts (or restarts) the agent process of a node; its work
// directory, and so its credential, survive restarts.
func (h *chaosHarness) startAgent(name string) error {
	p, err := devenv.StartProc(name, exec.Command(filepath.Join(h.bin, "agent"),
		"--api", h.api.base, "--name", name, "--enroll-token", h.enrollToken,
		"--workdir", filepath.Join(h.dir, "nodes", name)), h.logFile(name))
	if err != nil {
		return err
	}
	h.agents[name] = p
	return nil
}

// serverArgs are the worker binary's flags common to every server process.
func (h *chaosHarness) serverArgs(extra ...string) *exec.Cmd {
	args := append([]string{"-database-url", h.dbURL, "-temporal", h.tmp.Address,
		"-heartbeat-timeout", strconv.Itoa(h.cfg.heartbeatSec)}, extra...)
	cmd := exec.Command(filepath.Join(h.bin, "worker"), args...)
	cmd.Env = append(os.Environ(), "ANNEAL_BOOTSTRAP_TOKEN="+h.adminToken, secrets.EnvKey+"="+h.secretKey)
	return cmd
}

// startCombined starts the process serving the worker and the API.
func (h *chaosHarness) startCombined(ctx context.Context) error {
	p, err := devenv.StartProc("worker+api", h.serverArgs("-api", h.apiAddr), h.logFile("worker+api"))
	if err != nil {
		return err
	}
	h.combined = p
	return h.waitAPI(ctx, p)
}

// startAPIOnly starts the API-only process (-no-worker).
func (h *chaosHarness) startAPIOnly(ctx context.Context) error {
	p, err := devenv.StartProc("api-only", h.serverArgs("-api", h.apiAddr, "-no-worker"), h.logFile("api-only"))
	if err != nil {
		return err
	}
	h.apiP = p
	return h.waitAPI(ctx, p)
}

// startWorkerOnly starts the worker-only process (no -api). It has no
// health endpoint: it counts as up when it is still running after a second.
func (h *chaosHarness) startWorkerOnly(ctx context.Context) error {
	p, err := h.startWorker(ctx, "worker-only")
	h.workP = p
	return err
}

// startSecondWorker starts a second worker-only process on the same task
// queue, if none runs.
func (h *chaosHarness) startSecondWorker(ctx context.Context) error {
	if h.workP2 != nil {
		return nil
	}
	p, err := h.startWorker(ctx, "worker-only-2")
	h.workP2 = p
	return err
}

// stopSecondWorker stops the second worker-only process, if one runs.
func (h *chaosHarness) stopSecondWorker() {
	if h.workP2 != nil {
		_ = h.workP2.Stop(10 * time.Second)
		h.workP2 = nil
	}
}

func (h *chaosHarness) startWorker(ctx context.Context, name string) (*devenv.Proc, error) {
	p, err := devenv.StartProc(name, h.serverArgs(), h.logFile(name))
	if err != nil {
		return nil, err
	}
	select {
	case <-p.Done():
		return p, fmt.Errorf("the %s process exited: %v\n%s", name, p.Err(), p.LogTail(20))
	case <-ctx.Done():
		return p, ctx.Err()
	case <-time.After(time.Second):
		return p, nil
	}
}

func (h *chaosHarness) waitAPI(ctx context.Context, p *devenv.Proc) error {
	if err := waitHealthy(ctx, h.api.base, 60*time.Second, p.Done()); err != nil {
		return fmt.Errorf("%s: %w\n%s", p.Name(), err, p.LogTail(20))
	}
	return nil
}

// topology makes the server processes one combined process (split false)
// or an API-only and a worker-only process (split true).
func (h *chaosHarness) topology(ctx context.Context, split bool) error {
	if split == (h.apiP != nil) && (h.combined != nil || h.apiP != nil) {
		return nil
	}
	for _, p := range []**devenv.Proc{&h.combined, &h.apiP, &h.workP, &h.workP2} {
		if *p != nil {
			_ = (*p).Stop(10 * time.Second)
			*p = nil
		}
	}
	if !split {
		return h.startCombined(ctx)
	}
	if err := h.startAPIOnly(ctx); err != nil {
		return err
	}
	return h.startWorkerOnly(ctx)
}

func (h *chaosHarness) close() {
	for _, p := range h.agents {
		_ = p.Stop(5 * time.Second)
	}
	for _, p := range []*devenv.Proc{h.combined, h.apiP, h.workP, h.workP2} {
		if p != nil {
			_ = p.Stop(10 * time.Second)
		}
	}
	if h.tmp != nil {
		_ = h.tmp.Close()
	}
	if h.pg != nil {
		_ = h.pg.Close()
	}
}

// chaosResult is one row of the table.
type chaosResult struct {
	scenario string
	tx       string
	expected int
	executed int // lines in the node files
	twice    int // (node, task) pairs executed more than once
	lost     int // (node, task) pairs never executed
	retried  int // runs the API shows with more than one attempt
	status   string
	counts   map[string]int
	txError  string
	recovery time.Duration // from the kill to the first run started after it finishing; -1 if none
	killed   string        // what was killed
	skipped  string        // why the scenario did not run
	err      error         // the harness could not run the scenario

	// workers are the identities' prefixes ("<pid>@") of the worker
	// processes of a two-workers scenario; activities counts the
	// transaction's activity tasks started per worker identity.
	workers    []string
	activities map[string]int
}

func (r chaosResult) failed() bool { return r.err != nil || r.lost > 0 || r.twice > 0 }

func (r chaosResult) line() string {
	switch {
	case r.skipped != "":
		return fmt.Sprintf("%s: skipped: %s", r.scenario, r.skipped)
	case r.err != nil:
		return fmt.Sprintf("%s: %v", r.scenario, r.err)
	}
	workers := ""
	if len(r.activities) > 0 {
		workers = fmt.Sprintf("; activity tasks started per worker identity %v", r.activities)
	}
	return fmt.Sprintf("%s: killed %s; transaction %s ended %s; executed %d of %d, %d twice, %d lost; state counts %v%s%s",
		r.scenario, r.killed, r.tx, r.status, r.executed, r.expected, r.twice, r.lost, r.counts, workers, errSuffixText(r.txError))
}

func errSuffixText(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return "; error: " + s
}

// run runs one scenario: a fresh transaction, the kill mid-run, the
// restart, the wait for the end, and the count.
func (h *chaosHarness) run(ctx context.Context, scenario string) chaosResult {
	r := chaosResult{scenario: scenario, expected: h.cfg.nodes * h.cfg.tasks, recovery: -1}
	if scenario == chaosPostgres && h.pgSkip != "" {
		r.skipped = h.pgSkip
		return r
	}
	fmt.Printf("\n== scenario %s\n", scenario)
	if scenario != chaosTwoWorkers {
		h.stopSecondWorker()
	}
	if err := h.topology(ctx, scenario == chaosAPIOnly || scenario == chaosWorkerOnly || scenario == chaosTwoWorkers); err != nil {
		r.err = fmt.Errorf("set up the server processes: %w", err)
		return r
	}
	if scenario == chaosTwoWorkers {
		if err := h.startSecondWorker(ctx); err != nil {
			r.err = fmt.Errorf("start the second worker: %w", err)
			return r
		}
		r.workers = []string{fmt.Sprintf("%d@", h.workP.Pid()), fmt.Sprintf("%d@", h.workP2.Pid())}
	}
	if err := clearDir(h.runsDir); err != nil {
		r.err = err
		return r
	}
	var ans struct {
		TaskUUID string `json:"task_uuid"`
	}
	// force: every scenario runs every task, although nothing changed.
	if _, err := h.api.call(ctx, http.MethodPost, "/api/v1/graphs/execute", "",
		map[string]any{"deployment": "chaos", "graphs": []map[string]any{{"type": "chaos"}}, "force": true}, &ans); err != nil {
		r.err = err
		return r
	}
	r.tx = ans.TaskUUID
	fmt.Printf("transaction %s: %d nodes x %d tasks; killing at %.0f%% executed\n", r.tx, h.cfg.nodes, h.cfg.tasks, h.cfg.killAt*100)

	// Wait until enough has run, then kill.
	want := int(float64(r.expected) * h.cfg.killAt)
	deadline := time.Now().Add(h.cfg.timeout)
	for {
		recs, err := readRunRecords(h.runsDir)
		if err != nil {
			r.err = err
			return r
		}
		if len(recs) >= want {
			break
		}
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("only %d of %d runs executed within %s, before any kill", len(recs), want, h.cfg.timeout)
			return r
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			r.err = ctx.Err()
			return r
		}
	}
	killedAt := time.Now()
	killedNode, err := h.inject(ctx, scenario, r.tx, &r)
	if err != nil {
		r.err = err
		return r
	}

	status, err := h.waitTransaction(ctx, r.tx, deadline)
	if err != nil {
		r.err = err
		return r
	}
	r.status, r.counts, r.txError = status.Status, status.Counts, status.Error
	if scenario == chaosTwoWorkers {
		if r.activities, err = h.activityIdentities(ctx, r.tx); err != nil {
			r.err = err
			return r
		}
	}
	if r.retried, err = h.retriedRuns(ctx, r.tx); err != nil {
		r.err = err
		return r
	}
	// A task whose agent died runs on by itself: give it time to finish
	// writing before counting.
	sleepCtx(ctx, h.cfg.taskTime+time.Second)
	recs, err := readRunRecords(h.runsDir)
	if err != nil {
		r.err = err
		return r
	}
	r.count(recs, h.names, h.cfg.tasks, killedAt, killedNode)
	return r
}

// inject kills what the scenario names and brings it back; it returns the
// node whose agent it killed, if any.
func (h *chaosHarness) inject(ctx context.Context, scenario, tx string, r *chaosResult) (string, error) {
	kill := func(p *devenv.Proc) error {
		r.killed = fmt.Sprintf("%s (pid %d)", p.Name(), p.Pid())
		fmt.Printf("SIGKILL %s\n", r.killed)
		if err := p.Kill(); err != nil {
			return err
		}
		sleepCtx(ctx, h.cfg.down)
		return nil
	}
	switch scenario {
	case chaosNone:
		r.killed = "nothing (control)"
		return "", nil
	case chaosCombined:
		if err := kill(h.combined); err != nil {
			return "", err
		}
		return "", h.startCombined(ctx)
	case chaosAPIOnly:
		if err := kill(h.apiP); err != nil {
			return "", err
		}
		return "", h.startAPIOnly(ctx)
	case chaosWorkerOnly:
		if err := kill(h.workP); err != nil {
			return "", err
		}
		return "", h.startWorkerOnly(ctx)
	case chaosTwoWorkers:
		// The first worker goes for good: the second finishes alone.
		if err := kill(h.workP); err != nil {
			return "", err
		}
		h.workP, h.workP2 = h.workP2, nil
		return "", nil
	case chaosAgent:
		node, err := h.nodeWithRunningTask(ctx, tx)
		if err != nil {
			return "", err
		}
		if err := kill(h.agents[node]); err != nil {
			return "", err
		}
		return node, h.startAgent(node)
	case chaosTemporal:
		r.killed = fmt.Sprintf("temporal (pid %d)", h.tmp.Pid())
		fmt.Printf("SIGKILL %s\n", r.killed)
		if err := h.tmp.Kill(); err != nil {
			return "", err
		}
		sleepCtx(ctx, h.cfg.down)
		tmp, err := devenv.EnsureTemporal(ctx, h.tmpOpts, h.log)
		if err != nil {
			return "", fmt.Errorf("restart the Temporal dev server on %s: %w", h.tmpOpts.StateDir, err)
		}
		h.tmp = tmp
		return "", nil
	case chaosPostgres:
		r.killed = "postgres (pg_ctl restart -m fast)"
		fmt.Println("restarting Postgres")
		return "", h.pg.Restart(ctx)
	}
	return "", fmt.Errorf("unknown scenario %q", scenario)
}

// nodeWithRunningTask finds a node with a run in state running.
func (h *chaosHarness) nodeWithRunningTask(ctx context.Context, tx string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var runs []struct {
			NodeName string `json:"node_name"`
			State    string `json:"state"`
		}
		if err := h.api.listAll(ctx, "/api/v1/transactions/"+tx+"/runs?state=running", &runs); err != nil {
			return "", err
		}
		for _, run := range runs {
			if _, ok := h.agents[run.NodeName]; ok && run.State == "running" {
				return run.NodeName, nil
			}
		}
		if time.Now().After(deadline) {
			return "", errors.New("no run was running for 30s: nothing to kill an agent under")
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return "", ctx.Err()
		}
	}
}

// retriedRuns counts the transaction's runs dispatched more than once: a
// run whose claim or report was lost and that its retries ran again shows
// up here even when the table shows nothing lost.
func (h *chaosHarness) retriedRuns(ctx context.Context, tx string) (int, error) {
	var runs []struct {
		Attempt int `json:"attempt"`
	}
	if err := h.api.listAll(ctx, "/api/v1/transactions/"+tx+"/runs", &runs); err != nil {
		return 0, err
	}
	n := 0
	for _, run := range runs {
		if run.Attempt > 1 {
			n++
		}
	}
	return n, nil
}

// chaosTxStatus is the part of GET /transactions/:uuid chaos reads.
type chaosTxStatus struct {
	Status string         `json:"status"`
	Error  string         `json:"error"`
	Counts map[string]int `json:"counts"`
}

// waitTransaction polls the transaction until it ends; the API may be
// away for a while (that is the point).
func (h *chaosHarness) waitTransaction(ctx context.Context, tx string, deadline time.Time) (chaosTxStatus, error) {
	var st chaosTxStatus
	for {
		st = chaosTxStatus{}
		_, err := h.api.call(ctx, http.MethodGet, "/api/v1/transactions/"+tx, "", nil, &st)
		if err == nil && st.Status != "pending" && st.Status != "running" {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("transaction %s still %q after %s (last error: %v)", tx, st.Status, h.cfg.timeout, err)
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return st, ctx.Err()
		}
	}
}

// runRecord is one line a task wrote: what ran where, and when.
type runRecord struct {
	node, task string
	start, end time.Time
}

// readRunRecords reads every node file in dir.
func readRunRecords(dir string) ([]runRecord, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []runRecord
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue // a line being written
			}
			rec := runRecord{node: fields[0], task: fields[1]}
			if len(fields) >= 4 {
				rec.start, rec.end = epoch(fields[2]), epoch(fields[3])
			}
			out = append(out, rec)
		}
		f.Close()
	}
	return out, nil
}

// epoch parses `date +%s.%N`.
func epoch(s string) time.Time {
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	frac = (frac + "000000000")[:9]
	nanos, _ := strconv.ParseInt(frac, 10, 64)
	return time.Unix(secs, nanos)
}

// count fills the counts of a result from the node files. The recovery
// time is from the kill to the end of the first run that started after it
// (on the killed agent's node, when an agent was killed).
func (r *chaosResult) count(recs []runRecord, nodes []string, tasks int, killedAt time.Time, killedNode string) {
	seen := map[string]int{}
	var first time.Time
	for _, rec := range recs {
		seen[rec.node+" "+rec.task]++
		if rec.start.After(killedAt) && (killedNode == "" || rec.node == killedNode) {
			if first.IsZero() || rec.end.Before(first) {
				first = rec.end
			}
		}
	}
	r.executed = len(recs)
	for _, n := range seen {
		if n > 1 {
			r.twice++
		}
	}
	for _, node := range nodes {
		for i := 1; i <= tasks; i++ {
			if seen[fmt.Sprintf("%s t%02d", node, i)] == 0 {
				r.lost++
			}
		}
	}
	if !first.IsZero() {
		r.recovery = first.Sub(killedAt)
	}
}

func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// printChaosTable prints the results as the README shows them.
func printChaosTable(w *os.File, cfg chaosConfig, results []chaosResult) {
	fmt.Fprintf(w, "\nanneal chaos: %d nodes x %d tasks (retries %d, heartbeat timeout %ds, task %s, killed at %.0f%%, down %s)\n",
		cfg.nodes, cfg.tasks, cfg.retries, cfg.heartbeatSec, cfg.taskTime, cfg.killAt*100, cfg.down)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\truns expected\texecuted\texecuted twice\tlost\tretried\tfinal status\trecovery")
	for _, r := range results {
		switch {
		case r.skipped != "":
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\tskipped\t-\n", r.scenario, r.expected)
			continue
		case r.err != nil:
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\tharness error\t-\n", r.scenario, r.expected)
			continue
		}
		rec := "none"
		if r.recovery >= 0 {
			rec = r.recovery.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.scenario, r.expected, r.executed, r.twice, r.lost, r.retried, r.status, rec)
	}
	tw.Flush()
	var notes []string
	for _, r := range results {
		switch {
		case r.skipped != "":
			notes = append(notes, fmt.Sprintf("  %s: skipped: %s", r.scenario, r.skipped))
		case r.err != nil:
			notes = append(notes, fmt.Sprintf("  %s: %v", r.scenario, r.err))
		default:
			keys := make([]string, 0, len(r.counts))
			for k := range r.counts {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s %d", k, r.counts[k]))
			}
			notes = append(notes, fmt.Sprintf("  %s: killed %s; tx %s: %s%s", r.scenario, r.killed, r.tx, strings.Join(parts, ", "), errSuffixText(r.txError)))
		}
	}
	fmt.Fprintln(w, strings.Join(notes, "\n"))
}
