package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/worker/server"
)

// bench runs a generated graph (a chain of `true` tasks per node, and one
// cross-node dependency) on simulated nodes, then the same number of no-op
// activities as a bare Temporal workflow with one child per node, on the same
// Temporal server, and prints both and their ratio.
func bench(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	nodes := fs.Int("nodes", 100, "simulated nodes")
	tasks := fs.Int("tasks", 10, "tasks per node (a chain)")
	rounds := fs.Int("rounds", 5, "rounds of anneal and bare, alternating which goes first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes < 2 || *tasks < 2 || *rounds < 1 {
		return errors.New("bench needs at least 2 nodes, 2 tasks and 1 round")
	}
	dir := filepath.Join(state, "bench")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pg, err := devenv.EnsurePostgres(ctx, state, log)
	if err != nil {
		return err
	}
	defer pg.Close()
	dbURL, err := pg.ResetDatabase(ctx, "anneal_bench")
	if err != nil {
		return err
	}
	opts := devenv.DefaultTemporalOptions(dir)
	opts.Port, opts.UIPort = 0, devenv.HeadlessUI
	tmp, err := devenv.EnsureTemporal(ctx, opts, log)
	if err != nil {
		return err
	}
	defer tmp.Close()
	bin, err := buildBinaries(ctx, root, state)
	if err != nil {
		return err
	}
	// A fresh database: a new admin token (the server's bootstrap token)
	// and an enroll token made through the API.
	env := map[string]string{"ANNEAL_TOKEN": models.NewSecret("ann_")}
	port, err := devenv.FreePort()
	if err != nil {
		return err
	}
	apiAddr := fmt.Sprintf("127.0.0.1:%d", port)
	apiURL := "http://" + apiAddr
	keyFile, err := ensureSecretKey(state)
	if err != nil {
		return err
	}
	srv, err := startWorker(ctx, bin, dbURL, tmp.Address, "", apiAddr, env["ANNEAL_TOKEN"], keyFile, filepath.Join(dir, "worker.log"))
	if err != nil {
		return err
	}
	defer srv.Stop(10 * time.Second)
	api := newAPIClient(apiURL, env["ANNEAL_TOKEN"])
	if err := ensureEnrollToken(ctx, api, env); err != nil {
		return err
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/releases", "application/yaml", []byte(benchRelease(*tasks)), nil); err != nil {
		return err
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/deployments", "", map[string]string{"name": "bench", "release": "bench"}, nil); err != nil {
		return err
	}

	fmt.Printf("starting %d simulated nodes...\n", *nodes)
	agentCtx, stopAgents := context.WithCancel(ctx)
	var agents sync.WaitGroup
	defer func() { stopAgents(); agents.Wait() }()
	quiet := slog.New(slog.NewTextHandler(mustCreate(filepath.Join(dir, "agents.log")), &slog.HandlerOptions{Level: slog.LevelWarn}))
	names := make([]string, *nodes)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%03d.%s", i+1, server.DefaultDomain)
		cfg := daemon.Config{APIURL: apiURL, Name: names[i], EnrollToken: env["ANNEAL_ENROLL_TOKEN"],
			WorkDir: filepath.Join(dir, "nodes", names[i]), Logger: quiet.With("node", names[i])}
		agents.Add(1)
		go func() { defer agents.Done(); _ = daemon.Run(agentCtx, cfg) }()
	}
	for i, name := range names {
		roles := []string{"bench"}
		if i == 0 {
			roles = append(roles, "anchor")
		}
		if err := waitNode(ctx, api, name, nil); err != nil {
			return err
		}
		if _, err := api.call(ctx, http.MethodPatch, "/api/v1/nodes/"+name, "", map[string]any{"deployment": "bench", "roles": roles}, nil); err != nil {
			return err
		}
	}

	// Rounds alternate which side goes first, and the median ratio is
	// reported: this machine is noisy and the SQLite file grows as it goes.
	var results []roundResult
	for round := 1; round <= *rounds; round++ {
		var r roundResult
		annealFirst := round%2 == 1
		for _, side := range []bool{annealFirst, !annealFirst} {
			if side {
				fmt.Printf("round %d: anneal, %d nodes x %d tasks...\n", round, *nodes, *tasks)
				cpu := startCPU(tmp.Pid())
				wall, runs, err := runAnneal(ctx, api)
				if err != nil {
					return err
				}
				r.anneal, r.runs, r.annealCPU = wall, runs, cpu.stop()
			} else {
				fmt.Printf("round %d: bare Temporal, %d child workflows x %d no-op activities...\n", round, *nodes, *tasks)
				cpu := startCPU(tmp.Pid())
				wall, err := runBare(ctx, tmp.Address, *nodes, *tasks)
				if err != nil {
					return err
				}
				r.bare, r.bareCPU = wall, cpu.stop()
			}
		}
		fmt.Printf("round %d: anneal %.2fs, bare %.2fs, ratio %.2f\n", round, r.anneal.Seconds(), r.bare.Seconds(), r.ratio())
		results = append(results, r)
	}
	rss, rssErr := devenv.PeakRSS(srv.Pid())
	sort.Slice(results, func(i, j int) bool { return results[i].ratio() < results[j].ratio() })
	m := results[len(results)/2]
	fmt.Printf(`
anneal bench: %d nodes x %d tasks (chains of shell "true", one cross-node dependency), median of %d rounds
  anneal        %8.2fs  %6.0f task runs/s  (%d runs)
  worker RSS    %8.1f MiB peak%s
  bare Temporal %8.2fs  %6.0f activities/s
  ratio anneal / bare: %.2f   (target <= 1.5; rounds: %s)
  CPU seconds, anneal: Temporal server %.1f of %.1f on the machine
  CPU seconds, bare:   Temporal server %.1f of %.1f on the machine
`, *nodes, *tasks, len(results), m.anneal.Seconds(), float64(m.runs)/m.anneal.Seconds(), m.runs,
		float64(rss)/(1<<20), errSuffix(rssErr),
		m.bare.Seconds(), float64(*nodes**tasks)/m.bare.Seconds(), m.ratio(), ratios(results),
		m.annealCPU.server, m.annealCPU.total, m.bareCPU.server, m.bareCPU.total)
	return nil
}

// roundResult is one round of the benchmark.
type roundResult struct {
	anneal, bare       time.Duration
	runs               int
	annealCPU, bareCPU cpuUse
}

func (r roundResult) ratio() float64 { return r.anneal.Seconds() / r.bare.Seconds() }

func ratios(rs []roundResult) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%.2f", r.ratio()))
	}
	return strings.Join(parts, " ")
}

// runAnneal executes the bench graph through the API and returns the time
// from the transaction's creation to its end, as Postgres recorded them.
func runAnneal(ctx context.Context, api *apiClient) (time.Duration, int, error) {
	var started struct {
		TaskUUID string `json:"task_uuid"`
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/graphs/execute", "",
		// force: every round runs every task, although nothing changed.
		map[string]any{"deployment": "bench", "graphs": []map[string]any{{"type": "bench"}}, "force": true}, &started); err != nil {
		return 0, 0, err
	}
	for {
		var tx fuel.TransactionStatus
		if _, err := api.call(ctx, http.MethodGet, "/api/v1/transactions/"+started.TaskUUID, "", nil, &tx); err != nil {
			return 0, 0, err
		}
		switch tx.Status {
		case models.TxPending, models.TxRunning:
		case models.TxReady:
			return tx.FinishedAt.Sub(tx.CreatedAt), tx.Total, nil
		default:
			return 0, 0, fmt.Errorf("bench transaction ended %s: %s", tx.Status, tx.Error)
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func errSuffix(err error) string {
	if err != nil {
		return " (unavailable: " + err.Error() + ")"
	}
	return ""
}

func mustCreate(path string) *os.File {
	f, err := os.Create(path)
	if err != nil {
		return os.Stderr
	}
	return f
}

// benchRelease is a release whose "bench" graph is a chain of n `true`
// tasks on every node; the middle task also waits for its predecessor on
// the anchor node (one cross-node dependency).
func benchRelease(n int) string {
	var b strings.Builder
	b.WriteString("name: bench\nversion: \"1\"\nroles_metadata:\n  bench: {tags: [bench]}\n  anchor: {tags: [anchor]}\n")
	b.WriteString("graphs:\n  bench:\n    tasks:\n")
	mid := n / 2
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - id: t%d\n        tags: [bench]\n        parameters: {cmd: \"true\", timeout: 60}\n", i)
		if i > 1 {
			fmt.Fprintf(&b, "        requires: [t%d]\n", i-1)
		}
		if i == mid+1 {
			fmt.Fprintf(&b, "        cross_depends: [{name: t%d, tags: [anchor]}]\n", mid)
		}
	}
	return b.String()
}

// The bare Temporal baseline: a parent starts one child per node; each
// child runs its activities one after another.
const bareQueue = "bench-bare"

func bareParent(ctx workflow.Context, nodes, tasks int) error {
	var futures []workflow.Future
	for i := 0; i < nodes; i++ {
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: fmt.Sprintf("%s/%d", workflow.GetInfo(ctx).WorkflowExecution.ID, i)})
		futures = append(futures, workflow.ExecuteChildWorkflow(cctx, bareChild, tasks))
	}
	for _, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func bareChild(ctx workflow.Context, tasks int) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	for i := 0; i < tasks; i++ {
		if err := workflow.ExecuteActivity(ctx, bareNoop).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func bareNoop(context.Context) error { return nil }

func runBare(ctx context.Context, address string, nodes, tasks int) (time.Duration, error) {
	c, err := client.Dial(client.Options{HostPort: address, Logger: nopLogger{}})
	if err != nil {
		return 0, fmt.Errorf("dial Temporal: %w", err)
	}
	defer c.Close()
	w := worker.New(c, bareQueue, worker.Options{})
	w.RegisterWorkflow(bareParent)
	w.RegisterWorkflow(bareChild)
	w.RegisterActivity(bareNoop)
	if err := w.Start(); err != nil {
		return 0, fmt.Errorf("start bare worker: %w", err)
	}
	defer w.Stop()
	start := time.Now()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: fmt.Sprintf("bench-bare-%d", start.UnixNano()), TaskQueue: bareQueue},
		bareParent, nodes, tasks)
	if err != nil {
		return 0, fmt.Errorf("start bare workflow: %w", err)
	}
	if err := run.Get(ctx, nil); err != nil {
		return 0, fmt.Errorf("bare workflow: %w", err)
	}
	return time.Since(start), nil
}

type nopLogger struct{}

func (nopLogger) Debug(string, ...any) {}
func (nopLogger) Info(string, ...any)  {}
func (nopLogger) Warn(string, ...any)  {}
func (nopLogger) Error(string, ...any) {}

// cpuMeter measures CPU seconds used by one process and by the machine.
type cpuMeter struct {
	pid           int
	server, total float64
}

type cpuUse struct{ server, total float64 }

func startCPU(pid int) *cpuMeter {
	return &cpuMeter{pid: pid, server: procCPU(pid), total: machineCPU()}
}

func (m *cpuMeter) stop() cpuUse {
	return cpuUse{server: procCPU(m.pid) - m.server, total: machineCPU() - m.total}
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100.0

// procCPU is utime+stime of a process in seconds (0 if unreadable).
func procCPU(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	rest := string(raw[strings.LastIndexByte(string(raw), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / clockTicks
}

// machineCPU is the busy (non-idle) CPU seconds of the whole machine.
func machineCPU() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		var x float64
		fmt.Sscan(v, &x)
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return busy / clockTicks
}
