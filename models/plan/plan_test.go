package plan_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models/plan"
)

// runLabels lists the plan's runs as "task@node" in plan order.
func runLabels(p *plan.Plan) []string {
	out := make([]string, len(p.Runs))
	for i, r := range p.Runs {
		out[i] = r.Label()
	}
	return out
}

// edgeLabels lists the plan's edges as "from -> to".
func edgeLabels(p *plan.Plan) []string {
	out := make([]string, len(p.Edges))
	for i, e := range p.Edges {
		out[i] = p.Runs[e.From].Label() + " -> " + p.Runs[e.To].Label()
	}
	return out
}

// seedTasks are the tasks of the seed's resolver example, plus a rabbitmq
// task and the seed's keystone task (legacy groups overridden by tags).
func seedTasks() []plan.Task {
	return []plan.Task{
		{ID: "mysql", Tags: []string{"controller", "mysql"}},
		{ID: "haproxy", Role: plan.StringList{"controller"}},
		{ID: "globals", Role: plan.StringList{"/.*/"}},
		{ID: "rabbitmq", Tags: []string{"rabbitmq"}},
		{ID: "keystone", Type: "puppet", Groups: plan.StringList{"controller"}, Tags: []string{"keystone"}},
	}
}

func TestAppliesToSeedExamples(t *testing.T) {
	tests := []struct {
		name     string
		nodeTags []string
		want     []string // ids of seedTasks that apply
	}{
		{
			name:     "node-1 with role controller and tag mysql",
			nodeTags: plan.NodeTags([]string{"controller"}, []string{"mysql"}),
			want:     []string{"mysql", "haproxy", "globals"},
		},
		{
			name:     "controller with all its tags",
			nodeTags: plan.NodeTags([]string{"controller"}, []string{"controller", "mysql", "neutron", "keystone", "rabbitmq"}),
			want:     []string{"mysql", "haproxy", "globals", "rabbitmq", "keystone"},
		},
		{
			name:     "controller with every tag removed but rabbitmq",
			nodeTags: []string{"rabbitmq"},
			want:     []string{"globals", "rabbitmq"},
		},
		{
			name:     "node without tags gets nothing, not even /.*/",
			nodeTags: nil,
			want:     nil,
		},
		{
			name:     "instance tags only: /.*/ does not reach them",
			nodeTags: []string{"mysql:1"},
			want:     nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, task := range seedTasks() {
				if plan.AppliesTo(task, tc.nodeTags) {
					got = append(got, task.ID)
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestResolves(t *testing.T) {
	// The seed's instance-tag example.
	node1 := []string{"corosync:1", "mysql:2"}
	node2 := []string{"corosync:2", "mysql:1"}
	node3 := []string{"corosync:2", "mysql:2"}
	tests := []struct {
		name     string
		selector []string
		nodeTags []string
		want     bool
	}{
		{"plain tag present", []string{"mysql"}, []string{"controller", "mysql"}, true},
		{"plain tag absent", []string{"neutron"}, []string{"controller", "mysql"}, false},
		{"any entry is enough", []string{"neutron", "mysql"}, []string{"mysql"}, true},
		{"regex matches a plain tag", []string{"/contr.*/"}, []string{"controller"}, true},
		{"regex is anchored at the start", []string{"/troller/"}, []string{"controller"}, false},
		{"regex is a prefix match like re.match", []string{"/contr/"}, []string{"controller"}, true},
		{"regex with $ matches the whole tag", []string{"/contr$/"}, []string{"controller"}, false},
		{"regex alternation is anchored as a whole", []string{"/x|roller/"}, []string{"controller"}, false},
		{"regex does not match instance tag", []string{"/corosync.*/"}, node1, false},
		{"regex .* does not match instance tag", []string{"/.*/"}, node1, false},
		{"plain instance tag matches exactly", []string{"corosync:1"}, node1, true},
		{"plain instance tag other instance", []string{"corosync:1"}, node2, false},
		{"mysql:2 on node-1", []string{"mysql:2"}, node1, true},
		{"mysql:2 on node-2", []string{"mysql:2"}, node2, false},
		{"mysql:2 on node-3", []string{"mysql:2"}, node3, true},
		{"regex still matches the plain tag next to instances", []string{"/corosync.*/"}, []string{"corosync", "corosync:1"}, true},
		{"star matches any node", []string{"*"}, nil, true},
		{"empty selector matches nothing", nil, []string{"controller"}, false},
		{"invalid regex matches nothing", []string{"/(/"}, []string{"("}, false},
		{"lone slash is a plain tag", []string{"/"}, []string{"/"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, plan.Resolves(tc.selector, tc.nodeTags))
		})
	}
}

func TestSelectorFallback(t *testing.T) {
	tests := []struct {
		name string
		task plan.Task
		want []string
	}{
		{"tags win", plan.Task{Tags: []string{"a"}, Role: plan.StringList{"b"}, Groups: plan.StringList{"c"}}, []string{"a"}},
		{"role when no tags", plan.Task{Role: plan.StringList{"b"}, Groups: plan.StringList{"c"}}, []string{"b"}},
		{"groups when no tags nor role", plan.Task{Groups: plan.StringList{"c"}}, []string{"c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.task.Selector())
			assert.True(t, plan.AppliesTo(tc.task, tc.want))
		})
	}
}

func TestDecodeTask(t *testing.T) {
	want := plan.Task{
		ID:           "haproxy",
		Type:         "puppet",
		Role:         plan.StringList{"controller"},
		Groups:       plan.StringList{"primary-controller", "controller"},
		Requires:     []string{"globals"},
		CrossDepends: []plan.CrossDep{{Name: "/^keystone/", Role: plan.StringList{"controller"}}},
		Parameters:   plan.Parameters{Cmd: "true", Timeout: 60, Retries: 2},
	}
	tests := []struct {
		name   string
		decode func([]byte, any) error
		doc    string
	}{
		{"yaml lists and snake_case", yaml.Unmarshal, `
id: haproxy
type: puppet
role: [controller]
groups: [primary-controller, controller]
requires: [globals]
cross_depends:
  - name: /^keystone/
    role: [controller]
parameters: {cmd: "true", timeout: 60, retries: 2}
`},
		{"json single strings", json.Unmarshal, `{"id":"haproxy","type":"puppet","role":"controller",
"groups":["primary-controller","controller"],"requires":["globals"],
"cross_depends":[{"name":"/^keystone/","role":"controller"}],
"parameters":{"cmd":"true","timeout":60,"retries":2}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got plan.Task
			require.NoError(t, tc.decode([]byte(tc.doc), &got))
			assert.Equal(t, want, got)
		})
	}

	t.Run("bad role type", func(t *testing.T) {
		var got plan.Task
		assert.Error(t, json.Unmarshal([]byte(`{"id":"x","role":{"a":1}}`), &got))
		assert.Error(t, yaml.Unmarshal([]byte("id: x\nrole: {a: 1}\n"), &got))
	})
}

// graphCase is one Build scenario.
type graphCase struct {
	name     string
	tasks    []plan.Task
	nodes    []plan.Node
	opts     plan.Options
	runs     []string // expected run order
	edges    []string // expected edges
	warnings int
}

func TestBuild(t *testing.T) {
	one := []plan.Node{{ID: 1, Name: "n1", Tags: []string{"x"}}}
	cluster := []plan.Node{
		{ID: 3, Name: "compute-2", Tags: []string{"compute"}},
		{ID: 1, Name: "db-1", Tags: plan.NodeTags([]string{"controller"}, []string{"mysql"})},
		{ID: 2, Name: "compute-1", Tags: []string{"compute"}},
	}
	tests := []graphCase{
		{
			name: "same-node requires orders runs against input order",
			tasks: []plan.Task{
				{ID: "c", Tags: []string{"x"}, Requires: []string{"b"}},
				{ID: "b", Tags: []string{"x"}, Requires: []string{"a"}},
				{ID: "a", Tags: []string{"x"}},
			},
			nodes: one,
			runs:  []string{"a@n1", "b@n1", "c@n1"},
			edges: []string{"a@n1 -> b@n1", "b@n1 -> c@n1"},
		},
		{
			name: "requires stays on the node: no edge to another node's run",
			tasks: []plan.Task{
				{ID: "db", Tags: []string{"mysql"}},
				{ID: "app", Tags: []string{"compute", "mysql"}, Requires: []string{"db"}},
			},
			nodes: cluster,
			runs:  []string{"app@compute-1", "app@compute-2", "db@db-1", "app@db-1"},
			edges: []string{"db@db-1 -> app@db-1"},
		},
		{
			name: "cross-node dependency by tag",
			tasks: []plan.Task{
				{ID: "app", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "db", Tags: plan.StringList{"mysql"}}}},
				{ID: "db", Tags: []string{"mysql"}},
			},
			nodes: cluster,
			runs:  []string{"db@db-1", "app@compute-1", "app@compute-2"},
			edges: []string{"db@db-1 -> app@compute-1", "db@db-1 -> app@compute-2"},
		},
		{
			name: "cross-node dependency by legacy role filter and regex name",
			tasks: []plan.Task{
				{ID: "app", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "/db-/", Role: plan.StringList{"controller"}}}},
				{ID: "db-schema", Tags: []string{"mysql"}},
				{ID: "db-seed", Tags: []string{"mysql"}},
				{ID: "dbx", Tags: []string{"mysql"}},
			},
			nodes: cluster,
			// Kahn takes the lowest ready (node, task) first: app becomes
			// ready once db-seed is done and outranks dbx by node name.
			runs: []string{"db-schema@db-1", "db-seed@db-1", "app@compute-1", "app@compute-2", "dbx@db-1"},
			edges: []string{
				"db-schema@db-1 -> app@compute-1", "db-schema@db-1 -> app@compute-2",
				"db-seed@db-1 -> app@compute-1", "db-seed@db-1 -> app@compute-2",
			},
		},
		{
			name: "cross dependency filter excludes nodes",
			tasks: []plan.Task{
				{ID: "agent", Tags: []string{"compute", "controller"}},
				{ID: "report", Tags: []string{"controller"}, CrossDepends: []plan.CrossDep{{Name: "agent", Tags: plan.StringList{"compute"}}}},
			},
			nodes: cluster,
			runs:  []string{"agent@compute-1", "agent@compute-2", "agent@db-1", "report@db-1"},
			edges: []string{"agent@compute-1 -> report@db-1", "agent@compute-2 -> report@db-1"},
		},
		{
			name: "required_for is the inverse of requires",
			tasks: []plan.Task{
				{ID: "b", Tags: []string{"x"}},
				{ID: "a", Tags: []string{"x"}, RequiredFor: []string{"b"}},
			},
			nodes: one,
			runs:  []string{"a@n1", "b@n1"},
			edges: []string{"a@n1 -> b@n1"},
		},
		{
			name: "cross_depended_by is the inverse of cross_depends",
			tasks: []plan.Task{
				{ID: "app", Tags: []string{"compute"}},
				{ID: "db", Tags: []string{"mysql"}, CrossDependedBy: []plan.CrossDep{{Name: "app", Tags: plan.StringList{"compute"}}}},
			},
			nodes: cluster,
			runs:  []string{"db@db-1", "app@compute-1", "app@compute-2"},
			edges: []string{"db@db-1 -> app@compute-1", "db@db-1 -> app@compute-2"},
		},
		{
			name: "duplicate edges are merged",
			tasks: []plan.Task{
				{ID: "a", Tags: []string{"x"}, RequiredFor: []string{"b"}, CrossDependedBy: []plan.CrossDep{{Name: "b"}}},
				{ID: "b", Tags: []string{"x"}, Requires: []string{"a", "/a/"}, CrossDepends: []plan.CrossDep{{Name: "a"}}},
			},
			nodes: one,
			runs:  []string{"a@n1", "b@n1"},
			edges: []string{"a@n1 -> b@n1"},
		},
		{
			name: "cross dependency matching its own run skips it",
			tasks: []plan.Task{
				{ID: "join", Tags: []string{"mysql"}, CrossDepends: []plan.CrossDep{{Name: "/.*/"}}},
				{ID: "db", Tags: []string{"mysql"}},
			},
			nodes: cluster,
			runs:  []string{"db@db-1", "join@db-1"},
			edges: []string{"db@db-1 -> join@db-1"},
		},
		{
			name: "regex requires leaves the task itself out",
			tasks: []plan.Task{
				{ID: "pkg-a", Tags: []string{"x"}},
				{ID: "pkg-b", Tags: []string{"x"}, Requires: []string{"/pkg-/"}},
			},
			nodes: one,
			runs:  []string{"pkg-a@n1", "pkg-b@n1"},
			edges: []string{"pkg-a@n1 -> pkg-b@n1"},
		},
		{
			name: "group and stage markers have no runs but pass ordering through",
			tasks: []plan.Task{
				{ID: "deploy_start", Type: plan.TypeStage},
				{ID: "late", Tags: []string{"x"}, Requires: []string{"deploy_end"}},
				{ID: "controller", Type: plan.TypeGroup, Role: plan.StringList{"x"}, Requires: []string{"deploy_start"}, RequiredFor: []string{"deploy_end"}},
				{ID: "early", Tags: []string{"x"}, RequiredFor: []string{"deploy_start"}},
				{ID: "deploy_end", Type: plan.TypeStage},
			},
			nodes: one,
			runs:  []string{"early@n1", "late@n1"},
			edges: []string{"early@n1 -> late@n1"},
		},
		{
			name: "self filter: nodes sharing the instance tag that selected the task",
			tasks: []plan.Task{
				{ID: "galera", Tags: []string{"mysql:1", "mysql:2"}},
				{ID: "galera-join", Tags: []string{"mysql:1", "mysql:2"}, CrossDepends: []plan.CrossDep{{Name: "galera", Role: plan.StringList{"self"}}}},
			},
			nodes: []plan.Node{
				{ID: 1, Name: "n1", Tags: []string{"corosync:1", "mysql:2"}},
				{ID: 2, Name: "n2", Tags: []string{"corosync:2", "mysql:1"}},
				{ID: 3, Name: "n3", Tags: []string{"corosync:2", "mysql:2"}},
			},
			runs: []string{"galera@n1", "galera@n2", "galera-join@n2", "galera@n3", "galera-join@n1", "galera-join@n3"},
			edges: []string{
				"galera@n1 -> galera-join@n1", "galera@n1 -> galera-join@n3",
				"galera@n2 -> galera-join@n2",
				"galera@n3 -> galera-join@n1", "galera@n3 -> galera-join@n3",
			},
		},
		{
			name: "unmatched cross dependency is a warning, not an error",
			tasks: []plan.Task{
				{ID: "app", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "swift", Tags: plan.StringList{"swift"}}, {Name: "/nothing-matches/"}}},
				{ID: "swift", Tags: []string{"swift"}},
			},
			nodes:    cluster,
			runs:     []string{"app@compute-1", "app@compute-2"},
			edges:    []string{},
			warnings: 1,
		},
		{
			name: "Options.Tasks keeps only the listed runs and edges between them",
			tasks: []plan.Task{
				{ID: "a", Tags: []string{"x"}},
				{ID: "b", Tags: []string{"x"}, Requires: []string{"a"}},
				{ID: "c", Tags: []string{"x"}, Requires: []string{"b"}},
			},
			nodes: one,
			opts:  plan.Options{Tasks: []string{"c", "b"}},
			runs:  []string{"b@n1", "c@n1"},
			edges: []string{"b@n1 -> c@n1"},
		},
		{
			name: "Options.Nodes keeps only the listed nodes, without warnings for the others",
			tasks: []plan.Task{
				{ID: "app", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "db"}}},
				{ID: "db", Tags: []string{"mysql"}},
			},
			nodes: cluster,
			opts:  plan.Options{Nodes: []int64{3, 2}},
			runs:  []string{"app@compute-1", "app@compute-2"},
			edges: []string{},
		},
		{
			name:  "no nodes, no runs",
			tasks: seedTasks(),
			runs:  []string{},
			edges: []string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := plan.Build(tc.tasks, tc.nodes, tc.opts)
			require.NoError(t, err)
			assert.Equal(t, tc.runs, runLabels(p))
			assert.Equal(t, tc.edges, edgeLabels(p))
			assert.Len(t, p.Warnings, tc.warnings, "warnings: %q", p.Warnings)
			for i, r := range p.Runs {
				assert.Equal(t, i, r.Index)
			}
			for _, e := range p.Edges {
				assert.Less(t, e.From, e.To, "edges follow the run order")
			}
		})
	}
}

func TestBuildWarningText(t *testing.T) {
	tasks := []plan.Task{
		{ID: "app", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "swift", Tags: plan.StringList{"swift"}}}},
		{ID: "swift", Tags: []string{"swift"}},
	}
	p, err := plan.Build(tasks, []plan.Node{{ID: 1, Name: "c1", Tags: []string{"compute"}}}, plan.Options{})
	require.NoError(t, err)
	require.Len(t, p.Warnings, 1)
	assert.Equal(t, `task "app": cross_depends[0]: "swift" matches no run on any node with node filter ["swift"]; that ordering is dropped`, p.Warnings[0])
}

func TestBuildCycles(t *testing.T) {
	tests := []struct {
		name  string
		tasks []plan.Task
		nodes []plan.Node
		path  []string
	}{
		{
			name: "within a node",
			tasks: []plan.Task{
				{ID: "a", Tags: []string{"x"}, Requires: []string{"b"}},
				{ID: "b", Tags: []string{"x"}, Requires: []string{"a"}},
				{ID: "c", Tags: []string{"x"}},
			},
			nodes: []plan.Node{{ID: 1, Name: "n1", Tags: []string{"x"}}},
			path:  []string{"a@n1", "b@n1", "a@n1"},
		},
		{
			name: "across nodes, in edge direction",
			tasks: []plan.Task{
				{ID: "a", Tags: []string{"t1"}, CrossDepends: []plan.CrossDep{{Name: "c"}}},
				{ID: "b", Tags: []string{"t2"}, CrossDepends: []plan.CrossDep{{Name: "a"}}},
				{ID: "c", Tags: []string{"t3"}, CrossDepends: []plan.CrossDep{{Name: "b"}}},
			},
			nodes: []plan.Node{
				{ID: 3, Name: "n3", Tags: []string{"t3"}},
				{ID: 1, Name: "n1", Tags: []string{"t1"}},
				{ID: 2, Name: "n2", Tags: []string{"t2"}},
			},
			path: []string{"a@n1", "b@n2", "c@n3", "a@n1"},
		},
		{
			name: "mixing same-node and cross-node edges",
			tasks: []plan.Task{
				{ID: "a", Tags: []string{"t1"}, Requires: []string{"b"}},
				{ID: "b", Tags: []string{"t1"}, CrossDepends: []plan.CrossDep{{Name: "c", Tags: plan.StringList{"t2"}}}},
				{ID: "c", Tags: []string{"t2"}, CrossDepends: []plan.CrossDep{{Name: "a"}}},
			},
			nodes: []plan.Node{
				{ID: 1, Name: "n1", Tags: []string{"t1"}},
				{ID: 2, Name: "n2", Tags: []string{"t2"}},
			},
			path: []string{"a@n1", "c@n2", "b@n1", "a@n1"},
		},
		{
			name: "the same task on peer nodes waiting for each other",
			tasks: []plan.Task{
				{ID: "join", Tags: []string{"compute"}, CrossDepends: []plan.CrossDep{{Name: "/.*/", Tags: plan.StringList{"compute"}}}},
			},
			nodes: []plan.Node{
				{ID: 2, Name: "c2", Tags: []string{"compute"}},
				{ID: 1, Name: "c1", Tags: []string{"compute"}},
			},
			path: []string{"join@c1", "join@c2", "join@c1"},
		},
		{
			name: "a task requiring itself through a stage",
			tasks: []plan.Task{
				{ID: "s", Type: plan.TypeStage, Requires: []string{"a"}},
				{ID: "a", Tags: []string{"x"}, Requires: []string{"s"}},
			},
			nodes: []plan.Node{{ID: 1, Name: "n1", Tags: []string{"x"}}},
			path:  []string{"a@n1", "a@n1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := plan.Build(tc.tasks, tc.nodes, plan.Options{})
			require.Error(t, err)
			assert.Nil(t, p)
			var ce *plan.CycleError
			require.True(t, errors.As(err, &ce), "got %v", err)
			assert.Equal(t, tc.path, ce.Path)
			assert.Contains(t, err.Error(), "dependency cycle: "+tc.path[0]+" -> ")
		})
	}
}

func TestCycleErrorMessage(t *testing.T) {
	err := &plan.CycleError{Path: []string{"a@n1", "b@n1", "a@n1"}}
	assert.Equal(t, "dependency cycle: a@n1 -> b@n1 -> a@n1", err.Error())
}

// TestValidateTaskCycle: a cycle of same-node orderings is refused without
// nodes, with its path in edge direction; cross dependencies and regex
// self-references are not such a cycle.
func TestValidateTaskCycle(t *testing.T) {
	cases := []struct {
		name  string
		tasks []plan.Task
		path  []string
	}{
		{"a task requiring itself", []plan.Task{{ID: "a", Requires: []string{"a"}}}, []string{"a", "a"}},
		{"two tasks", []plan.Task{{ID: "a", Requires: []string{"b"}}, {ID: "b", Requires: []string{"a"}}}, []string{"a", "b", "a"}},
		{"through required_for", []plan.Task{{ID: "a", RequiredFor: []string{"b"}}, {ID: "b", RequiredFor: []string{"c"}}, {ID: "c", RequiredFor: []string{"a"}}},
			[]string{"a", "b", "c", "a"}},
		{"through a stage", []plan.Task{{ID: "s", Type: plan.TypeStage, Requires: []string{"a"}}, {ID: "a", Requires: []string{"s"}}}, []string{"s", "a", "s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := plan.Validate(tc.tasks)
			var ce *plan.CycleError
			require.True(t, errors.As(err, &ce), "got %v", err)
			assert.Equal(t, tc.path, ce.Path)
		})
	}
	assert.NoError(t, plan.Validate([]plan.Task{{ID: "a", Requires: []string{"/.*/"}}, {ID: "b", Requires: []string{"c"}}, {ID: "c"}}))
	assert.NoError(t, plan.Validate([]plan.Task{{ID: "join", CrossDepends: []plan.CrossDep{{Name: "join"}}}}), "a cross dependency on itself orders peers")
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		tasks   []plan.Task
		task    string
		field   string
		message string // exact Error(), or "" to check only that it names the regex
		regex   string
	}{
		{
			name:    "missing dependency in requires",
			tasks:   []plan.Task{{ID: "x", Requires: []string{"y"}}},
			task:    "x",
			field:   "requires",
			message: `task "x": field "requires": unknown task "y"`,
		},
		{
			name:    "missing dependency in required_for",
			tasks:   []plan.Task{{ID: "x", RequiredFor: []string{"y"}}},
			task:    "x",
			field:   "required_for",
			message: `task "x": field "required_for": unknown task "y"`,
		},
		{
			name:    "missing dependency in cross_depends",
			tasks:   []plan.Task{{ID: "x"}, {ID: "z", CrossDepends: []plan.CrossDep{{Name: "x"}, {Name: "y"}}}},
			task:    "z",
			field:   "cross_depends[1].name",
			message: `task "z": field "cross_depends[1].name": unknown task "y"`,
		},
		{
			name:    "missing dependency in cross_depended_by",
			tasks:   []plan.Task{{ID: "x", CrossDependedBy: []plan.CrossDep{{Name: "y"}}}},
			task:    "x",
			field:   "cross_depended_by[0].name",
			message: `task "x": field "cross_depended_by[0].name": unknown task "y"`,
		},
		{
			name:    "empty cross dependency name",
			tasks:   []plan.Task{{ID: "x", CrossDepends: []plan.CrossDep{{Tags: plan.StringList{"a"}}}}},
			task:    "x",
			field:   "cross_depends[0].name",
			message: `task "x": field "cross_depends[0].name": empty task name`,
		},
		{
			name:    "duplicate id",
			tasks:   []plan.Task{{ID: "x"}, {ID: "y"}, {ID: "x"}},
			task:    "x",
			field:   "id",
			message: `task "x": field "id": duplicate task id (positions 0 and 2)`,
		},
		{
			name:    "empty id",
			tasks:   []plan.Task{{ID: "x"}, {Tags: []string{"a"}}},
			field:   "id",
			message: `field "id": task at position 1 has an empty id`,
		},
		{
			name:    "negative timeout",
			tasks:   []plan.Task{{ID: "x", Parameters: plan.Parameters{Timeout: -1}}},
			task:    "x",
			field:   "parameters.timeout",
			message: `task "x": field "parameters.timeout": must not be negative, got -1`,
		},
		{name: "invalid regex in tags", tasks: []plan.Task{{ID: "x", Tags: []string{"ok", "/(/"}}}, task: "x", field: "tags", regex: "/(/"},
		{name: "invalid regex in role", tasks: []plan.Task{{ID: "x", Role: plan.StringList{"/[a/"}}}, task: "x", field: "role", regex: "/[a/"},
		{name: "invalid regex in unused groups", tasks: []plan.Task{{ID: "x", Tags: []string{"a"}, Groups: plan.StringList{"/*/"}}}, task: "x", field: "groups", regex: "/*/"},
		{name: "RE2 rejects lookahead", tasks: []plan.Task{{ID: "x", Tags: []string{"/(?!a)/"}}}, task: "x", field: "tags", regex: "/(?!a)/"},
		{name: "invalid regex in requires", tasks: []plan.Task{{ID: "x", Requires: []string{"/a(/"}}}, task: "x", field: "requires", regex: "/a(/"},
		{name: "invalid regex in cross dep name", tasks: []plan.Task{{ID: "x", CrossDepends: []plan.CrossDep{{Name: "/+/"}}}}, task: "x", field: "cross_depends[0].name", regex: "/+/"},
		{name: "invalid regex in cross dep tags", tasks: []plan.Task{{ID: "x", CrossDepends: []plan.CrossDep{{Name: "x", Tags: plan.StringList{"/)/"}}}}}, task: "x", field: "cross_depends[0].tags", regex: "/)/"},
		{name: "invalid regex in cross dep role", tasks: []plan.Task{{ID: "x", CrossDependedBy: []plan.CrossDep{{Name: "x", Role: plan.StringList{"/)/"}}}}}, task: "x", field: "cross_depended_by[0].role", regex: "/)/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := plan.Validate(tc.tasks)
			require.Error(t, err)
			var ve *plan.ValidationError
			require.True(t, errors.As(err, &ve), "got %T %v", err, err)
			assert.Equal(t, tc.task, ve.Task)
			assert.Equal(t, tc.field, ve.Field)
			if tc.message != "" {
				assert.Equal(t, tc.message, err.Error())
			}
			if tc.regex != "" {
				assert.Contains(t, err.Error(), fmt.Sprintf("task %q", tc.task))
				assert.Contains(t, err.Error(), fmt.Sprintf("invalid regex %q", tc.regex))
			}

			// Build validates first and wraps the same error.
			_, berr := plan.Build(tc.tasks, nil, plan.Options{})
			var bve *plan.ValidationError
			require.True(t, errors.As(berr, &bve), "got %v", berr)
			assert.Equal(t, *ve, *bve)
		})
	}

	t.Run("valid graph", func(t *testing.T) {
		assert.NoError(t, plan.Validate(seedTasks()))
		assert.NoError(t, plan.Validate(nil))
	})
	t.Run("regex names may match nothing", func(t *testing.T) {
		assert.NoError(t, plan.Validate([]plan.Task{{ID: "x", Requires: []string{"/plugin-.*/"}, CrossDepends: []plan.CrossDep{{Name: "/plugin-.*/"}}}}))
	})
}

func TestBuildOptionErrors(t *testing.T) {
	nodes := []plan.Node{{ID: 1, Name: "n1", Tags: []string{"x"}}, {ID: 2, Name: "n2"}}
	tests := []struct {
		name   string
		nodes  []plan.Node
		opts   plan.Options
		field  string
		reason string
	}{
		{"unknown task", nodes, plan.Options{Tasks: []string{"a", "nope"}}, "tasks", `unknown task "nope"`},
		{"unknown node", nodes, plan.Options{Nodes: []int64{1, 7}}, "nodes", "unknown node id 7"},
		{"duplicate node id", append(slices.Clone(nodes), plan.Node{ID: 1, Name: "n3"}), plan.Options{}, "nodes", "duplicate node id 1"},
		{"duplicate node name", append(slices.Clone(nodes), plan.Node{ID: 3, Name: "n1"}), plan.Options{}, "nodes", `duplicate node name "n1"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := plan.Build([]plan.Task{{ID: "a", Tags: []string{"x"}}}, tc.nodes, tc.opts)
			var ve *plan.ValidationError
			require.True(t, errors.As(err, &ve), "got %v", err)
			assert.Equal(t, tc.field, ve.Field)
			assert.Equal(t, tc.reason, ve.Reason)
			assert.Empty(t, ve.Task)
		})
	}
}

func TestBuildSharesTaskCopy(t *testing.T) {
	tasks := []plan.Task{{ID: "a", Tags: []string{"x"}, Parameters: plan.Parameters{Cmd: "echo"}}}
	nodes := []plan.Node{{ID: 1, Name: "n1", Tags: []string{"x"}}, {ID: 2, Name: "n2", Tags: []string{"x"}}}
	p, err := plan.Build(tasks, nodes, plan.Options{})
	require.NoError(t, err)
	require.Len(t, p.Runs, 2)
	assert.Same(t, p.Runs[0].Task, p.Runs[1].Task)
	tasks[0].Parameters.Cmd = "changed"
	assert.Equal(t, "echo", p.Runs[0].Task.Parameters.Cmd, "the plan does not alias the caller's slice")
	assert.Equal(t, int64(2), p.Runs[1].NodeID)
	assert.Equal(t, "n2", p.Runs[1].NodeName)
}

func TestBuildDeterministic(t *testing.T) {
	tasks, nodes := bigGraph(60, 12)
	first, err := plan.Build(tasks, nodes, plan.Options{})
	require.NoError(t, err)
	require.NotEmpty(t, first.Edges)

	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 5; i++ {
		shuffled := slices.Clone(nodes)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		again, err := plan.Build(tasks, shuffled, plan.Options{})
		require.NoError(t, err)
		assert.Equal(t, runLabels(first), runLabels(again))
		assert.Equal(t, first.Edges, again.Edges)
		assert.Equal(t, first.Warnings, again.Warnings)
	}

	// Every edge respects the order, and no edge is repeated.
	seen := map[plan.Edge]bool{}
	for _, e := range first.Edges {
		assert.Less(t, e.From, e.To)
		assert.False(t, seen[e], "duplicate edge %v", e)
		seen[e] = true
	}
}

// bigGraph builds a Fuel-like cluster: 3 controllers and the rest computes,
// taskCount tasks mixing all-node, controller-only and compute-only tasks
// with same-node and cross-node dependencies.
func bigGraph(nodeCount, taskCount int) ([]plan.Task, []plan.Node) {
	nodes := make([]plan.Node, nodeCount)
	for i := range nodes {
		if i < 3 {
			nodes[i] = plan.Node{ID: int64(i + 1), Name: fmt.Sprintf("controller-%d", i+1),
				Tags: plan.NodeTags([]string{"controller"}, []string{"mysql", "rabbitmq", "keystone", fmt.Sprintf("mysql:%d", i%2+1)})}
			continue
		}
		nodes[i] = plan.Node{ID: int64(i + 1), Name: fmt.Sprintf("compute-%04d", i+1),
			Tags: plan.NodeTags([]string{"compute"}, []string{"nova", fmt.Sprintf("rack:%d", i%8)})}
	}
	tasks := []plan.Task{
		{ID: "deploy_start", Type: plan.TypeStage},
		{ID: "globals", Role: plan.StringList{"/.*/"}, Requires: []string{"deploy_start"}},
		{ID: "hiera", Role: plan.StringList{"*"}, Requires: []string{"globals"}},
	}
	for i := len(tasks); i < taskCount; i++ {
		prev := tasks[i-1].ID
		id := fmt.Sprintf("task-%02d", i)
		var t plan.Task
		switch i % 4 {
		case 0:
			t = plan.Task{ID: id, Tags: []string{"mysql", "rabbitmq"}, Requires: []string{prev}}
		case 1:
			t = plan.Task{ID: id, Tags: []string{"nova"}, Requires: []string{prev},
				CrossDepends: []plan.CrossDep{{Name: fmt.Sprintf("task-%02d", i-1), Role: plan.StringList{"controller"}}}}
		case 2:
			t = plan.Task{ID: id, Tags: []string{"controller", "compute"}, Requires: []string{prev},
				CrossDepends: []plan.CrossDep{{Name: fmt.Sprintf("/task-%02d|task-%02d/", i-2, i-3), Tags: plan.StringList{"/contr/"}}}}
		default:
			t = plan.Task{ID: id, Tags: []string{"keystone"}, Requires: []string{prev},
				CrossDepends:    []plan.CrossDep{{Name: prev, Role: plan.StringList{"self"}}},
				CrossDependedBy: []plan.CrossDep{{Name: "/task-1/", Tags: plan.StringList{"rack:3"}}}}
		}
		tasks = append(tasks, t)
	}
	tasks = append(tasks, plan.Task{ID: "deploy_end", Type: plan.TypeStage, Requires: []string{tasks[len(tasks)-1].ID}})
	return tasks, nodes
}

func TestBuildLargeCluster(t *testing.T) {
	tasks, nodes := bigGraph(1000, 20)
	p, err := plan.Build(tasks, nodes, plan.Options{})
	require.NoError(t, err)
	assert.Greater(t, len(p.Runs), 1000*3)
	pos := make(map[string]int, len(p.Runs))
	for i, r := range p.Runs {
		pos[r.Label()] = i
	}
	// Same-node requires: globals before hiera everywhere.
	assert.Less(t, pos["globals@compute-0500"], pos["hiera@compute-0500"])
	// Cross-node: a compute task waits for the controller task it names.
	assert.Less(t, pos["task-04@controller-2"], pos["task-05@compute-0500"])
}

func BenchmarkBuild1000x20(b *testing.B) {
	tasks, nodes := bigGraph(1000, 20)
	b.ReportAllocs()
	for b.Loop() {
		p, err := plan.Build(tasks, nodes, plan.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(p.Runs) == 0 {
			b.Fatal("no runs")
		}
	}
}
