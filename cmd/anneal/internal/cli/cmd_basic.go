package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) loginCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "login",
		Short: "Check a URL and token against the server and store them in the config file",
		Long: `login stores the API URL and token in $XDG_CONFIG_HOME/anneal/config.json (mode 0600),
after checking them against the server. Give them with --url/--token or ANNEAL_URL/ANNEAL_TOKEN;
without a token, login reads it from the first line of stdin.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := ConfigPath()
			if err != nil {
				return err
			}
			file, err := LoadConfig(path)
			if err != nil {
				file = Config{} // login replaces a broken file
			}
			c := resolve(file, a.getenv, a.flagURL, a.flagToken)
			if c.URL == "" {
				return usagef("give the API URL with --url or %s", EnvURL)
			}
			if a.flagToken == "" && a.getenv(EnvToken) == "" {
				fmt.Fprintln(a.errw, "token (read from stdin):")
				tok, err := a.readLine()
				if err != nil {
					return err
				}
				c.Token = tok
			}
			if c.Token == "" {
				return usagef("no token given: pass --token, set %s, or type it on stdin", EnvToken)
			}
			a.client = &Client{BaseURL: c.URL, Token: c.Token, HTTP: newHTTPClient()}
			var deps []deployment
			if _, err := getAll(cmd.Context(), a.client, "/api/v1/deployments", &deps); err != nil {
				return fmt.Errorf("the server refused the login, nothing was stored: %w", err)
			}
			if err := SaveConfig(path, c); err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(map[string]any{"config": path, "url": c.URL, "deployments": len(deps)})
			}
			fmt.Fprintf(a.out, "logged in to %s (%d deployments); saved to %s\n", c.URL, len(deps), path)
			return nil
		},
	}
}

func (a *app) nodesCommand() *cobra.Command {
	var dep string
	cmd := &cobra.Command{
		Use:         "nodes",
		Short:       "List nodes",
		Args:        cobra.NoArgs,
		Annotations: fieldFlags("deployment", "--deployment"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var nodes []node
			raw, err := getAll(cmd.Context(), c, "/api/v1/nodes"+query("deployment", dep), &nodes)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			deps, err := a.deploymentNames(cmd)
			if err != nil {
				return err
			}
			t := a.newTable("ID", "NAME", "DEPLOYMENT", "STATUS", "PROGRESS", "ALIVE", "AVAILABLE", "ROLES", "ADDRESS")
			for _, n := range nodes {
				t.row(n.ID, n.Name, deps[n.DeploymentID], n.ComputedStatus, fmt.Sprintf("%d%%", n.Progress),
					yesNo(n.Alive), yesNo(n.Available), strings.Join(n.Roles, ","), n.Address)
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "only the nodes of this deployment (name or id)")
	return cmd
}

// deploymentNames maps deployment ids to names.
func (a *app) deploymentNames(cmd *cobra.Command) (map[int64]string, error) {
	c, err := a.api()
	if err != nil {
		return nil, err
	}
	var deps []deployment
	if _, err := getAll(cmd.Context(), c, "/api/v1/deployments", &deps); err != nil {
		return nil, err
	}
	out := map[int64]string{}
	for _, d := range deps {
		out[d.ID] = d.Name
	}
	return out, nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// statusView is what `anneal status` shows, and its -o json rendering.
type statusView struct {
	Deployment   string                `json:"deployment,omitempty"`
	Nodes        []node                `json:"nodes"`
	NodeRoles    map[string][]nodeRole `json:"noderoles_by_state"`
	Transactions []transaction         `json:"transactions"`
	// TransactionsUnknown is set when the server cannot list transactions.
	TransactionsUnknown bool `json:"transactions_unknown,omitempty"`
}

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:         "status [deployment]",
		Short:       "Show nodes, noderoles by state and running transactions (like juju status)",
		Args:        cobra.MaximumNArgs(1),
		Annotations: fieldFlags("deployment", "the deployment argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var v statusView
			if len(args) == 1 {
				var d deployment
				if _, err := c.GetJSON(ctx, "/api/v1/deployments/"+esc(args[0]), &d); err != nil {
					return err
				}
				v.Deployment = d.Name
			}
			if _, err := getAll(ctx, c, "/api/v1/nodes"+query("deployment", v.Deployment), &v.Nodes); err != nil {
				return err
			}
			deps, err := a.deploymentNames(cmd)
			if err != nil {
				return err
			}
			// Noderoles of the committed snapshots: of the deployment
			// asked for, else of every deployment.
			names := []string{v.Deployment}
			if v.Deployment == "" {
				names = names[:0]
				for _, n := range deps {
					names = append(names, n)
				}
				sort.Strings(names)
			}
			v.NodeRoles = map[string][]nodeRole{}
			for _, name := range names {
				var nrs []nodeRole
				if _, err := getAll(ctx, c, "/api/v1/noderoles"+query("deployment", name), &nrs); err != nil {
					return err
				}
				for _, nr := range nrs {
					v.NodeRoles[nr.State] = append(v.NodeRoles[nr.State], nr)
				}
			}
			var page txPage
			_, err = c.GetJSON(ctx, "/api/v1/transactions"+query("deployment", v.Deployment, "status", "running", "limit", "20"), &page)
			switch {
			case isRouteMissing(err):
				v.TransactionsUnknown = true
				a.note("this server cannot list transactions (no GET /api/v1/transactions): running transactions are not shown")
			case err != nil:
				return err
			default:
				v.Transactions = page.Items
			}
			if v.Transactions == nil {
				v.Transactions = []transaction{}
			}
			if a.jsonOut() {
				return a.printJSON(v)
			}
			return a.printStatus(v, deps)
		},
	}
}

func (a *app) printStatus(v statusView, deps map[int64]string) error {
	w := a.out
	if v.Deployment != "" {
		fmt.Fprintf(w, "Deployment  %s\n\n", v.Deployment)
	}
	t := a.newTable("Node", "Deployment", "Status", "Progress", "Alive", "Available", "Roles", "Address")
	for _, n := range v.Nodes {
		status := n.ComputedStatus
		if n.ErrorType != nil && *n.ErrorType != "" {
			status += " (" + *n.ErrorType + ")"
		}
		t.row(n.Name, deps[n.DeploymentID], status, fmt.Sprintf("%d%%", n.Progress), yesNo(n.Alive), yesNo(n.Available),
			strings.Join(n.Roles, ","), n.Address)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	t = a.newTable("NodeRole state", "Count", "Noderoles")
	for _, state := range []string{"error", "transition", "todo", "blocked", "proposed", "active"} {
		nrs := v.NodeRoles[state]
		if len(nrs) == 0 {
			continue
		}
		list := make([]string, len(nrs))
		for i, nr := range nrs {
			list[i] = nr.Role + "@" + nr.Node
		}
		t.row(state, len(nrs), abbreviate(list, 6))
	}
	if len(v.NodeRoles) == 0 {
		t.row("(none)", 0, "")
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if v.TransactionsUnknown {
		fmt.Fprintln(w, "Running transactions: unknown (the server cannot list them)")
		return nil
	}
	if len(v.Transactions) == 0 {
		fmt.Fprintln(w, "Running transactions: none")
		return nil
	}
	t = a.newTable("Transaction", "Deployment", "Graphs", "Status", "Progress", "Started")
	for _, tx := range v.Transactions {
		t.row(tx.UUID, tx.Deployment, graphTypes(tx.Graphs), tx.Status, fmt.Sprintf("%d%% of %d", tx.Progress, tx.Total), when(tx.StartedAt))
	}
	return t.flush()
}

// abbreviate joins the first n items and counts the rest.
func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, " ")
	}
	return fmt.Sprintf("%s ... (+%d)", strings.Join(items[:n], " "), len(items)-n)
}

func graphTypes(gs []graphRequest) string {
	types := make([]string, len(gs))
	for i, g := range gs {
		types[i] = g.Type
	}
	return strings.Join(types, ",")
}
