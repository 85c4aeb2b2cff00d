package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// followed is how a transaction ended, as follow saw it last.
type followed struct {
	tx   transaction
	raw  []byte // the last GET /transactions/:uuid answer
	runs []run
}

// follow polls a transaction and its runs until it finishes, showing its
// progress: one bar per node on a terminal, else one line per run state
// change (on stderr with -o json, so stdout stays JSON). It then prints a
// summary per node and returns an error naming the failed runs unless the
// transaction ended ready. seen holds run states already known (a retried
// transaction's, from before the retry), which are not shown again.
func (a *app) follow(ctx context.Context, id string, seen map[int64]string) error {
	c, err := a.api()
	if err != nil {
		return err
	}
	w := a.out
	if a.jsonOut() {
		w = a.errw
	}
	if seen == nil {
		seen = map[int64]string{}
	}
	r := &renderer{w: w, tty: isTerminal(w), seen: seen}
	var last followed
	failures := 0
	tick := time.NewTicker(a.interval)
	defer tick.Stop()
	for {
		cur, err := a.poll(ctx, c, id)
		switch {
		case err == nil:
			failures = 0
			last = cur
			r.update(cur)
		case ctx.Err() != nil:
			return fmt.Errorf("stopped following; transaction %s goes on: 'anneal tx watch %s' follows it again, 'anneal tx stop %s' stops it", id, id, id)
		case isConnError(err) && failures < 10:
			// The API restarting: keep trying for a while.
			failures++
		default:
			return err
		}
		if err == nil && cur.tx.finished() {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following; transaction %s goes on: 'anneal tx watch %s' follows it again, 'anneal tx stop %s' stops it", id, id, id)
		case <-tick.C:
		}
	}
	if a.jsonOut() {
		if err := a.printRaw(last.raw); err != nil {
			return err
		}
	} else if err := a.printSummary(last); err != nil {
		return err
	}
	if last.tx.Status != "ready" {
		return txFailure(last)
	}
	return nil
}

func (a *app) poll(ctx context.Context, c *Client, id string) (followed, error) {
	var f followed
	raw, err := c.GetJSON(ctx, "/api/v1/transactions/"+esc(id), &f.tx)
	if err != nil {
		return f, err
	}
	f.raw = raw
	if _, err := getAll(ctx, c, "/api/v1/transactions/"+esc(id)+"/runs", &f.runs); err != nil {
		return f, err
	}
	sort.Slice(f.runs, func(i, j int) bool { return f.runs[i].ID < f.runs[j].ID })
	return f, nil
}

func isConnError(err error) bool {
	var ce *ConnError
	return errors.As(err, &ce)
}

// txFailure is the one-line error of a transaction that did not end
// ready, naming its failed runs (task@node, exit code, last error line).
func txFailure(f followed) error {
	var failed []string
	for _, r := range f.runs {
		if r.State == "failed" {
			failed = append(failed, fmt.Sprintf("task %s on node %s (%s)", r.TaskName, r.NodeName, runCause(r)))
		}
	}
	msg := fmt.Sprintf("transaction %s ended %s", f.tx.UUID, f.tx.Status)
	if len(failed) > 0 {
		msg += ": failed " + strings.Join(failed, "; ")
	} else if f.tx.Error != "" {
		msg += ": " + f.tx.Error
	}
	return errors.New(msg)
}

// runCause says why a run failed: its exit code and last line of stderr
// (else stdout), or the error recorded for it.
func runCause(r run) string {
	var parts []string
	if r.ExitCode != nil {
		parts = append(parts, fmt.Sprintf("exit %d", *r.ExitCode))
	}
	if line := lastLine(r.StderrTail); line != "" {
		parts = append(parts, line)
	} else if r.Error != "" {
		parts = append(parts, r.Error)
	} else if line := lastLine(r.StdoutTail); line != "" {
		parts = append(parts, line)
	}
	return strings.Join(parts, ": ")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// nodeProgress counts one node's runs.
type nodeProgress struct {
	name    string
	total   int
	done    int
	counts  map[string]int
	running []string
}

func byNode(runs []run) []*nodeProgress {
	m := map[string]*nodeProgress{}
	var order []string
	for _, r := range runs {
		p := m[r.NodeName]
		if p == nil {
			p = &nodeProgress{name: r.NodeName, counts: map[string]int{}}
			m[r.NodeName] = p
			order = append(order, r.NodeName)
		}
		p.total++
		p.counts[r.State]++
		if runFinal(r.State) {
			p.done++
		}
		if r.State == "running" {
			p.running = append(p.running, r.TaskName)
		}
	}
	sort.Strings(order)
	out := make([]*nodeProgress, len(order))
	for i, n := range order {
		out[i] = m[n]
	}
	return out
}

// renderer draws a followed transaction's progress.
type renderer struct {
	w      io.Writer
	tty    bool
	seen   map[int64]string // run id → last state shown
	status string
	drawn  int // lines of the last bar block (terminal mode)
}

func (r *renderer) update(f followed) {
	if r.tty {
		r.drawBars(f)
		return
	}
	now := time.Now().Format("15:04:05")
	if f.tx.Status != r.status {
		fmt.Fprintf(r.w, "%s  transaction %s %s\n", now, f.tx.UUID, f.tx.Status)
		r.status = f.tx.Status
	}
	for _, run := range f.runs {
		if run.State == r.seen[run.ID] || run.State == "pending" {
			continue
		}
		r.seen[run.ID] = run.State
		line := fmt.Sprintf("%s  %-30s %-24s %s", now, run.NodeName, run.TaskName, run.State)
		if run.State == "failed" {
			line += "  " + runCause(run)
		}
		fmt.Fprintln(r.w, line)
	}
}

func (r *renderer) drawBars(f followed) {
	if r.drawn > 0 {
		fmt.Fprintf(r.w, "\x1b[%dA", r.drawn)
	}
	lines := []string{fmt.Sprintf("transaction %s  %s  %d%% of %d runs", f.tx.UUID, f.tx.Status, f.tx.Progress, f.tx.Total)}
	for _, p := range byNode(f.runs) {
		const width = 24
		filled := 0
		if p.total > 0 {
			filled = p.done * width / p.total
		}
		bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
		what := strings.Join(p.running, ",")
		if p.counts["failed"] > 0 {
			what = fmt.Sprintf("%d failed %s", p.counts["failed"], what)
		}
		lines = append(lines, fmt.Sprintf("  %-30s [%s] %3d/%-3d %s", p.name, bar, p.done, p.total, what))
	}
	for _, l := range lines {
		fmt.Fprintf(r.w, "\x1b[2K%s\n", l)
	}
	r.drawn = len(lines)
}

// printSummary prints one line per node and the outcome.
func (a *app) printSummary(f followed) error {
	fmt.Fprintln(a.out)
	t := a.newTable("NODE", "RUNS", "SUCCEEDED", "FAILED", "BLOCKED", "SKIPPED", "CANCELLED", "PLANNED")
	for _, p := range byNode(f.runs) {
		t.row(p.name, p.total, p.counts["succeeded"], p.counts["failed"], p.counts["blocked"], p.counts["skipped"],
			p.counts["cancelled"], p.counts["planned"])
	}
	if err := t.flush(); err != nil {
		return err
	}
	took := ""
	if f.tx.StartedAt != nil && f.tx.FinishedAt != nil {
		took = " in " + f.tx.FinishedAt.Sub(*f.tx.StartedAt).Round(100*time.Millisecond).String()
	}
	fmt.Fprintf(a.out, "transaction %s %s%s\n", f.tx.UUID, f.tx.Status, took)
	return nil
}

// isTerminal reports whether w is a terminal (bars are drawn only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
