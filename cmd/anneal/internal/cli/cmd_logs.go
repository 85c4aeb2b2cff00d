package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// logEntry is one run's log, as `logs -o json` prints it.
type logEntry struct {
	Run      int64  `json:"run"`
	Node     string `json:"node"`
	Task     string `json:"task"`
	State    string `json:"state"`
	Attempt  int    `json:"attempt"`
	ExitCode *int   `json:"exit_code"`
	// Full is true when Log is the whole log from the node, false when it
	// is only the output tails the API keeps.
	Full bool   `json:"full"`
	Log  string `json:"log"`
}

// logs reads GET /api/v1/transactions/:uuid/runs/:id/log[?follow=1]
// (text/plain, the run's whole log); a server without that endpoint gets
// the stdout and stderr tails of the runs listing instead.
func (a *app) logsCommand() *cobra.Command {
	var nodeRef, taskName string
	var follow bool
	cmd := &cobra.Command{
		Use:         "logs <tx>",
		Short:       "Print the logs of a transaction's runs (-f follows until it ends)",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("uuid", "the transaction argument", "node", "--node"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			l := &logPrinter{a: a, c: c, tx: args[0], node: nodeRef, task: taskName, shown: map[int64]bool{}, full: true}
			ctx := cmd.Context()
			if !follow {
				if err := l.round(ctx, false); err != nil {
					return err
				}
				return l.done()
			}
			tick := time.NewTicker(a.interval)
			defer tick.Stop()
			for {
				var tx transaction
				if _, err := c.GetJSON(ctx, "/api/v1/transactions/"+esc(args[0]), &tx); err != nil {
					return err
				}
				if err := l.round(ctx, true); err != nil {
					return err
				}
				if tx.finished() {
					// One more round: runs that ended with the transaction.
					if err := l.round(ctx, false); err != nil {
						return err
					}
					return l.done()
				}
				select {
				case <-ctx.Done():
					return l.done()
				case <-tick.C:
				}
			}
		},
	}
	cmd.Flags().StringVar(&nodeRef, "node", "", "only this node's runs (name or id)")
	cmd.Flags().StringVar(&taskName, "task", "", "only this task's runs")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing logs as runs finish, until the transaction ends")
	return cmd
}

type logPrinter struct {
	a          *app
	c          *Client
	tx         string
	node, task string
	shown      map[int64]bool
	full       bool // the server has the full-log endpoint (until it says not)
	noted      bool
	entries    []logEntry
	matched    int
}

// round prints the logs of the runs not shown yet; following, it streams
// a running run's log when the server can, and otherwise waits for runs
// to finish.
func (l *logPrinter) round(ctx context.Context, following bool) error {
	var runs []run
	if _, err := getAll(ctx, l.c, "/api/v1/transactions/"+esc(l.tx)+"/runs"+query("node", l.node), &runs); err != nil {
		return err
	}
	sort.Slice(runs, func(i, j int) bool {
		if runs[i].GraphIndex != runs[j].GraphIndex {
			return runs[i].GraphIndex < runs[j].GraphIndex
		}
		if runs[i].NodeName != runs[j].NodeName {
			return runs[i].NodeName < runs[j].NodeName
		}
		return runs[i].Position < runs[j].Position
	})
	for _, r := range runs {
		if l.task != "" && r.TaskName != l.task {
			continue
		}
		if l.shown[r.ID] {
			continue
		}
		if r.State == "pending" || r.State == "planned" || r.State == "blocked" || r.State == "cancelled" || r.State == "skipped" {
			if runFinal(r.State) {
				l.shown[r.ID] = true
			}
			continue // never ran: no log
		}
		if r.State == "running" && (!following || !l.full) {
			continue // later, when it has finished (or now if streaming)
		}
		e, err := l.fetch(ctx, r, following && r.State == "running")
		if err != nil {
			return err
		}
		l.shown[r.ID] = true
		l.matched++
		if l.a.jsonOut() {
			l.entries = append(l.entries, e)
			continue
		}
		fmt.Fprintf(l.a.out, "==> %s on %s (run %d, attempt %d, %s) <==\n", r.TaskName, r.NodeName, r.ID, r.Attempt, r.State)
		if e.Log != "" {
			fmt.Fprint(l.a.out, strings.TrimRight(e.Log, "\n")+"\n")
		}
	}
	return nil
}

// fetch returns a run's log: the whole of it from the node when the
// server has the endpoint, else the tails.
func (l *logPrinter) fetch(ctx context.Context, r run, stream bool) (logEntry, error) {
	e := logEntry{Run: r.ID, Node: r.NodeName, Task: r.TaskName, State: r.State, Attempt: r.Attempt, ExitCode: r.ExitCode}
	if l.full {
		path := fmt.Sprintf("/api/v1/transactions/%s/runs/%d/log", esc(l.tx), r.ID)
		if stream && !l.a.jsonOut() {
			body, err := l.c.Stream(ctx, path+"?follow=1")
			if err == nil {
				fmt.Fprintf(l.a.out, "==> %s on %s (run %d, attempt %d, following) <==\n", r.TaskName, r.NodeName, r.ID, r.Attempt)
				_, err = io.Copy(l.a.out, body)
				body.Close()
				e.Full = true
				return e, err
			}
			if !isRouteMissing(err) {
				return e, err
			}
		} else {
			raw, err := l.c.Do(ctx, "GET", path, nil)
			if err == nil {
				e.Full, e.Log = true, string(raw)
				return e, nil
			}
			if !isRouteMissing(err) {
				return e, err
			}
		}
		l.full = false
	}
	if !l.noted {
		l.a.note("this server has no full-log endpoint (GET /api/v1/transactions/:uuid/runs/:id/log): showing the last 4 KiB of each run's stdout and stderr; the whole log stays on the node under <workdir>/logs/")
		l.noted = true
	}
	var b strings.Builder
	if s := strings.TrimRight(r.StdoutTail, "\n"); s != "" {
		b.WriteString(s + "\n")
	}
	if s := strings.TrimRight(r.StderrTail, "\n"); s != "" {
		for _, line := range strings.Split(s, "\n") {
			b.WriteString("stderr: " + line + "\n")
		}
	}
	if r.Error != "" {
		b.WriteString("error: " + r.Error + "\n")
	}
	e.Log = b.String()
	return e, nil
}

func (l *logPrinter) done() error {
	if l.a.jsonOut() {
		if l.entries == nil {
			l.entries = []logEntry{}
		}
		return l.a.printJSON(l.entries)
	}
	if l.matched == 0 {
		fmt.Fprintln(l.a.errw, "no run with a log matches")
	}
	return nil
}
