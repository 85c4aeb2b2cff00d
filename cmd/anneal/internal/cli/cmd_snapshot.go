package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Aliases: []string{"snap"}, Short: "Propose, bind roles in, commit and compare a deployment's snapshots"}
	cmd.AddCommand(a.snapshotProposeCommand(), a.snapshotBindCommand(), a.snapshotCommitCommand(),
		a.snapshotDiffCommand(), a.snapshotShowCommand(), a.snapshotListCommand())
	return cmd
}

func snapshotID(arg string) (string, error) {
	if id, err := strconv.ParseInt(arg, 10, 64); err != nil || id <= 0 {
		return "", usagef("%q is not a snapshot id (a positive number; 'anneal snapshot list -d <deployment>' lists them)", arg)
	}
	return arg, nil
}

func (a *app) snapshotProposeCommand() *cobra.Command {
	return &cobra.Command{
		Use:         "propose <deployment>",
		Short:       "Propose a new snapshot: an editable copy of the deployment's committed one",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("deployment", "the deployment argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var s snapshot
			raw, err := c.call(cmd.Context(), "POST", "/api/v1/deployments/"+esc(args[0])+"/snapshots/propose", nil, &s)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.out, "snapshot %d proposed for deployment %s (%d noderoles)\n", s.ID, args[0], len(s.NodeRoles))
			fmt.Fprintf(a.out, "next: anneal snapshot bind %d --node <node> --role <role>; anneal snapshot commit %d\n", s.ID, s.ID)
			return nil
		},
	}
}

func (a *app) snapshotBindCommand() *cobra.Command {
	var nodeRef, role string
	cmd := &cobra.Command{
		Use:         "bind <snapshot> --node <node> --role <role>",
		Short:       "Bind a role to a node in a proposed snapshot (its parents are found or bound too)",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("node", "--node", "role", "--role", "id", "the snapshot argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := snapshotID(args[0])
			if err != nil {
				return err
			}
			c, err := a.api()
			if err != nil {
				return err
			}
			var nr nodeRole
			raw, err := c.call(cmd.Context(), "POST", "/api/v1/snapshots/"+id+"/noderoles", map[string]string{"node": nodeRef, "role": role}, &nr)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.out, "noderole %d: role %s on node %s in snapshot %s (%s)\n", nr.ID, nr.Role, nr.Node, id, nr.State)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeRef, "node", "", "node name or id (required)")
	cmd.Flags().StringVar(&role, "role", "", "role name or id (required)")
	_ = cmd.MarkFlagRequired("node")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func (a *app) snapshotCommitCommand() *cobra.Command {
	var dep string
	cmd := &cobra.Command{
		Use:         "commit [<snapshot> | -d <deployment>]",
		Short:       "Commit a proposed snapshot (by id, or the deployment's proposed one): the annealer runs it",
		Args:        cobra.MaximumNArgs(1),
		Annotations: fieldFlags("id", "the snapshot argument", "deployment", "--deployment"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var path string
			switch {
			case len(args) == 1 && dep != "":
				return usagef("give a snapshot id or --deployment, not both")
			case len(args) == 1:
				id, err := snapshotID(args[0])
				if err != nil {
					return err
				}
				path = "/api/v1/snapshots/" + id + "/commit"
			case dep != "":
				path = "/api/v1/deployments/" + esc(dep) + "/snapshots/commit"
			default:
				return usagef("give the snapshot id to commit, or --deployment to commit its proposed snapshot")
			}
			c, err := a.api()
			if err != nil {
				return err
			}
			var s snapshot
			raw, err := c.call(cmd.Context(), "POST", path, nil, &s)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.out, "snapshot %d committed (%d noderoles)\n", s.ID, len(s.NodeRoles))
			if len(s.MovedNodes) > 0 {
				fmt.Fprintf(a.out, "moved into the deployment: %s\n", strings.Join(s.MovedNodes, ", "))
			}
			switch dc := s.DeployChanges; {
			case dc["task_uuid"] != nil:
				fmt.Fprintf(a.out, "deploy-changes started: transaction %v (anneal tx watch %v)\n", dc["task_uuid"], dc["task_uuid"])
			case dc["error"] != nil:
				fmt.Fprintf(a.out, "deploy-changes did not start: %v; %v\n", dc["error"], dc["hint"])
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "commit this deployment's proposed snapshot")
	return cmd
}

// snapshotDiff is GET /api/v1/snapshots/:id/diff → {"added": [...],
// "removed": [...], "changed": [...]} against the deployment's committed
// snapshot (items are noderoles: node, role, and for changed, what).
func (a *app) snapshotDiffCommand() *cobra.Command {
	return &cobra.Command{
		Use:         "diff <snapshot>",
		Short:       "Show what a snapshot changes against the committed one",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("id", "the snapshot argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := snapshotID(args[0])
			if err != nil {
				return err
			}
			c, err := a.api()
			if err != nil {
				return err
			}
			var d struct {
				Added   []map[string]any `json:"added"`
				Removed []map[string]any `json:"removed"`
				Changed []map[string]any `json:"changed"`
			}
			raw, err := c.GetJSON(cmd.Context(), "/api/v1/snapshots/"+id+"/diff", &d)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			for _, g := range []struct {
				mark  string
				items []map[string]any
			}{{"+", d.Added}, {"-", d.Removed}, {"~", d.Changed}} {
				for _, it := range g.items {
					line := fmt.Sprintf("%s %v on %v", g.mark, it["role"], it["node"])
					if what, ok := it["changes"].([]any); ok {
						line += " (" + describeChanges(what) + ")"
					}
					fmt.Fprintln(a.out, line)
				}
			}
			if len(d.Added)+len(d.Removed)+len(d.Changed) == 0 {
				fmt.Fprintln(a.out, "no changes")
			}
			return nil
		},
	}
}

func (a *app) snapshotShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:         "show <snapshot>",
		Short:       "Show a snapshot and its noderoles",
		Args:        cobra.ExactArgs(1),
		Annotations: fieldFlags("id", "the snapshot argument"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := snapshotID(args[0])
			if err != nil {
				return err
			}
			c, err := a.api()
			if err != nil {
				return err
			}
			var s snapshot
			raw, err := c.GetJSON(cmd.Context(), "/api/v1/snapshots/"+id, &s)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.out, "snapshot %d (%s)\n\n", s.ID, s.State)
			t := a.newTable("NODEROLE", "ROLE", "NODE", "STATE", "RUNS")
			for _, nr := range s.NodeRoles {
				t.row(nr.ID, nr.Role, nr.Node, nr.State, nr.RunCount)
			}
			return t.flush()
		},
	}
}

func (a *app) snapshotListCommand() *cobra.Command {
	var dep string
	cmd := &cobra.Command{
		Use:   "list -d <deployment>",
		Short: "List a deployment's snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.api()
			if err != nil {
				return err
			}
			var snaps []snapshot
			raw, err := getAll(cmd.Context(), c, "/api/v1/deployments/"+esc(dep)+"/snapshots", &snaps)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printRaw(raw)
			}
			t := a.newTable("SNAPSHOT", "STATE", "CREATED", "COMMITTED")
			for _, s := range snaps {
				t.row(s.ID, s.State, s.CreatedAt.Local().Format("2006-01-02 15:04:05"), when(s.CommittedAt))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVarP(&dep, "deployment", "d", "", "deployment name or id (required)")
	_ = cmd.MarkFlagRequired("deployment")
	return cmd
}

// describeChanges prints a changed binding's changes as
// "user_data.port: 5432 → 6543; parents: [db@n1] → [db@n2]".
func describeChanges(changes []any) string {
	parts := make([]string, 0, len(changes))
	for _, c := range changes {
		m, ok := c.(map[string]any)
		if !ok {
			parts = append(parts, fmt.Sprint(c))
			continue
		}
		field := fmt.Sprint(m["field"])
		if p, ok := m["path"].(string); ok && p != "" {
			field += "." + p
		}
		val := func(k string) string {
			v, ok := m[k]
			if !ok {
				return "(none)"
			}
			b, err := json.Marshal(v)
			if err != nil {
				return fmt.Sprint(v)
			}
			return string(b)
		}
		parts = append(parts, fmt.Sprintf("%s: %s → %s", field, val("old"), val("new")))
	}
	return strings.Join(parts, "; ")
}
