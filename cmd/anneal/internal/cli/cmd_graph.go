package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) graphCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "graph", Short: "Execute or show a deployment's task graph"}
	cmd.AddCommand(a.graphExecuteCommand(), a.graphShowCommand())
	return cmd
}

func (a *app) graphExecuteCommand() *cobra.Command {
	var (
		dep, typ      string
		nodes, tasks  []string
		dryRun, force bool
		detach        bool
		maxNodes      int
		failThreshold int
	)
	cmd := &cobra.Command{
		Use:   "execute -d <deployment> -t <type>",
		Short: "Run a graph on a deployment's nodes and follow the transaction live",
		Long: `execute starts a transaction running the graph of the given type on the deployment
and follows it until it ends: one line per run state change (bars per node on a terminal),
then a summary per node. It exits 0 when the transaction ends ready, 1 when it fails or stops.`,
		Args: cobra.NoArgs,
		Annotations: fieldFlags("deployment", "--deployment", "graphs", "--type", "graphs[0].type", "--type",
			"graphs[0].nodes", "--nodes", "graphs[0].tasks", "--tasks", "max_nodes_in_flight", "--max-nodes-in-flight",
			"failure_threshold", "--failure-threshold"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			ids, err := a.nodeIDs(ctx, c, nodes)
			if err != nil {
				return err
			}
			body := map[string]any{
				"deployment": dep,
				"graphs":     []graphRequest{{Type: typ, Nodes: ids, Tasks: tasks}},
				"dry_run":    dryRun,
				"force":      force,
			}
			if maxNodes > 0 {
				body["max_nodes_in_flight"] = maxNodes
			}
			if cmd.Flags().Changed("failure-threshold") {
				body["failure_threshold"] = failThreshold
			}
			return a.startAndFollow(ctx, c, "/api/v1/graphs/execute", body, detach, nil)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&dep, "deployment", "d", "", "deployment name or id (required)")
	f.StringVarP(&typ, "type", "t", "", "graph type, e.g. deployment (required)")
	f.StringSliceVar(&nodes, "nodes", nil, "only these nodes (names or ids, comma-separated)")
	f.StringSliceVar(&tasks, "tasks", nil, "only these tasks (comma-separated)")
	f.BoolVar(&dryRun, "dry-run", false, "plan and record the runs as planned, touching no node")
	f.BoolVar(&force, "force", false, "run tasks that would be skipped as unchanged")
	f.BoolVar(&detach, "detach", false, "print the transaction and return without following it")
	f.IntVar(&maxNodes, "max-nodes-in-flight", 0, "at most this many nodes working at once (server default when 0)")
	f.IntVar(&failThreshold, "failure-threshold", 100, "percentage of failed nodes that stops the others")
	_ = cmd.MarkFlagRequired("deployment")
	_ = cmd.MarkFlagRequired("type")
	return cmd
}

// nodeIDs turns node names or ids into ids (the execute API takes ids).
func (a *app) nodeIDs(ctx context.Context, c *Client, refs []string) ([]int64, error) {
	var ids []int64
	for _, ref := range refs {
		ref = strings.TrimSpace(ref)
		if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
			ids = append(ids, id)
			continue
		}
		var n node
		if _, err := c.GetJSON(ctx, "/api/v1/nodes/"+esc(ref), &n); err != nil {
			return nil, fmt.Errorf("--nodes %s: %w", ref, err)
		}
		ids = append(ids, n.ID)
	}
	return ids, nil
}

// startAndFollow posts a request that starts a transaction (202) and
// follows it, or prints it and returns when detached.
func (a *app) startAndFollow(ctx context.Context, c *Client, path string, body any, detach bool, seen map[int64]string) error {
	var acc accepted
	raw, err := c.call(ctx, "POST", path, body, &acc)
	if err != nil {
		return err
	}
	if detach {
		if a.jsonOut() {
			return a.printRaw(raw)
		}
		fmt.Fprintf(a.out, "transaction %s started (workflow %s)\n", acc.TaskUUID, acc.WorkflowID)
		return nil
	}
	progress := a.out
	if a.jsonOut() {
		progress = a.errw
	}
	fmt.Fprintf(progress, "transaction %s started (workflow %s)\n", acc.TaskUUID, acc.WorkflowID)
	return a.follow(ctx, acc.TaskUUID, seen)
}

func (a *app) graphShowCommand() *cobra.Command {
	var dep, typ string
	var dot bool
	cmd := &cobra.Command{
		Use:         "show -d <deployment> -t <type>",
		Short:       "Show a deployment's merged graph: its tasks, or Graphviz DOT with --dot",
		Args:        cobra.NoArgs,
		Annotations: fieldFlags("deployment", "--deployment", "type", "--type", "tasks", "the graph's tasks (a cycle?)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			base := "/api/v1/deployments/" + esc(dep) + "/graphs/" + esc(typ)
			if dot {
				raw, err := c.Do(cmd.Context(), "GET", base+"/graph.gv", nil)
				if err != nil {
					return err
				}
				if a.jsonOut() {
					return a.printJSON(map[string]string{"deployment": dep, "type": typ, "dot": string(raw)})
				}
				_, err = a.out.Write(raw)
				return err
			}
			var g resolvedGraph
			raw, err := c.GetJSON(cmd.Context(), base+"/tasks", &g)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			srcs := make([]string, len(g.Sources))
			for i, s := range g.Sources {
				srcs[i] = s.OwnerKind + " " + s.Name
			}
			fmt.Fprintf(a.out, "graph %s of deployment %s (from %s)\n\n", g.Type, dep, strings.Join(srcs, " + "))
			t := a.newTable("TASK", "TYPE", "TAGS", "REQUIRES", "CROSS_DEPENDS")
			for _, tk := range g.Tasks {
				typ := tk.Type
				if typ == "" {
					typ = "shell"
				}
				var cross []string
				for _, cd := range tk.CrossDepends {
					cross = append(cross, fmt.Sprint(cd["name"]))
				}
				t.row(tk.ID, typ, strings.Join(tk.Tags, ","), strings.Join(tk.Requires, ","), strings.Join(cross, ","))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "deployment name or id (required)")
	cmd.Flags().StringVarP(&typ, "type", "t", "", "graph type (required)")
	cmd.Flags().BoolVar(&dot, "dot", false, "print the graph planned on the nodes in Graphviz DOT")
	_ = cmd.MarkFlagRequired("deployment")
	_ = cmd.MarkFlagRequired("type")
	return cmd
}
