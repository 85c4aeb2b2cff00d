package main

// Measurements of `dev bench`: CPU per process group, Postgres backends,
// Temporal history lengths, planning time, CPU profiles and query stats.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// procTimes is utime+stime (self) and cutime+cstime (reaped children) of a
// process in seconds, and its parent's pid; ok is false if unreadable.
func procTimes(pid int) (self, children float64, ppid int, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 || i+2 > len(raw) {
		return 0, 0, 0, false
	}
	// Fields after the command name, which is in parentheses: state ppid ...
	f := strings.Fields(string(raw[i+2:]))
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	ppid, _ = strconv.Atoi(f[1])
	return (num(f[11]) + num(f[12])) / clockTicks, (num(f[13]) + num(f[14])) / clockTicks, ppid, true
}

// pgMeter follows the CPU of a local Postgres cluster: all of it (postmaster,
// its live children and those it reaped, which is exact) and the backends
// of one database (sampled, so a backend living less than a sample period
// is missed; churn is reported as the number of backends seen).
type pgMeter struct {
	postmaster int
	database   string
	titles     map[int]bool // pid: a backend of our database (only the sampler touches it)

	mu      sync.Mutex
	base    map[int]float64 // CPU of our backends when the phase started (0 for new ones)
	last    map[int]float64 // CPU of our backends at the last sample
	cluster float64         // cluster CPU when the phase started
	stopC   chan struct{}
	done    chan struct{}
}

// newPGMeter finds the postmaster serving dbURL (through a backend's parent
// pid); it returns nil with the reason if the server is not a local process.
func newPGMeter(ctx context.Context, dbURL, database string) (*pgMeter, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, "select pg_backend_pid()").Scan(&backend); err != nil {
		return nil, err
	}
	_, _, ppid, ok := procTimes(backend)
	if !ok {
		return nil, fmt.Errorf("backend %d is not a local process", backend)
	}
	if _, _, _, ok := procTimes(ppid); !ok {
		return nil, fmt.Errorf("postmaster %d not readable", ppid)
	}
	return &pgMeter{postmaster: ppid, database: database}, nil
}

// scan returns the CPU of every child of the postmaster and whether it is
// a backend of our database (its process title names the database). It
// reads the postmaster's children list, not all of /proc: the sampler's
// own CPU counts as the agents'.
func (m *pgMeter) scan() (cpu map[int]float64, ours map[int]bool) {
	cpu, ours = map[int]float64{}, map[int]bool{}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", m.postmaster, m.postmaster))
	if err != nil {
		return cpu, ours
	}
	if m.titles == nil {
		m.titles = map[int]bool{}
	}
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		self, _, _, ok := procTimes(pid)
		if !ok {
			continue
		}
		cpu[pid] = self
		mine, known := m.titles[pid]
		if !known {
			title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			mine = strings.Contains(string(title), " "+m.database+" ")
			m.titles[pid] = mine
		}
		ours[pid] = mine
	}
	return cpu, ours
}

func (m *pgMeter) clusterCPU(cpu map[int]float64) float64 {
	self, children, _, _ := procTimes(m.postmaster)
	total := self + children
	for _, v := range cpu {
		total += v
	}
	return total
}

// start begins a phase: it samples every 250 ms until stop.
func (m *pgMeter) start() {
	cpu, ours := m.scan()
	m.mu.Lock()
	m.base, m.last = map[int]float64{}, map[int]float64{}
	for pid, v := range cpu {
		if ours[pid] {
			m.base[pid], m.last[pid] = v, v
		}
	}
	m.cluster = m.clusterCPU(cpu)
	m.stopC, m.done = make(chan struct{}), make(chan struct{})
	m.mu.Unlock()
	go func() {
		defer close(m.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.stopC:
				return
			case <-t.C:
				m.sample()
			}
		}
	}()
}

func (m *pgMeter) sample() (cpu map[int]float64) {
	cpu, ours := m.scan()
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, v := range cpu {
		if !ours[pid] {
			continue
		}
		if _, seen := m.base[pid]; !seen {
			m.base[pid] = 0 // born during the phase
		}
		m.last[pid] = v
	}
	return cpu
}

// stop ends the phase and returns the CPU seconds of our database's
// backends, of the whole cluster, and how many of our backends were seen.
func (m *pgMeter) stop() (ours, cluster float64, backends int) {
	close(m.stopC)
	<-m.done
	cpu := m.sample()
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, v := range m.last {
		ours += v - m.base[pid]
	}
	return ours, m.clusterCPU(cpu) - m.cluster, len(m.last)
}

// phaseCPU measures one phase of a round: the machine, the Temporal
// server, the worker (and API), this process (the simulated agents, or the
// bare worker) and Postgres.
type phaseCPU struct {
	temporal, worker, bench int
	// agentHosts are the processes running the simulated agents, when
	// not this one (see defaultAgentsPerProcess).
	agentHosts []int
	pg         *pgMeter
	t0         map[string]float64
}

// cpuUse is the CPU seconds a phase cost, by process.
type cpuUse struct {
	total, server, worker, bench, pgOurs, pgCluster float64
	// commands is the part of bench that the agents' commands (their
	// child processes) used.
	commands   float64
	pgBackends int
}

func (p *phaseCPU) read() map[string]float64 {
	self := func(pid int) float64 { v, _, _, _ := procTimes(pid); return v }
	// The agents run their tasks (`true`) as child processes of this one,
	// or of their agent hosts.
	bench, tasks, _, _ := procTimes(p.bench)
	for _, pid := range p.agentHosts {
		host, hostTasks, _, _ := procTimes(pid)
		bench, tasks = bench+host, tasks+hostTasks
	}
	return map[string]float64{
		"total": machineCPU(), "server": self(p.temporal), "worker": self(p.worker), "bench": bench + tasks, "commands": tasks,
	}
}

func (p *phaseCPU) start() {
	if p.pg != nil {
		p.pg.start()
	}
	p.t0 = p.read()
}

func (p *phaseCPU) stop() cpuUse {
	t1 := p.read()
	u := cpuUse{total: t1["total"] - p.t0["total"], server: t1["server"] - p.t0["server"],
		worker: t1["worker"] - p.t0["worker"], bench: t1["bench"] - p.t0["bench"], commands: t1["commands"] - p.t0["commands"]}
	if p.pg != nil {
		u.pgOurs, u.pgCluster, u.pgBackends = p.pg.stop()
	}
	return u
}

// historyStats are read from Temporal after an anneal round.
type historyStats struct {
	txEvents       int           // events in the transaction workflow's history
	maxChild       int           // longest history of a graph or node workflow
	maxChildID     string        // its workflow id
	children       int           // graph workflows started
	nodes          int           // node workflows described
	nodeEvents     int           // events in their histories
	planning       time.Duration // PlanGraph: started to completed
	planningQueued time.Duration // PlanGraph: scheduled to started
	nodeQueue      activityWait  // the activities of one node workflow
	err            error
}

// activityWait is how long a workflow's activities waited between being
// scheduled and started: a trip through matching to a poller, or next to
// nothing when the server hands them to the worker with the workflow
// task's reply (eager execution, `dev bench --eager-activities`).
type activityWait struct {
	workflowID string
	median     time.Duration
	n          int
	err        error
}

func (w activityWait) String() string {
	if w.err != nil {
		return "unknown (" + w.err.Error() + ")"
	}
	return fmt.Sprintf("%.1f ms (median of %d, %s)", float64(w.median.Microseconds())/1000, w.n, w.workflowID)
}

// activityQueue reads a workflow's history for its activities' waits.
func activityQueue(ctx context.Context, c client.Client, wfID string) activityWait {
	w := activityWait{workflowID: wfID}
	it := c.GetWorkflowHistory(ctx, wfID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	scheduled := map[int64]time.Time{}
	var waits []time.Duration
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			w.err = fmt.Errorf("history of %s: %w", wfID, err)
			return w
		}
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			scheduled[ev.GetEventId()] = ev.GetEventTime().AsTime()
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			if at, ok := scheduled[ev.GetActivityTaskStartedEventAttributes().GetScheduledEventId()]; ok {
				waits = append(waits, ev.GetEventTime().AsTime().Sub(at))
			}
		}
	}
	if len(waits) == 0 {
		w.err = fmt.Errorf("no activity started in %s", wfID)
		return w
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	w.median, w.n = waits[len(waits)/2], len(waits)
	return w
}

// readHistories walks the transaction's history (counting its events,
// timing PlanGraph, collecting its node workflows) and describes every
// node workflow for its history length.
func readHistories(ctx context.Context, c client.Client, txID string) historyStats {
	var hs historyStats
	wfID := contract.TransactionWorkflowID(txID)
	it := c.GetWorkflowHistory(ctx, wfID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	plans := map[int64]bool{} // scheduled event ids of PlanGraph
	var started, scheduled time.Time
	var kids []string
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			hs.err = fmt.Errorf("history of %s: %w", wfID, err)
			return hs
		}
		hs.txEvents++
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == contract.PlanGraphActivity {
				plans[ev.GetEventId()] = true
				scheduled = ev.GetEventTime().AsTime()
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			if plans[ev.GetActivityTaskStartedEventAttributes().GetScheduledEventId()] {
				started = ev.GetEventTime().AsTime()
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			if plans[ev.GetActivityTaskCompletedEventAttributes().GetScheduledEventId()] {
				// Several graphs: the planning times add up.
				hs.planning += ev.GetEventTime().AsTime().Sub(started)
				hs.planningQueued += started.Sub(scheduled)
			}
		case enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
			kids = append(kids, ev.GetChildWorkflowExecutionStartedEventAttributes().GetWorkflowExecution().GetWorkflowId())
		}
	}
	hs.children = len(kids)
	// The graph workflows' children are the node workflows.
	var nodes []string
	for _, id := range kids {
		it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		n := 0
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				hs.err = fmt.Errorf("history of %s: %w", id, err)
				return hs
			}
			n++
			if ev.GetEventType() == enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED {
				nodes = append(nodes, ev.GetChildWorkflowExecutionStartedEventAttributes().GetWorkflowExecution().GetWorkflowId())
			}
		}
		if n > hs.maxChild {
			hs.maxChild, hs.maxChildID = n, id
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan string)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				d, err := c.DescribeWorkflowExecution(ctx, id, "")
				mu.Lock()
				if err != nil && hs.err == nil {
					hs.err = fmt.Errorf("describe %s: %w", id, err)
				}
				n := int(d.GetWorkflowExecutionInfo().GetHistoryLength())
				if err == nil {
					hs.nodes++
					hs.nodeEvents += n
				}
				if n > hs.maxChild {
					hs.maxChild, hs.maxChildID = n, id
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range nodes {
		work <- id
	}
	close(work)
	wg.Wait()
	return hs
}

// profiler captures CPU profiles during the anneal phase: the worker's
// through its -pprof listener (consecutive 10 s profiles, merged at the
// end) and this process's (the agents) with runtime/pprof.
type profiler struct {
	dir, workerURL string
	round          int
	stopC          chan struct{}
	done           chan struct{}
	parts          []string
	self           *os.File
}

func (p *profiler) start(round int) error {
	p.round, p.parts = round, nil
	p.stopC, p.done = make(chan struct{}), make(chan struct{})
	f, err := os.Create(filepath.Join(p.dir, fmt.Sprintf("agents-cpu-r%d.pb.gz", round)))
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("profile the bench process: %w", err)
	}
	p.self = f
	go func() {
		defer close(p.done)
		for k := 0; ; k++ {
			select {
			case <-p.stopC:
				return
			default:
			}
			part := filepath.Join(p.dir, fmt.Sprintf("worker-cpu-r%d-%03d.pb.gz", round, k))
			// The last one runs to its end after the phase: at most 10 s idle.
			if err := fetchTo(p.workerURL+"/debug/pprof/profile?seconds=10", part); err != nil {
				fmt.Fprintf(os.Stderr, "bench: worker profile: %v\n", err)
				return
			}
			p.parts = append(p.parts, part)
		}
	}()
	return nil
}

// stop ends the capture, merges the worker's parts into
// worker-cpu-r<N>.pb.gz, saves its heap profile and goroutine count, and
// returns the top of the merged CPU profiles (worker, then agents).
func (p *profiler) stop(ctx context.Context) string {
	pprof.StopCPUProfile()
	p.self.Close()
	heap := filepath.Join(p.dir, fmt.Sprintf("worker-heap-r%d.pb.gz", p.round))
	_ = fetchTo(p.workerURL+"/debug/pprof/heap", heap)
	_ = fetchTo(p.workerURL+"/debug/pprof/goroutine?debug=1", filepath.Join(p.dir, fmt.Sprintf("worker-goroutines-r%d.txt", p.round)))
	close(p.stopC)
	<-p.done
	merged := filepath.Join(p.dir, fmt.Sprintf("worker-cpu-r%d.pb.gz", p.round))
	var b strings.Builder
	if len(p.parts) > 0 {
		args := append([]string{"tool", "pprof", "-proto"}, p.parts...)
		out, err := os.Create(merged)
		if err == nil {
			cmd := exec.CommandContext(ctx, "go", args...)
			cmd.Stdout = out
			err = cmd.Run()
			out.Close()
		}
		if err != nil {
			fmt.Fprintf(&b, "  (merging worker profiles: %v)\n", err)
		} else {
			for _, f := range p.parts {
				os.Remove(f)
			}
		}
	}
	for _, prof := range []struct{ name, file string }{{"worker+API", merged}, {"agents (bench process)", p.self.Name()}} {
		for _, mode := range []string{"-top", "-top -cum"} {
			args := append([]string{"tool", "pprof"}, strings.Fields(mode)...)
			args = append(args, "-nodecount=25", prof.file)
			out, err := exec.CommandContext(ctx, "go", args...).Output()
			suffix := strings.ReplaceAll(strings.TrimPrefix(mode, "-"), " -", "-")
			_ = os.WriteFile(strings.TrimSuffix(prof.file, ".pb.gz")+"-"+suffix+".txt", out, 0o644)
			if err == nil && mode == "-top" {
				fmt.Fprintf(&b, "  CPU profile of %s (%s), flat top 12:\n", prof.name, prof.file)
				lines := strings.Split(string(out), "\n")
				for i, l := range lines {
					if strings.Contains(l, "flat%") {
						end := min(len(lines), i+13)
						for _, x := range lines[max(i-1, 0):end] {
							b.WriteString("    " + x + "\n")
						}
						break
					}
				}
			}
		}
	}
	return b.String()
}

func fetchTo(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// pgStatements wraps pg_stat_statements when the server preloads it.
type pgStatements struct {
	dbURL    string
	sessions int64 // pg_stat_database.sessions at the last reset
}

// sessionsSQL counts the connections ever opened to the bench database.
const sessionsSQL = "select sessions from pg_stat_database where datname = current_database()"

// newPGStatements creates the extension in the bench database; it fails
// (and the bench says why) unless shared_preload_libraries has it.
func newPGStatements(ctx context.Context, dbURL string) (*pgStatements, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "create extension if not exists pg_stat_statements"); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "select 1 from pg_stat_statements limit 1"); err != nil {
		return nil, err
	}
	return &pgStatements{dbURL: dbURL}, nil
}

func (s *pgStatements) reset(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err = conn.Exec(ctx, "select pg_stat_statements_reset()"); err != nil {
		return err
	}
	// The statistics collector lags by up to a second; good enough here.
	return conn.QueryRow(ctx, sessionsSQL).Scan(&s.sessions)
}

// report writes the statements of the bench database ranked by total
// execution time to path and returns the first n as text (rankStatements).
func (s *pgStatements) report(ctx context.Context, path string, n int) (string, error) {
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var sessions int64
	if err := conn.QueryRow(ctx, sessionsSQL).Scan(&sessions); err != nil {
		return "", err
	}
	rows, err := conn.Query(ctx, `select calls, total_exec_time, plans, total_plan_time, rows, query from pg_stat_statements
		where dbid = (select oid from pg_database where datname = current_database())`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var all []statementStats
	for rows.Next() {
		var st statementStats
		if err := rows.Scan(&st.calls, &st.ms, &st.plans, &st.planMS, &st.rows, &st.query); err != nil {
			return "", err
		}
		all = append(all, st)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	short, full := rankStatements(all, sessions-s.sessions, n, path)
	return short, os.WriteFile(path, []byte(full), 0o644)
}

// statementStats is one statement's line of pg_stat_statements.
type statementStats struct {
	calls, plans, rows int64
	// ms and planMS are its total execution and planning times.
	ms, planMS float64
	query      string
}

// rankStatements ranks statements by total execution time: short heads
// the first n (their text cut), full lists them all. Their planning is
// shown beside, and counted, when the server tracks it
// (pg_stat_statements.track_planning = on; off by default, as it costs a
// little at each planning): a statement planned anew at each call spends
// CPU that its execution time does not show.
func rankStatements(all []statementStats, sessions int64, n int, path string) (short, full string) {
	all = slices.Clone(all)
	sort.SliceStable(all, func(i, j int) bool { return all[i].ms > all[j].ms })
	var sum, planSum float64
	var calls int64
	for _, st := range all {
		sum += st.ms
		planSum += st.planMS
		calls += st.calls
	}
	var f, sh strings.Builder
	planned := ""
	if planSum > 0 {
		planned = fmt.Sprintf(" and %.1f s planning", planSum/1000)
	}
	fmt.Fprintf(&sh, "  Postgres: %d connections opened during the phase; statements: %d calls, %.1f s executing%s; top %d by total execution time (all in %s):\n",
		sessions, calls, sum/1000, planned, n, path)
	for i, st := range all {
		q := strings.Join(strings.Fields(st.query), " ")
		fmt.Fprintf(&f, "%8d calls %9.1f ms %6.1f%% %6d plans %9.1f ms planning %9d rows  %s\n",
			st.calls, st.ms, 100*st.ms/max(sum, 1e-9), st.plans, st.planMS, st.rows, q)
		if i >= n {
			continue
		}
		if len(q) > 150 {
			q = q[:150] + "..."
		}
		plan := ""
		if planSum > 0 {
			plan = fmt.Sprintf(" (%d plans, %.1f ms)", st.plans, st.planMS)
		}
		fmt.Fprintf(&sh, "    %8d calls %9.1f ms %5.1f%%%s  %s\n", st.calls, st.ms, 100*st.ms/max(sum, 1e-9), plan, q)
	}
	return sh.String(), f.String()
}

// walPosition reads where Postgres's write-ahead log inserts next. The
// difference over the anneal phase is what the phase wrote to the log,
// the whole cluster's (with ANNEAL_DEV_PG=private, the bench's alone):
// unlike CPU seconds it does not move with the machine's speed, so a
// change that writes less per run shows in any hour (a checkpoint inside
// the phase adds full-page images to it). 0 when unknown.
func walPosition(ctx context.Context, dbURL string) int64 {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0
	}
	defer conn.Close(ctx)
	var pos int64
	if err := conn.QueryRow(ctx, "select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&pos); err != nil {
		return 0
	}
	return pos
}

// walPerRun says what the anneal phase wrote to the log per run.
func walPerRun(from, to int64, runs int) string {
	if from == 0 || to == 0 || runs == 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.0f bytes per run (%.1f MB in all; the whole cluster)", float64(to-from)/float64(runs), float64(to-from)/1e6)
}
