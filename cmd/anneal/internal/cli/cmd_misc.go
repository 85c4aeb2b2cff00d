package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) scenarioCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "scenario", Short: "List and run scenarios (graphs chained in one transaction)"}
	cmd.AddCommand(a.scenarioRunCommand(), a.scenarioListCommand())
	return cmd
}

func (a *app) scenarioRunCommand() *cobra.Command {
	var dep string
	var dryRun, force, detach bool
	cmd := &cobra.Command{
		Use:         "run <name> -d <deployment>",
		Short:       "Run a scenario on a deployment and follow its transaction",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("deployment", "--deployment", "name", "the scenario name argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			body := map[string]any{"deployment": dep, "dry_run": dryRun, "force": force}
			return a.startAndFollow(cmd.Context(), c, "/api/v1/scenarios/"+esc(args[0])+"/execute", body, detach, nil)
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "deployment name or id (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "plan only")
	cmd.Flags().BoolVar(&force, "force", false, "run tasks that would be skipped as unchanged")
	cmd.Flags().BoolVar(&detach, "detach", false, "print the transaction and return without following it")
	_ = cmd.MarkFlagRequired("deployment")
	return cmd
}

func (a *app) scenarioListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List scenarios",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var list []struct {
				Name        string `json:"name"`
				Description string `json:"description"`
				Builtin     bool   `json:"builtin"`
				Acts        []struct {
					GraphType string `json:"graph_type"`
				} `json:"scenario"`
			}
			raw, err := getAll(cmd.Context(), c, "/api/v1/scenarios", &list)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			t := a.newTable("NAME", "ACTS", "BUILTIN", "DESCRIPTION")
			for _, s := range list {
				types := make([]graphRequest, len(s.Acts))
				for i, act := range s.Acts {
					types[i].Type = act.GraphType
				}
				t.row(s.Name, graphTypes(types), yesNo(s.Builtin), truncate(s.Description, 60))
			}
			return t.flush()
		},
	}
}

// Tokens: POST /api/v1/tokens {"name", "scope"} → {"id", "name", "scope",
// "token", "created_at"} (the token is shown once); GET /api/v1/tokens →
// {"items": [{"id", "name", "scope", "created_at", "last_used_at"}]};
// DELETE /api/v1/tokens/:id → 204.
func (a *app) tokenCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke API tokens"}
	var name, scope string
	create := &cobra.Command{
		Use:         "create --name <name> [--scope admin|operator|viewer|enroll]",
		Short:       "Create a token (it is shown once)",
		Args:        cobra.NoArgs,
		Annotations: fieldFlags("name", "--name", "scope", "--scope"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var tok apiToken
			raw, err := c.call(cmd.Context(), "POST", "/api/v1/tokens", map[string]string{"name": name, "scope": scope}, &tok)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.out, "token %v %q (scope %s): %s\n", tok.ID, tok.Name, tok.Scope, tok.Token)
			fmt.Fprintln(a.errw, "note: the token is shown only this once; store it now")
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "what the token is for (required)")
	create.Flags().StringVar(&scope, "scope", "admin", "admin (everything), operator (execute, stop, retry, bind, commit, tag), viewer (read only) or enroll (agents registering)")
	_ = create.MarkFlagRequired("name")
	list := &cobra.Command{
		Use:   "list",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var page struct {
				Items []apiToken `json:"items"`
			}
			raw, err := c.GetJSON(cmd.Context(), "/api/v1/tokens", &page)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			t := a.newTable("ID", "NAME", "SCOPE", "CREATED", "LAST USED")
			for _, tok := range page.Items {
				t.row(tok.ID, tok.Name, tok.Scope, when(tok.CreatedAt), when(tok.LastUsedAt))
			}
			return t.flush()
		},
	}
	revoke := &cobra.Command{
		Use:         "revoke <id>",
		Short:       "Revoke a token",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("id", "the token id argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			if _, err := c.Do(cmd.Context(), "DELETE", "/api/v1/tokens/"+esc(args[0]), nil); err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(map[string]any{"revoked": args[0]})
			}
			fmt.Fprintf(a.out, "token %s revoked\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// when formats an optional time.
func when(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05")
}
