package plan_test

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/anneal-dev/anneal/models/plan"
)

// resolvesReference is the TagsResolver rule written out plainly (seed 001),
// independent of the package's compiled and cached matchers: "*" matches
// any node; a "/regex/" entry matches when the regex (RE2) matches at the
// start of a tag that is not an instance tag; any other entry matches a tag
// equal to it. A regex that does not compile matches nothing.
func resolvesReference(selector, nodeTags []string) bool {
	for _, entry := range selector {
		if entry == plan.Any {
			return true
		}
		if len(entry) >= 2 && entry[0] == '/' && entry[len(entry)-1] == '/' {
			re, err := regexp.Compile(entry[1 : len(entry)-1])
			if err != nil {
				continue
			}
			for _, tag := range nodeTags {
				if strings.Contains(tag, ":") {
					continue
				}
				// The leftmost match starts at 0 exactly when some match does.
				if loc := re.FindStringIndex(tag); loc != nil && loc[0] == 0 {
					return true
				}
			}
			continue
		}
		if slices.Contains(nodeTags, entry) {
			return true
		}
	}
	return false
}

// FuzzResolves checks the tag resolver against resolvesReference, and that
// Validate and Build agree with it: a selector entry Validate accepts gives
// a run on a node exactly when Resolves says the task applies there, and a
// refused entry is a *ValidationError naming the task and the field.
func FuzzResolves(f *testing.F) {
	// The seed's resolver examples, instance tags, and regex edge cases.
	for _, c := range [][3]string{
		{"controller", "controller", "mysql"},
		{"/.*/", "controller", ""},
		{"/contr/", "controller", ""},
		{"/contr$/", "controller", ""},
		{"/mysql.*/", "mysql:1", "mysql:2"},
		{"mysql:1", "mysql:1", "mysql:2"},
		{"*", "", ""},
		{"/*/", "x", ""},
		{"//", "x", "y:1"},
		{"/", "/", ""},
		{"/a)(b/", "a)(b", ""},
		{`/\Qa/`, "a", ""},
		{`/a|b/`, "b", ""},
		{`/(?i)CTRL/`, "ctrl", ""},
		{`/(?=x)/`, "x", ""},
		{`/^$/`, "", ""},
	} {
		f.Add(c[0], c[1], c[2])
	}
	f.Fuzz(func(t *testing.T, entry, tag1, tag2 string) {
		selector := []string{entry}
		nodeTags := []string{tag1, tag2}
		want := resolvesReference(selector, nodeTags)
		if got := plan.Resolves(selector, nodeTags); got != want {
			t.Fatalf("Resolves(%q, %q) = %v, want %v", selector, nodeTags, got, want)
		}

		task := plan.Task{ID: "t", Tags: selector}
		err := plan.Validate([]plan.Task{task})
		isRegex := len(entry) >= 2 && entry[0] == '/' && entry[len(entry)-1] == '/'
		if isRegex {
			_, cerr := regexp.Compile(entry[1 : len(entry)-1])
			if (cerr == nil) != (err == nil) {
				t.Fatalf("Validate(tags %q) = %v, but the regex compiles: %v", entry, err, cerr == nil)
			}
		} else if err != nil {
			t.Fatalf("Validate(tags %q) = %v for a plain entry", entry, err)
		}
		if err != nil {
			var verr *plan.ValidationError
			if !errors.As(err, &verr) || verr.Task != "t" || verr.Field != "tags" || !strings.Contains(verr.Reason, fmt.Sprintf("%q", entry)) {
				t.Fatalf("Validate(tags %q) = %#v, want a ValidationError naming task t, field tags and quoting the entry", entry, err)
			}
			return
		}
		p, err := plan.Build([]plan.Task{task}, []plan.Node{{ID: 1, Name: "n", Tags: nodeTags}}, plan.Options{})
		if err != nil {
			t.Fatalf("Build after Validate accepted: %v", err)
		}
		if (len(p.Runs) == 1) != want || len(p.Runs) > 1 {
			t.Fatalf("Build placed %d runs for selector %q on tags %q; Resolves says %v", len(p.Runs), selector, nodeTags, want)
		}
	})
}

// graphGen turns fuzz bytes into a small graph and node set: ids, selectors
// and dependency names come from small pools, so that the bytes mostly
// decide structure (which task requires which, which node holds which tag)
// rather than spelling.
type graphGen struct {
	data []byte
}

// next returns the next byte, or 0 once the input is used up.
func (g *graphGen) next() byte {
	if len(g.data) == 0 {
		return 0
	}
	b := g.data[0]
	g.data = g.data[1:]
	return b
}

func (g *graphGen) pick(pool []string) string { return pool[int(g.next())%len(pool)] }

var (
	genTaskIDs = []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	genTypes   = []string{"", "shell", "noop", plan.TypeGroup, plan.TypeStage}
	genTags    = []string{"controller", "compute", "mysql", "mysql:1", "mysql:2", "ceph", "x"}
	genSel     = []string{"controller", "compute", "mysql", "mysql:1", "/mysql/", "/.*/", "/c/", "*", "/(/", "ceph"}
	genNames   = []string{"a", "b", "c", "d", "e", "f", "g", "h", "/[a-c]/", "/.*/", "zz", "/[/"}
	genFilter  = []string{"self", "*", "controller", "/mysql/", "mysql:1", "compute"}
	genNodes   = []string{"n1", "n2", "n3", "n4", "n5"}
)

func (g *graphGen) list(pool []string, max int) []string {
	n := int(g.next()) % (max + 1)
	out := make([]string, 0, n)
	for range n {
		out = append(out, g.pick(pool))
	}
	return out
}

func (g *graphGen) crossDeps() []plan.CrossDep {
	n := int(g.next()) % 3
	var out []plan.CrossDep
	for range n {
		d := plan.CrossDep{Name: g.pick(genNames)}
		if g.next()%2 == 0 {
			d.Tags = g.list(genFilter, 2)
		} else {
			d.Role = g.list(genFilter, 2)
		}
		out = append(out, d)
	}
	return out
}

func (g *graphGen) graph() ([]plan.Task, []plan.Node, plan.Options) {
	nTasks := 1 + int(g.next())%len(genTaskIDs)
	tasks := make([]plan.Task, nTasks)
	for i := range tasks {
		t := &tasks[i]
		t.ID = genTaskIDs[i]
		if g.next()%16 == 0 { // now and then a duplicate or empty id
			t.ID = g.pick(append([]string{""}, genTaskIDs...))
		}
		t.Type = g.pick(genTypes)
		switch g.next() % 3 {
		case 0:
			t.Tags = g.list(genSel, 2)
		case 1:
			t.Role = g.list(genSel, 2)
		default:
			t.Groups = g.list(genSel, 2)
		}
		t.Requires = g.list(genNames, 2)
		t.RequiredFor = g.list(genNames, 1)
		t.CrossDepends = g.crossDeps()
		t.CrossDependedBy = g.crossDeps()
		if g.next()%32 == 0 {
			t.Parameters.Timeout = -1
		}
	}
	nNodes := int(g.next()) % (len(genNodes) + 1)
	nodes := make([]plan.Node, nNodes)
	for i := range nodes {
		nodes[i] = plan.Node{ID: int64(i + 1), Name: genNodes[i], Tags: g.list(genTags, 3)}
	}
	var opts plan.Options
	if g.next()%4 == 0 && nNodes > 0 {
		opts.Nodes = []int64{int64(1 + int(g.next())%nNodes)}
	}
	if g.next()%4 == 0 {
		opts.Tasks = []string{g.pick(genTaskIDs)}
	}
	return tasks, nodes, opts
}

// FuzzBuild builds generated graphs and checks the plan's invariants: an
// error is a *ValidationError naming a field or a *CycleError whose path is
// a closed loop of real runs; a plan has exactly the runs the resolver
// selects, edges going forward in plan order, sorted and unique, every
// same-node "requires" honoured, and the same plan whatever the node order.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x03\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x01\x01\x00\x00\x00\x00\x00\x03\x01\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x03\x02\x00\x01\x01\x01\x00\x02\x02\x00\x00"))
	f.Add([]byte("\x07\x01\x01\x00\x02\x04\x05\x01\x08\x00\x00\x00\x00\x01\x02\x00\x03\x09\x01\x01\x00\x01\x00\x02\x05\x06\x01\x02\x00\x01\x00\x00\x00\x05\x03\x00\x01\x02\x03\x02\x03\x04\x01\x05"))
	f.Add([]byte("cycle: a requires b, b requires a, on every node"))
	f.Add([]byte("\x02\x01\x00\x00\x01\x01\x01\x00\x01\x00\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\x00\x00\x02\x01\x06\x02\x01\x06\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 512 {
			return // the generator uses far fewer bytes; longer inputs add nothing
		}
		tasks, nodes, opts := (&graphGen{data: data}).graph()
		verr := plan.Validate(tasks)
		p, err := plan.Build(tasks, nodes, opts)
		if verr != nil {
			var ve *plan.ValidationError
			var ce *plan.CycleError
			switch {
			case errors.As(verr, &ce):
				// A cycle of requires is refused when written, with its
				// path, even where Build would place none of its tasks.
				if len(ce.Path) < 2 || ce.Path[0] != ce.Path[len(ce.Path)-1] {
					t.Fatalf("Validate's cycle %v is not a closed loop", ce.Path)
				}
				return
			case !errors.As(verr, &ve) || ve.Field == "" || ve.Reason == "":
				t.Fatalf("Validate error %#v is neither a ValidationError naming a field nor a cycle", verr)
			}
			if err == nil {
				t.Fatalf("Validate refused the graph (%v) but Build accepted it", verr)
			}
			return
		}
		if err != nil {
			var ve *plan.ValidationError
			var ce *plan.CycleError
			switch {
			case errors.As(err, &ce):
				checkCycle(t, ce, tasks, nodes)
			case errors.As(err, &ve):
				if ve.Task != "" || (ve.Field != "nodes" && ve.Field != "tasks") {
					t.Fatalf("Build refused valid tasks with %#v; only nodes or options may be wrong then", ve)
				}
			default:
				t.Fatalf("Build error %v is neither a ValidationError nor a CycleError", err)
			}
			return
		}
		checkPlan(t, p, tasks, nodes, opts)

		// The plan does not depend on the order the nodes come in.
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		p2, err := plan.Build(tasks, rev, opts)
		if err != nil {
			t.Fatalf("Build with the nodes reversed failed: %v", err)
		}
		if !slices.Equal(runLabels(p), runLabels(p2)) || !slices.Equal(p.Edges, p2.Edges) {
			t.Fatalf("plan depends on node order:\n%q %v\n%q %v", runLabels(p), p.Edges, runLabels(p2), p2.Edges)
		}
	})
}

// checkCycle verifies that a reported cycle is a closed path of runs that
// exist: each label names a task selecting the labelled node.
func checkCycle(t *testing.T, ce *plan.CycleError, tasks []plan.Task, nodes []plan.Node) {
	t.Helper()
	if len(ce.Path) < 2 || ce.Path[0] != ce.Path[len(ce.Path)-1] {
		t.Fatalf("cycle path %q is not closed", ce.Path)
	}
	for _, label := range ce.Path {
		taskID, nodeName, ok := strings.Cut(label, "@")
		if !ok {
			t.Fatalf("cycle label %q is not task@node", label)
		}
		ti := slices.IndexFunc(tasks, func(x plan.Task) bool { return x.ID == taskID })
		ni := slices.IndexFunc(nodes, func(x plan.Node) bool { return x.Name == nodeName })
		if ti < 0 || ni < 0 || tasks[ti].IsMarker() || !plan.AppliesTo(tasks[ti], nodes[ni].Tags) {
			t.Fatalf("cycle label %q is not a run of the graph", label)
		}
	}
}

// checkPlan verifies a plan against its input.
func checkPlan(t *testing.T, p *plan.Plan, tasks []plan.Task, nodes []plan.Node, opts plan.Options) {
	t.Helper()
	want := map[string]bool{}
	for _, n := range nodes {
		if len(opts.Nodes) > 0 && !slices.Contains(opts.Nodes, n.ID) {
			continue
		}
		for _, task := range tasks {
			if len(opts.Tasks) > 0 && !slices.Contains(opts.Tasks, task.ID) {
				continue
			}
			if !task.IsMarker() && plan.AppliesTo(task, n.Tags) {
				want[task.ID+"@"+n.Name] = true
			}
		}
	}
	got := map[string]int{}
	for i, r := range p.Runs {
		if r.Index != i {
			t.Fatalf("run %d has index %d", i, r.Index)
		}
		if _, dup := got[r.Label()]; dup {
			t.Fatalf("run %s placed twice", r.Label())
		}
		got[r.Label()] = i
		if !want[r.Label()] {
			t.Fatalf("run %s placed although its task does not select the node (or was not asked for)", r.Label())
		}
	}
	if len(got) != len(want) {
		t.Fatalf("plan has %d runs, the resolver selects %d: %q", len(got), len(want), runLabels(p))
	}
	for i, e := range p.Edges {
		if e.From < 0 || e.To >= len(p.Runs) || e.From >= e.To {
			t.Fatalf("edge %v does not go forward in plan order (%d runs)", e, len(p.Runs))
		}
		if i > 0 {
			prev := p.Edges[i-1]
			if prev.From > e.From || (prev.From == e.From && prev.To >= e.To) {
				t.Fatalf("edges not sorted and unique at %d: %v then %v", i, prev, e)
			}
		}
	}
	has := map[plan.Edge]bool{}
	for _, e := range p.Edges {
		has[e] = true
	}
	// A plain "requires" between two tasks with runs on the same node is an
	// edge (markers in between are expanded, so only direct pairs are checked).
	for _, task := range tasks {
		for _, req := range task.Requires {
			for _, n := range nodes {
				to, ok1 := got[task.ID+"@"+n.Name]
				from, ok2 := got[req+"@"+n.Name]
				if ok1 && ok2 && !has[plan.Edge{From: from, To: to}] {
					t.Fatalf("%s requires %s on %s, but the plan has no such edge", task.ID, req, n.Name)
				}
			}
		}
	}
}
