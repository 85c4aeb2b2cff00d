package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) txCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "tx", Aliases: []string{"transaction", "transactions"}, Short: "List, show, follow, stop and retry transactions"}
	cmd.AddCommand(a.txListCommand(), a.txShowCommand(), a.txWatchCommand(), a.txStopCommand(), a.txRetryCommand())
	return cmd
}

// txList is GET /api/v1/transactions?deployment=&status=&limit=&cursor=
// → {"items": [transaction status...], "next_cursor": "..."}.
func (a *app) txListCommand() *cobra.Command {
	var dep, status, cursor string
	var limit int
	cmd := &cobra.Command{
		Use:         "list",
		Short:       "List transactions, newest first",
		Args:        cobra.NoArgs,
		Annotations: fieldFlags("deployment", "--deployment", "status", "--status", "limit", "--limit", "cursor", "--cursor"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var page txPage
			raw, err := c.GetJSON(cmd.Context(), "/api/v1/transactions"+query("deployment", dep, "status", status,
				"limit", strconv.Itoa(limit), "cursor", cursor), &page)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			t := a.newTable("UUID", "DEPLOYMENT", "GRAPHS", "STATUS", "PROGRESS", "CREATED", "ERROR")
			for _, tx := range page.Items {
				t.row(tx.UUID, tx.Deployment, graphTypes(tx.Graphs), tx.Status, fmt.Sprintf("%d%%", tx.Progress),
					tx.CreatedAt.Local().Format(time.DateTime), truncate(tx.Error, 60))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(a.out, "more: anneal tx list --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "only this deployment's")
	cmd.Flags().StringVar(&status, "status", "", "only in this status (pending, running, ready, error, stopped)")
	cmd.Flags().IntVar(&limit, "limit", 20, "at most this many")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue after a previous page")
	return cmd
}

func (a *app) txShowCommand() *cobra.Command {
	var nodeRef, state string
	cmd := &cobra.Command{
		Use:         "show <uuid>",
		Short:       "Show a transaction and its runs",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("uuid", "the transaction uuid argument", "node", "--node", "state", "--state"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var tx transaction
			rawTx, err := c.GetJSON(cmd.Context(), "/api/v1/transactions/"+esc(args[0]), &tx)
			if err != nil {
				return err
			}
			var runs []run
			rawRuns, err := getAll(cmd.Context(), c, "/api/v1/transactions/"+esc(args[0])+"/runs"+query("node", nodeRef, "state", state), &runs)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(map[string]any{"transaction": rawJSON(rawTx), "runs": rawJSON(rawRuns)})
			}
			fmt.Fprintf(a.out, "Transaction  %s\nDeployment   %s\nGraphs       %s\nStatus       %s\nProgress     %d%% of %d runs\nWorkflow     %s\n",
				tx.UUID, tx.Deployment, graphTypes(tx.Graphs), tx.Status, tx.Progress, tx.Total, tx.WorkflowID)
			if tx.DryRun {
				fmt.Fprintln(a.out, "Dry run      yes")
			}
			if tx.Error != "" {
				fmt.Fprintf(a.out, "Error        %s\n", tx.Error)
			}
			fmt.Fprintln(a.out)
			t := a.newTable("RUN", "NODE", "GRAPH", "TASK", "STATE", "ATTEMPT", "EXIT", "TOOK", "CAUSE")
			for _, r := range runs {
				exit := ""
				if r.ExitCode != nil {
					exit = strconv.Itoa(*r.ExitCode)
				}
				cause := ""
				if r.State == "failed" {
					cause = truncate(runCause(r), 70)
				}
				t.row(r.ID, r.NodeName, r.GraphType, r.TaskName, r.State, r.Attempt, exit, took(r.StartedAt, r.FinishedAt), cause)
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&nodeRef, "node", "", "only the runs of this node (name or id)")
	cmd.Flags().StringVar(&state, "state", "", "only the runs in this state")
	return cmd
}

func (a *app) txWatchCommand() *cobra.Command {
	return &cobra.Command{
		Use:         "watch <uuid>",
		Short:       "Follow a transaction until it ends (exit 1 unless it ends ready)",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("uuid", "the transaction uuid argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.follow(cmd.Context(), args[0], nil)
		},
	}
}

func (a *app) txStopCommand() *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:         "stop <uuid>",
		Short:       "Stop a transaction: running tasks finish, the rest are cancelled",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("uuid", "the transaction uuid argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			raw, err := c.call(cmd.Context(), "POST", "/api/v1/transactions/"+esc(args[0])+"/stop", nil, nil)
			if err != nil {
				return err
			}
			if !wait {
				if a.jsonOut() {
					return a.printRaw(raw)
				}
				fmt.Fprintf(a.out, "transaction %s stopping\n", args[0])
				return nil
			}
			err = a.follow(cmd.Context(), args[0], nil)
			var tx transaction
			if _, gerr := c.GetJSON(cmd.Context(), "/api/v1/transactions/"+esc(args[0]), &tx); gerr == nil && tx.Status == "stopped" {
				return nil // what was asked for
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow it until it has stopped")
	return cmd
}

func (a *app) txRetryCommand() *cobra.Command {
	var detach bool
	cmd := &cobra.Command{
		Use:         "retry <uuid>",
		Short:       "Run a failed or stopped transaction again from what did not succeed, and follow it",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("uuid", "the transaction uuid argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			// The runs as they ended, so that following shows only what
			// the retry changes.
			var before []run
			if _, err := getAll(cmd.Context(), c, "/api/v1/transactions/"+esc(args[0])+"/runs", &before); err != nil {
				return err
			}
			seen := map[int64]string{}
			for _, r := range before {
				seen[r.ID] = r.State
			}
			return a.startAndFollow(cmd.Context(), c, "/api/v1/transactions/"+esc(args[0])+"/retry", nil, detach, seen)
		},
	}
	cmd.Flags().BoolVar(&detach, "detach", false, "return once it started")
	return cmd
}

type rawJSON []byte

// MarshalJSON passes the API's JSON through.
func (r rawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

func took(start, end *time.Time) string {
	if start == nil || end == nil {
		return ""
	}
	return end.Sub(*start).Round(10 * time.Millisecond).String()
}

func truncate(s string, n int) string {
	s = oneLine(s)
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
