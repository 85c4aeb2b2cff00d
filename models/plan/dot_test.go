package plan_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models/plan"
)

func TestDOT(t *testing.T) {
	// A database on the controller, an api after it, and a hypervisor on the
	// compute node that waits for the api across nodes; "b.test" sorts
	// first, so its cluster comes first although its run is planned last.
	tiny, err := plan.Build([]plan.Task{
		{ID: "db", Tags: []string{"controller"}},
		{ID: "api", Tags: []string{"controller"}, Requires: []string{"db"}},
		{ID: "hv", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "api"}}},
	}, []plan.Node{
		{ID: 1, Name: "c.test", Tags: []string{"controller"}},
		{ID: 2, Name: "b.test", Tags: []string{"compute"}},
	}, plan.Options{})
	require.NoError(t, err)

	// Quotes and backslashes in task ids and node names are escaped; a
	// line break stays inside its string.
	odd := &plan.Task{ID: `say "hi" \n`}
	other := &plan.Task{ID: "two\nlines"}
	weird := &plan.Plan{
		Runs: []plan.Run{
			{Index: 0, NodeID: 7, NodeName: `n"1`, Task: odd},
			{Index: 1, NodeID: 7, NodeName: `n"1`, Task: other},
		},
		Edges: []plan.Edge{{From: 0, To: 1}},
	}

	for _, tc := range []struct {
		name string
		plan *plan.Plan
		dot  string
		want string
	}{
		{"empty plan", &plan.Plan{}, "deployment", "digraph \"deployment\" {\n  node [shape=box];\n}\n"},
		{"tiny plan", tiny, "d1/deployment", `digraph "d1/deployment" {
  node [shape=box];
  subgraph "cluster_b.test" {
    label="b.test";
    "hv@b.test" [label="hv"];
  }
  subgraph "cluster_c.test" {
    label="c.test";
    "db@c.test" [label="db"];
    "api@c.test" [label="api"];
  }
  "db@c.test" -> "api@c.test";
  "api@c.test" -> "hv@b.test";
}
`},
		{"escaping", weird, `a "quoted" \ name`, `digraph "a \"quoted\" \\ name" {
  node [shape=box];
  subgraph "cluster_n\"1" {
    label="n\"1";
    "say \"hi\" \\n@n\"1" [label="say \"hi\" \\n"];
    "two\nlines@n\"1" [label="two\nlines"];
  }
  "say \"hi\" \\n@n\"1" -> "two\nlines@n\"1";
}
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := plan.DOT(tc.plan, tc.dot)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, got, plan.DOT(tc.plan, tc.dot), "deterministic")
		})
	}
}
