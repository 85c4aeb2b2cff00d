package plan

import (
	"cmp"
	"slices"
	"strings"
)

// DOT renders a plan as a Graphviz digraph named name: one cluster per node,
// `subgraph "cluster_<node>"` labelled with the node's name, holding that
// node's runs as nodes `"task@node"` labelled with the task id, then one edge
// per plan edge. Clusters come in node name order, runs in plan order and
// edges as in the plan, so equal plans render to equal text. Every ID and
// label is a double-quoted DOT string (see quoteDOT).
func DOT(p *Plan, name string) string {
	var b strings.Builder
	b.WriteString("digraph ")
	b.WriteString(quoteDOT(name))
	b.WriteString(" {\n")
	b.WriteString("  node [shape=box];\n")

	type cluster struct {
		id   int64
		name string
		runs []int
	}
	var clusters []*cluster
	byNode := map[int64]*cluster{}
	for i, r := range p.Runs {
		c, ok := byNode[r.NodeID]
		if !ok {
			c = &cluster{id: r.NodeID, name: r.NodeName}
			byNode[r.NodeID] = c
			clusters = append(clusters, c)
		}
		c.runs = append(c.runs, i)
	}
	slices.SortStableFunc(clusters, func(x, y *cluster) int {
		return cmp.Or(strings.Compare(x.name, y.name), cmp.Compare(x.id, y.id))
	})
	for _, c := range clusters {
		b.WriteString("  subgraph ")
		b.WriteString(quoteDOT("cluster_" + c.name))
		b.WriteString(" {\n    label=")
		b.WriteString(quoteDOT(c.name))
		b.WriteString(";\n")
		for _, i := range c.runs {
			r := p.Runs[i]
			b.WriteString("    ")
			b.WriteString(quoteDOT(r.Label()))
			b.WriteString(" [label=")
			b.WriteString(quoteDOT(r.Task.ID))
			b.WriteString("];\n")
		}
		b.WriteString("  }\n")
	}
	for _, e := range p.Edges {
		b.WriteString("  ")
		b.WriteString(quoteDOT(p.Runs[e.From].Label()))
		b.WriteString(" -> ")
		b.WriteString(quoteDOT(p.Runs[e.To].Label()))
		b.WriteString(";\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// quoteDOT returns s as a double-quoted DOT string. Backslashes are doubled
// and quotes escaped, so a label shows s literally (Graphviz would otherwise
// read "\n", "\l" or "\N" in a label as escapes) and distinct strings stay
// distinct IDs; line breaks become "\n" and "\r" so that the output keeps
// one statement per line.
func quoteDOT(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
