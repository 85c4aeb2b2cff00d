package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/worker/server"
	"github.com/anneal-dev/anneal/workflows/contract"
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
	eager := fs.Bool("eager-activities", false, "start the Temporal dev server with system.enableActivityEagerExecution=true (both sides benefit)")
	agentsPerProcess := fs.Int("agents-per-process", defaultAgentsPerProcess, "simulated agents per agent host process (child processes of the bench, as separate nodes' agents are separate processes); 0 runs them all in the bench process, as the bench did before")
	sharedTransport := fs.Bool("shared-agent-transport", false, "with --agents-per-process 0: all simulated agents share http.DefaultTransport (2 idle connections in all: nearly every agent request dials anew), as the bench did before; by default each agent has its own (daemon.NewHTTPClient), as separate processes would")
	serverMetrics := fs.Int("server-metrics", 0, "serve the Temporal dev server's Prometheus metrics on this port during the bench "+
		"(task_errors_throttled, task_latency_queue and task_attempt by operation show work queued behind a busy workflow)")
	pprofDir := fs.String("pprof", "", "write CPU profiles of the worker+API and of the bench process (the agents with --agents-per-process 0) during the anneal phases into DIR")
	crossNode := fs.Bool("cross-node", true, "give the middle task of each node a dependency on the anchor node's task before it (false: every node's tasks form one chain, to measure what the cross-node wait costs)")
	idle := fs.Duration("idle", 20*time.Second, "measure the site idle for this long before the rounds (0: not): what the agents' background traffic (heartbeats, long polls) costs the worker, Postgres and the agents")
	planOnly := fs.Bool("plan-only", false, "measure planning alone: the bench's deployment and nodes made in Postgres (no Temporal, agents or worker), "+
		"then per round one transaction of the bench graph planned as the PlanGraph activity does; prints the median (with --pprof DIR, a CPU profile)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes < 2 || *tasks < 2 || *rounds < 1 {
		return errors.New("bench needs at least 2 nodes, 2 tasks and 1 round")
	}
	if *planOnly {
		return benchPlan(ctx, state, *nodes, *tasks, *rounds, *crossNode, *pprofDir, log)
	}
	dir := filepath.Join(state, "bench")
	removeOld, err := setAside(dir)
	if err != nil {
		return err
	}
	defer removeOld()
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
	if *eager {
		opts.ExtraArgs = append(opts.ExtraArgs, eagerActivitiesArgs...)
	}
	if *serverMetrics > 0 {
		opts.ExtraArgs = append(opts.ExtraArgs, "--metrics-port", strconv.Itoa(*serverMetrics))
		fmt.Printf("the Temporal server's metrics: http://127.0.0.1:%d/metrics\n", *serverMetrics)
	}
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
	var prof *profiler
	var extra []string
	if *pprofDir != "" {
		if err := os.MkdirAll(*pprofDir, 0o755); err != nil {
			return err
		}
		pport, err := devenv.FreePort()
		if err != nil {
			return err
		}
		pprofAddr := fmt.Sprintf("127.0.0.1:%d", pport)
		extra = []string{"-pprof", pprofAddr}
		prof = &profiler{dir: *pprofDir, workerURL: "http://" + pprofAddr}
	}
	srv, err := startBenchWorker(ctx, bin, dbURL, tmp.Address, apiAddr, env["ANNEAL_TOKEN"], filepath.Join(dir, "worker.log"), append(extra, "-secret-key-file", keyFile))
	if err != nil {
		return err
	}
	defer srv.Stop(10 * time.Second)
	tc, err := client.Dial(client.Options{HostPort: tmp.Address, Logger: nopLogger{}})
	if err != nil {
		return fmt.Errorf("dial Temporal: %w", err)
	}
	defer tc.Close()
	meter := &phaseCPU{temporal: tmp.Pid(), worker: srv.Pid(), bench: os.Getpid()}
	if meter.pg, err = newPGMeter(ctx, dbURL, "anneal_bench"); err != nil {
		fmt.Printf("Postgres CPU not measured: %v\n", err)
	}
	stmts, err := newPGStatements(ctx, dbURL)
	if err != nil {
		fmt.Printf("Postgres statements not ranked (pg_stat_statements needs shared_preload_libraries; "+
			"use a private cluster: ANNEAL_DEV_PG=private, then ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements' and restart it; "+
			"ALTER SYSTEM SET pg_stat_statements.track_planning = on adds each statement's planning): %v\n", err)
	}
	api := newAPIClient(apiURL, env["ANNEAL_TOKEN"])
	if err := ensureEnrollToken(ctx, api, env); err != nil {
		return err
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/releases", "application/yaml", []byte(benchRelease(*tasks, *crossNode)), nil); err != nil {
		return err
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/deployments", "", map[string]string{"name": "bench", "release": "bench"}, nil); err != nil {
		return err
	}

	fmt.Printf("starting %d simulated nodes...\n", *nodes)
	agentCtx, stopAgents := context.WithCancel(ctx)
	var agents sync.WaitGroup
	var hosts []*agentHost
	defer func() {
		stopAgents()
		agents.Wait()
		for _, h := range hosts {
			h.stop()
		}
	}()
	agentsLog := filepath.Join(dir, "agents.log")
	quiet := slog.New(slog.NewTextHandler(mustCreate(agentsLog), &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Agents start in waves (an agent host's, or 25 in this process): a
	// thousand registering at once each start a bootstrap workflow inside
	// their database transaction, which drains the worker's connection
	// pool until requests time out (see the report of issue 14). The bench
	// measures runs, not registration storms.
	wave := *agentsPerProcess
	if wave <= 0 {
		wave = 25
	}
	names := make([]string, *nodes)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%03d.%s", i+1, server.DefaultDomain)
	}
	for start := 0; start < len(names); start += wave {
		batch := names[start:min(start+wave, len(names))]
		if *agentsPerProcess > 0 {
			h, err := startAgentHost(apiURL, env["ANNEAL_ENROLL_TOKEN"], dir, agentsLog, batch)
			if err != nil {
				return err
			}
			hosts = append(hosts, h)
			meter.agentHosts = append(meter.agentHosts, h.pid())
		} else {
			agents.Go(func() { runAgents(agentCtx, apiURL, env["ANNEAL_ENROLL_TOKEN"], dir, quiet, batch, !*sharedTransport) })
		}
		for j, name := range batch {
			roles := []string{"bench"}
			if start+j == 0 {
				roles = append(roles, "anchor")
			}
			if err := waitNode(ctx, api, name, nil); err != nil {
				return err
			}
			if _, err := api.call(ctx, http.MethodPatch, "/api/v1/nodes/"+name, "", map[string]any{"deployment": "bench", "roles": roles}, nil); err != nil {
				return err
			}
		}
	}
	// Let the nodes' bootstrap workflows and the annealer settle.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
	}

	idleLine := ""
	if *idle > 0 {
		fmt.Printf("idle site: %d agents for %s...\n", *nodes, *idle)
		if prof != nil {
			if err := prof.start(0); err != nil { // round 0: the idle site
				return err
			}
		}
		meter.start()
		select {
		case <-ctx.Done():
		case <-time.After(*idle):
		}
		use := meter.stop()
		if prof != nil {
			prof.stop(ctx)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		idleLine = idleCPU(use, *nodes, *idle)
		fmt.Println(idleLine)
	}

	// The machine's speed, measured beside the rounds (the site is idle:
	// no agent runs a command meanwhile).
	refBefore, err := measureMachine(referenceExecs, referenceJSONRounds)
	if err != nil {
		return fmt.Errorf("measure the machine's reference: %w", err)
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
				if stmts != nil {
					if err := stmts.reset(ctx); err != nil {
						return fmt.Errorf("reset pg_stat_statements: %w", err)
					}
				}
				if prof != nil {
					if err := prof.start(round); err != nil {
						return err
					}
				}
				walFrom := walPosition(ctx, dbURL)
				meter.start()
				wall, runs, txID, err := runAnneal(ctx, api, tc)
				r.annealCPU = meter.stop()
				r.wal = walPerRun(walFrom, walPosition(ctx, dbURL), runs)
				if prof != nil {
					r.profile = prof.stop(ctx)
				}
				var failed *failedTx
				if errors.As(err, &failed) && wall > 0 {
					r.warning = "WARNING: " + failed.Error()
					fmt.Printf("round %d: %s\n", round, r.warning)
				} else if err != nil {
					return err
				}
				r.anneal, r.runs = wall, runs
				if stmts != nil {
					if r.statements, err = stmts.report(ctx, filepath.Join(dir, fmt.Sprintf("statements-r%d.txt", round)), 15); err != nil {
						r.statements = "  (pg_stat_statements: " + err.Error() + ")\n"
					}
				}
				r.hist = readHistories(ctx, tc, txID)
				r.hist.nodeQueue = activityQueue(ctx, tc, contract.NodeWorkflowID(txID, names[len(names)-1]))
				fmt.Printf("round %d: anneal: %s; Postgres WAL %s\n", round, r.annealCPU.split(r.runs), r.wal)
			} else {
				fmt.Printf("round %d: bare Temporal, %d child workflows x %d no-op activities...\n", round, *nodes, *tasks)
				meter.start()
				wall, child, err := runBare(ctx, tmp.Address, *nodes, *tasks)
				r.bareCPU = meter.stop()
				if err != nil {
					return err
				}
				r.bare, r.bareQueue = wall, activityQueue(ctx, tc, child)
			}
		}
		fmt.Printf("round %d: anneal %.2fs, bare %.2fs, ratio %.2f\n", round, r.anneal.Seconds(), r.bare.Seconds(), r.ratio())
		results = append(results, r)
	}
	refAfter, err := measureMachine(referenceExecs, referenceJSONRounds)
	if err != nil {
		return fmt.Errorf("measure the machine's reference: %w", err)
	}
	ownLine, ownMs := ownCPUMedian(results) // the rounds in the order they ran
	refLine := referenceLine(refBefore, refAfter, ownMs)
	shareLine := ownPerBareServer(results, *nodes**tasks)
	rss, rssErr := devenv.PeakRSS(srv.Pid())
	maxHist, maxChild := 0, 0
	for _, r := range results {
		maxHist, maxChild = max(maxHist, r.hist.txEvents), max(maxChild, r.hist.maxChild)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].ratio() < results[j].ratio() })
	m := results[len(results)/2]
	bareRuns := *nodes * *tasks
	fmt.Printf(`
anneal bench: %d nodes x %d tasks (chains of shell "true", %s), median of %d rounds
  anneal            %8.2f s  %6.0f task runs/s  (%d runs)
  bare Temporal     %8.2f s  %6.0f activities/s
  ratio anneal/bare %8.2f    (target <= 1.0; rounds: %s)
  planning          %8.3f s  (PlanGraph activity, started to completed; %.3f s queued before it started)
  largest history   %8d events (transaction workflow); its graph and node workflows up to %d events (%s)
  node workflows    %8.1f events each on average (%d node workflows: their Temporal actions, wake-ups included)
  activity queue    scheduled to started: anneal %s; bare %s (next to nothing when eager, %s)
  worker RSS        %8.1f MiB peak%s
  Postgres WAL      %s
  anneal's own CPU per task run: %.2f ms (machine minus Temporal server, / runs); %.2f ms measured in anneal's processes
                                 (%.2f ms counting the whole Postgres cluster: the right figure when it is private, ANNEAL_DEV_PG=private)
                                 %s
                                 %s
  own CPU per run / bare server CPU per activity, same round: %s
  CPU seconds, anneal: %s
  CPU seconds, bare:   %s
`, *nodes, *tasks, crossNodeLabel(*crossNode), len(results), m.anneal.Seconds(), float64(m.runs)/m.anneal.Seconds(), m.runs,
		m.bare.Seconds(), float64(bareRuns)/m.bare.Seconds(), m.ratio(), ratios(results),
		m.hist.planning.Seconds(), m.hist.planningQueued.Seconds(),
		maxHist, maxChild, m.hist.maxChildID,
		float64(m.hist.nodeEvents)/float64(max(m.hist.nodes, 1)), m.hist.nodes,
		m.hist.nodeQueue, m.bareQueue, eagerState(*eager),
		float64(rss)/(1<<20), errSuffix(rssErr), m.wal,
		1000*m.ownCPUPerRun(), 1000*m.annealCPU.ours()/float64(m.runs),
		1000*(m.annealCPU.ours()-m.annealCPU.pgOurs+m.annealCPU.pgCluster)/float64(m.runs),
		ownLine, refLine, shareLine, m.annealCPU.split(m.runs), m.bareCPU.split(bareRuns))
	if idleLine != "" {
		fmt.Println("  " + idleLine)
	}
	for _, r := range results {
		if r.warning != "" {
			fmt.Println("  " + r.warning)
		}
	}
	if m.hist.err != nil {
		fmt.Printf("  (histories: %v)\n", m.hist.err)
	}
	fmt.Print(m.statements, m.profile)
	return nil
}

// startBenchWorker is startWorker with extra flags (the pprof listener).
func startBenchWorker(ctx context.Context, bin, dbURL, temporalAddr, apiAddr, bootstrapToken, logFile string, extra []string) (*devenv.Proc, error) {
	args := append([]string{"-database-url", dbURL, "-temporal", temporalAddr, "-api", apiAddr}, extra...)
	cmd := exec.Command(filepath.Join(bin, "worker"), args...)
	cmd.Env = append(os.Environ(), "ANNEAL_BOOTSTRAP_TOKEN="+bootstrapToken)
	srv, err := devenv.StartProc("worker", cmd, logFile)
	if err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, "http://"+apiAddr, 60*time.Second, srv.Done()); err != nil {
		srv.Stop(5 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, srv.LogTail(20))
	}
	return srv, nil
}

// ours is the CPU of anneal's processes: worker+API, agents, and the
// backends of the bench database.
func (u cpuUse) ours() float64 { return u.worker + u.bench + u.pgOurs }

// split shows where a phase's CPU went, and per run.
func (u cpuUse) split(runs int) string {
	per := func(s float64) string { return fmt.Sprintf("%.1f (%.2f ms/run)", s, 1000*s/float64(runs)) }
	return fmt.Sprintf("machine %.1f = Temporal server %s + worker/API %s + agents/bench process %s [their commands %.2f ms/run] + "+
		"Postgres bench db %s [cluster %.1f, %d backends seen] + other %.1f",
		u.total, per(u.server), per(u.worker), per(u.bench), 1000*u.commands/float64(runs), per(u.pgOurs), u.pgCluster, u.pgBackends,
		u.total-u.server-u.worker-u.bench-u.pgCluster)
}

// idleCPU describes what an idle site cost over d: the background of its
// n agents (heartbeats, long polls and what the API does for them), in
// thousandths of a core, by process, and per agent.
func idleCPU(u cpuUse, n int, d time.Duration) string {
	milli := func(s float64) float64 { return 1000 * s / d.Seconds() }
	ours := u.ours()
	return fmt.Sprintf("idle site: %.0f thousandths of a core for %d agents (worker/API %.0f, agents %.0f, Postgres %.0f; Temporal server %.0f): %.1f µs of CPU per agent per second",
		milli(ours), n, milli(u.worker), milli(u.bench), milli(u.pgOurs), milli(u.server), 1e6*ours/d.Seconds()/float64(n))
}

// roundResult is one round of the benchmark.
type roundResult struct {
	anneal, bare        time.Duration
	runs                int
	annealCPU, bareCPU  cpuUse
	hist                historyStats
	bareQueue           activityWait // the activities of the first bare child
	statements, profile string
	warning             string // the anneal side did not end ready
	wal                 string // what Postgres's log took in per run (walPerRun)
}

func (r roundResult) ratio() float64 { return r.anneal.Seconds() / r.bare.Seconds() }

// ownCPUPerRun is anneal's own CPU per task run in seconds: the machine's
// minus the Temporal server's, over the runs.
func (r roundResult) ownCPUPerRun() float64 {
	return (r.annealCPU.total - r.annealCPU.server) / float64(r.runs)
}

func ratios(rs []roundResult) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%.2f", r.ratio()))
	}
	return strings.Join(parts, " ")
}

// ownCPUMedian says anneal's own CPU per task run (machine minus Temporal
// server) as the median over the rounds rs (in the order they ran), apart
// from the median-ratio round's figures above it, with each round's: the
// targets are medians of each figure over the rounds, and the first
// round, whose nodes have no history yet, costs more than the others. It
// returns the median in ms too (0 when no round ran).
func ownCPUMedian(rs []roundResult) (line string, medianMs float64) {
	own := make([]float64, 0, len(rs))
	var parts []string
	for _, r := range rs {
		if r.runs > 0 {
			own = append(own, 1000*r.ownCPUPerRun())
			parts = append(parts, fmt.Sprintf("%.2f", own[len(own)-1]))
		}
	}
	if len(own) == 0 {
		return "median of rounds: none ran", 0
	}
	medianMs = median(own)
	return fmt.Sprintf("%.2f ms median of the rounds' (machine minus Temporal server; rounds in order: %s)", medianMs, strings.Join(parts, " ")), medianMs
}

// ownPerBareServer says anneal's own CPU per task run (machine minus
// Temporal server) over the bare side's Temporal server CPU per activity
// in the same round, as the median over the rounds rs (in the order they
// ran) with each round's. The machine's speed moves both: in one session
// the same build measured a median of 3.24 ms, then 4.69 ms an hour later,
// while the bare server's CPU per activity went from 13.2 to 15.6 ms. The
// share moved less (0.25 to 0.32 over its medians), so it helps tell a
// change of anneal's cost from the machine's; the targets stay in ms.
func ownPerBareServer(rs []roundResult, bareRuns int) string {
	var shares []float64
	var parts []string
	for _, r := range rs {
		if r.runs == 0 || r.bareCPU.server <= 0 || bareRuns == 0 {
			continue
		}
		share := r.ownCPUPerRun() / (r.bareCPU.server / float64(bareRuns))
		shares = append(shares, share)
		parts = append(parts, fmt.Sprintf("%.3f", share))
	}
	if len(shares) == 0 {
		return "no round ran both sides"
	}
	return fmt.Sprintf("%.3f median of the rounds' (rounds in order: %s)", median(shares), strings.Join(parts, " "))
}

// median returns the median of xs (not empty), which it sorts.
func median(xs []float64) float64 {
	sort.Float64s(xs)
	if len(xs)%2 == 0 {
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return xs[len(xs)/2]
}

// failedTx is a bench transaction that ended in error: the round is
// reported, with this warning.
type failedTx struct {
	status, reason string
	counts         map[string]int
}

func (f *failedTx) Error() string {
	return fmt.Sprintf("the bench transaction ended %s (runs by state: %v): %s", f.status, f.counts, f.reason)
}

// runAnneal executes the bench graph through the API and returns the time
// from the transaction's creation to its end, as Postgres recorded them.
//
// It waits for the transaction's workflow to close (a long poll of
// Temporal), then reads the transaction once: polling its status, which
// counts every run of the transaction (15 ms of Postgres at 20,000 runs),
// would add the bench's own curiosity to anneal's CPU, and the seconds of
// the last poll's wait to the round's.
func runAnneal(ctx context.Context, api *apiClient, tc client.Client) (time.Duration, int, string, error) {
	var started struct {
		TaskUUID   string `json:"task_uuid"`
		WorkflowID string `json:"workflow_id"`
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/graphs/execute", "",
		// force: every round runs every task, although nothing changed.
		map[string]any{"deployment": "bench", "graphs": []map[string]any{{"type": "bench"}}, "force": true}, &started); err != nil {
		return 0, 0, "", err
	}
	// Its result or failure does not matter here: the transaction's row
	// says how it ended (and a workflow that failed leaves it running,
	// which the loop below waits out as before).
	_ = tc.GetWorkflow(ctx, started.WorkflowID, "").Get(ctx, nil)
	for {
		var tx fuel.TransactionStatus
		if _, err := api.call(ctx, http.MethodGet, "/api/v1/transactions/"+started.TaskUUID, "", nil, &tx); err != nil {
			return 0, 0, "", err
		}
		switch tx.Status {
		case models.TxPending, models.TxRunning:
		case models.TxReady:
			return tx.FinishedAt.Sub(tx.CreatedAt), tx.Total, started.TaskUUID, nil
		case models.TxError:
			// Still measured: a run lost to overload (say, a heartbeat
			// timeout before dispatch) is itself a finding, and the
			// figures of a 20-minute round should not be thrown away.
			err := &failedTx{status: tx.Status, reason: tx.Error, counts: tx.Counts}
			if tx.FinishedAt == nil {
				return 0, tx.Total, started.TaskUUID, err
			}
			return tx.FinishedAt.Sub(tx.CreatedAt), tx.Total, started.TaskUUID, err
		default:
			return 0, 0, "", fmt.Errorf("bench transaction ended %s: %s", tx.Status, tx.Error)
		}
		select {
		case <-ctx.Done():
			return 0, 0, "", ctx.Err()
		// The status counts every run of the transaction: polling it often
		// would load the API with the bench's own curiosity. The time
		// measured comes from Postgres, not from this loop.
		case <-time.After(time.Second):
		}
	}
}

// setAside moves the previous bench's directory out of dir's way and
// returns the function, called once the rounds are over, that deletes the
// set-aside directories older than keepOldBench.
//
// Deleting a bench's files costs the benches that follow within minutes:
// on ext4 without a journal (this project's machines), a new inode is
// searched past every inode of its block group deleted in the last one to
// six minutes (the kernel's recently_deleted), and each agent creates a
// log file per run where the old ones were: 0.2 to 0.45 ms of kernel CPU
// per file then, against 0.04 ms on a quiet file system, which is a tenth
// of the own CPU per run the bench measures. Deleted right after the
// rounds, as they were, the previous bench's files slowed every bench run
// after it; kept for a day, they slow none run within that day.
func setAside(dir string) (func(), error) {
	now := time.Now()
	old := fmt.Sprintf("%s.old-%d", dir, now.UnixNano())
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("set the previous bench aside: %w", err)
	}
	return func() {
		olds, _ := filepath.Glob(dir + ".old-*")
		var kept []string
		for _, o := range olds {
			nanos, err := strconv.ParseInt(strings.TrimPrefix(o, dir+".old-"), 10, 64)
			if err == nil && now.Sub(time.Unix(0, nanos)) < keepOldBench {
				kept = append(kept, o)
				continue
			}
			if err := os.RemoveAll(o); err != nil {
				fmt.Fprintf(os.Stderr, "cannot remove a previous bench's files: %v\n", err)
			}
		}
		if len(kept) > 0 {
			fmt.Fprintf(os.Stderr, "kept %d previous benches' files (%s.old-*) until they are %s old: deleting them now would slow the file creation of a bench run within minutes; remove them by hand when no bench follows\n",
				len(kept), dir, keepOldBench)
		}
	}, nil
}

// keepOldBench is how long a previous bench's files stay set aside (see
// setAside): longer than a working session of benches, short enough that
// a day's benches at 1,000 × 20 (about 100 MiB each) do not fill a disk.
const keepOldBench = 24 * time.Hour

// eagerActivitiesArgs turn on eager activity execution on a Temporal dev
// server (off by default in the server): an activity scheduled on the
// workflow's own task queue goes to the worker that scheduled it with the
// reply to its workflow task. The worker must not disable it
// (worker.Options.DisableEagerActivities; server.NewWorker leaves it on).
var eagerActivitiesArgs = []string{"--dynamic-config-value", "system.enableActivityEagerExecution=true"}

// eagerState says whether the bench asked the server for eager activities.
func eagerState(on bool) string {
	if on {
		return "--eager-activities: on"
	}
	return "--eager-activities: off"
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

// crossNodeLabel names the bench graph's cross-node dependencies in its
// summary.
func crossNodeLabel(crossNode bool) string {
	if crossNode {
		return "one cross-node dependency"
	}
	return "no cross-node dependency"
}

// benchRelease is a release whose "bench" graph is a chain of n `true`
// tasks on every node; the middle task also waits for its predecessor on
// the anchor node (one cross-node dependency) unless crossNode is false.
func benchRelease(n int, crossNode bool) string {
	var b strings.Builder
	b.WriteString("name: bench\nversion: \"1\"\nroles_metadata:\n  bench: {tags: [bench]}\n  anchor: {tags: [anchor]}\n")
	b.WriteString("graphs:\n  bench:\n    tasks:\n")
	mid := n / 2
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - id: t%d\n        tags: [bench]\n        parameters: {cmd: \"true\", timeout: 60}\n", i)
		if i > 1 {
			fmt.Fprintf(&b, "        requires: [t%d]\n", i-1)
		}
		if crossNode && i == mid+1 {
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

// runBare runs the bare baseline and returns its time and the id of its
// first child workflow.
func runBare(ctx context.Context, address string, nodes, tasks int) (time.Duration, string, error) {
	c, err := client.Dial(client.Options{HostPort: address, Logger: nopLogger{}})
	if err != nil {
		return 0, "", fmt.Errorf("dial Temporal: %w", err)
	}
	defer c.Close()
	w := worker.New(c, bareQueue, worker.Options{})
	w.RegisterWorkflow(bareParent)
	w.RegisterWorkflow(bareChild)
	w.RegisterActivity(bareNoop)
	if err := w.Start(); err != nil {
		return 0, "", fmt.Errorf("start bare worker: %w", err)
	}
	defer w.Stop()
	start := time.Now()
	id := fmt.Sprintf("bench-bare-%d", start.UnixNano())
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: bareQueue},
		bareParent, nodes, tasks)
	if err != nil {
		return 0, "", fmt.Errorf("start bare workflow: %w", err)
	}
	if err := run.Get(ctx, nil); err != nil {
		return 0, "", fmt.Errorf("bare workflow: %w", err)
	}
	return time.Since(start), id + "/0", nil
}

type nopLogger struct{}

func (nopLogger) Debug(string, ...any) {}
func (nopLogger) Info(string, ...any)  {}
func (nopLogger) Warn(string, ...any)  {}
func (nopLogger) Error(string, ...any) {}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100.0

// machineCPU is the busy CPU seconds of the whole machine (busyTicks of
// /proc/stat's first line).
func machineCPU() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	return busyTicks(line) / clockTicks
}

// busyTicks reads a "cpu" line of /proc/stat: the ticks of user, nice,
// system, irq and softirq time. Not idle or iowait; not steal (time the
// hypervisor gave to another guest: this machine's CPUs did not run then);
// not guest or guest_nice (time this machine's own guests ran, which the
// kernel counts in user and nice already).
func busyTicks(line string) float64 {
	var busy float64
	for i, v := range strings.Fields(line)[1:] {
		var x float64
		fmt.Sscan(v, &x)
		if i < 7 && i != 3 && i != 4 { // 3 idle, 4 iowait, 7 steal, 8 guest, 9 guest_nice
			busy += x
		}
	}
	return busy
}
