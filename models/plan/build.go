package plan

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Build resolves tasks to nodes and returns the node-task DAG.
//
// A run exists for every (node, task) the task's selector picks (AppliesTo),
// except group and stage markers, restricted to opts. Edges come from:
//   - requires / required_for: runs on the same node only; a named task with
//     no run on that node adds no edge (as in Fuel). Names may be "/regex/";
//     a marker in between passes its own predecessors through, so "a requires
//     stage S, S requires b" orders b before a on each node.
//   - cross_depends of task T at node n: every run (m, d), on any node m
//     including n, whose task id matches the name and whose node passes the
//     filter goes before (n, T); cross_depended_by is the inverse. A run
//     never depends on itself through these.
//
// With opts.Tasks or opts.Nodes, edges are kept only between selected runs.
// Runs come in a stable topological order (Kahn's algorithm, ties broken by
// node name, node id, then task position), so equal input gives an equal
// plan. Errors are *ValidationError and *CycleError, wrapped.
func Build(tasks []Task, nodes []Node, opts Options) (*Plan, error) {
	g, err := compile(tasks)
	if err != nil {
		return nil, fmt.Errorf("plan: invalid graph: %w", err)
	}
	b, err := newBuilder(g, nodes, opts)
	if err != nil {
		return nil, fmt.Errorf("plan: invalid input: %w", err)
	}
	b.placeRuns()
	b.linkSameNode()
	b.linkCrossNode()
	p, err := b.finish()
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return p, nil
}

// builder holds the working state of one Build. Runs are numbered in
// tie-break order (node rank, then task position) while being placed, so the
// topological sort only has to prefer the lowest number.
type builder struct {
	g        *graph
	nodes    []Node // sorted by name, then id
	nodeKept []bool
	taskKept []bool
	nT       int

	applies []bool  // [node*nT+task]: the task selects the node (all nodes)
	runAt   []int32 // [node*nT+task]: the kept run, or -1

	runNode  []int32   // per run
	runTask  []int32   // per run
	taskRuns [][]int32 // per task: its kept runs
	preds    [][]int32 // per run: runs that go before it

	tagNodes map[string][]int32 // node tag -> nodes, built on first "self"
	warnings []string
}

// newBuilder sorts the nodes and checks them and the options.
func newBuilder(g *graph, nodes []Node, opts Options) (*builder, error) {
	b := &builder{g: g, nT: len(g.tasks)}
	b.nodes = slices.Clone(nodes)
	slices.SortStableFunc(b.nodes, func(x, y Node) int {
		return cmp.Or(strings.Compare(x.Name, y.Name), cmp.Compare(x.ID, y.ID))
	})
	// Ids select nodes in Options and names label runs, so both must be
	// unique for the plan to mean anything.
	byID := make(map[int64]int, len(b.nodes))
	for i, n := range b.nodes {
		if _, dup := byID[n.ID]; dup {
			return nil, &ValidationError{Field: "nodes", Reason: fmt.Sprintf("duplicate node id %d", n.ID)}
		}
		byID[n.ID] = i
		if i > 0 && b.nodes[i-1].Name == n.Name {
			return nil, &ValidationError{Field: "nodes", Reason: fmt.Sprintf("duplicate node name %q", n.Name)}
		}
	}

	b.nodeKept = make([]bool, len(b.nodes))
	if len(opts.Nodes) == 0 {
		for i := range b.nodeKept {
			b.nodeKept[i] = true
		}
	}
	for _, id := range opts.Nodes {
		i, ok := byID[id]
		if !ok {
			return nil, &ValidationError{Field: "nodes", Reason: fmt.Sprintf("unknown node id %d", id)}
		}
		b.nodeKept[i] = true
	}

	b.taskKept = make([]bool, b.nT)
	if len(opts.Tasks) == 0 {
		for i := range b.taskKept {
			b.taskKept[i] = true
		}
	}
	for _, id := range opts.Tasks {
		i, ok := g.byID[id]
		if !ok {
			return nil, &ValidationError{Field: "tasks", Reason: fmt.Sprintf("unknown task %q", id)}
		}
		b.taskKept[i] = true
	}
	return b, nil
}

// placeRuns resolves every task on every node. Resolution covers the nodes
// and tasks left out by Options too, because warnings must not fire for a
// dependency that exists but was merely not selected.
func (b *builder) placeRuns() {
	nN := len(b.nodes)
	b.applies = make([]bool, nN*b.nT)
	b.runAt = make([]int32, nN*b.nT)
	b.taskRuns = make([][]int32, b.nT)
	for n := range b.nodes {
		tags := b.nodes[n].Tags
		for t := range b.g.tasks {
			k := n*b.nT + t
			b.runAt[k] = -1
			if b.g.tasks[t].IsMarker() || !b.g.sel[t].matches(tags) {
				continue
			}
			b.applies[k] = true
			if !b.nodeKept[n] || !b.taskKept[t] {
				continue
			}
			r := int32(len(b.runNode))
			b.runAt[k] = r
			b.runNode = append(b.runNode, int32(n))
			b.runTask = append(b.runTask, int32(t))
			b.taskRuns[t] = append(b.taskRuns[t], r)
		}
	}
	b.preds = make([][]int32, len(b.runNode))
}

// linkSameNode adds the requires/required_for edges, resolved once per task
// and then looked up per node, so the cost is runs × predecessors.
func (b *builder) linkSameNode() {
	expanded := make([][]int, b.nT)
	for t := range b.g.tasks {
		if !b.g.tasks[t].IsMarker() && len(b.taskRuns[t]) > 0 {
			expanded[t] = b.expandBefore(t)
		}
	}
	for r := range b.runNode {
		n, t := int(b.runNode[r]), int(b.runTask[r])
		for _, u := range expanded[t] {
			if s := b.runAt[n*b.nT+u]; s >= 0 {
				b.preds[r] = append(b.preds[r], s)
			}
		}
	}
}

// expandBefore returns the real tasks that go before task t on a node,
// looking through group and stage markers (which have no runs) to their own
// predecessors. A task reaching itself through markers is kept: the
// resulting self-edge is reported as a cycle.
func (b *builder) expandBefore(t int) []int {
	var out []int
	seen := make([]bool, b.nT)
	var walk func([]int)
	walk = func(list []int) {
		for _, x := range list {
			if seen[x] {
				continue
			}
			seen[x] = true
			if b.g.tasks[x].IsMarker() {
				walk(b.g.before[x])
				continue
			}
			out = append(out, x)
		}
	}
	walk(b.g.before[t])
	return out
}

// candidates are the runs a cross dependency resolves to for one node set.
type candidates struct {
	kept []int32 // kept runs, to link
	all  int     // matches over all nodes and tasks, to decide on warnings
}

// linkCrossNode adds the cross_depends/cross_depended_by edges. Candidate
// runs are computed once per dependency (and per distinct "self" tag set),
// not once per dependent run, so the work is proportional to the edges made
// rather than to runs².
func (b *builder) linkCrossNode() {
	for _, d := range b.g.deps {
		t := d.task
		if len(b.taskRuns[t]) == 0 {
			continue
		}
		tIsTarget := slices.Contains(d.targets, t)
		base := b.baseMatch(&d.filter)
		var fixed *candidates
		var bySelf map[string]*candidates
		if d.filter.self {
			bySelf = make(map[string]*candidates)
		} else {
			fixed = b.candidates(&d, base)
		}
		missing := false
		for _, r := range b.taskRuns[t] {
			n := b.runNode[r]
			c := fixed
			// Does the dependent run itself pass the filter? It is a match
			// that must neither become an edge nor hide a warning.
			selfIn := tIsTarget && (base == nil || base[n])
			if d.filter.self {
				var shared []string
				c, shared = b.selfCandidates(&d, base, bySelf, int(n))
				selfIn = tIsTarget && (len(shared) > 0 || base[n])
			}
			if c.all == 0 || (c.all == 1 && selfIn) {
				missing = true
			}
			for _, s := range c.kept {
				if s == r {
					continue
				}
				if d.out {
					b.preds[s] = append(b.preds[s], r)
				} else {
					b.preds[r] = append(b.preds[r], s)
				}
			}
		}
		if missing && d.known {
			b.warnings = append(b.warnings, fmt.Sprintf(
				"task %q: %s: %q matches no run on any node %s; that ordering is dropped",
				b.g.tasks[t].ID, d.field, d.name, describeFilter(d.filterEntries)))
		}
	}
}

// baseMatch evaluates the non-"self" part of a filter on every node; nil
// means the filter is empty and so matches every node.
func (b *builder) baseMatch(f *matcher) []bool {
	if f.empty() {
		return nil
	}
	match := make([]bool, len(b.nodes))
	for n := range b.nodes {
		match[n] = f.matches(b.nodes[n].Tags)
	}
	return match
}

// candidates lists the runs of the dependency's target tasks on the nodes in
// match (nil: all nodes).
func (b *builder) candidates(d *depSpec, match []bool) *candidates {
	c := &candidates{}
	for _, dt := range d.targets {
		for n := range b.nodes {
			k := n*b.nT + dt
			if (match != nil && !match[n]) || !b.applies[k] {
				continue
			}
			c.all++
			if s := b.runAt[k]; s >= 0 {
				c.kept = append(c.kept, s)
			}
		}
	}
	return c
}

// selfCandidates resolves a filter with "self" for the dependent task on
// node n: the nodes sharing a tag through which the task's selector picked
// n, plus the nodes the rest of the filter matches. Nodes picked through the
// same tags share one computation.
func (b *builder) selfCandidates(d *depSpec, base []bool, cache map[string]*candidates, n int) (*candidates, []string) {
	shared := slices.Clone(b.g.sel[d.task].selecting(b.nodes[n].Tags))
	slices.Sort(shared)
	shared = slices.Compact(shared)
	key := strings.Join(shared, "\x00")
	if c, ok := cache[key]; ok {
		return c, shared
	}
	if b.tagNodes == nil {
		b.tagNodes = make(map[string][]int32)
		for m, node := range b.nodes {
			for _, tag := range node.Tags {
				b.tagNodes[tag] = append(b.tagNodes[tag], int32(m))
			}
		}
	}
	match := slices.Clone(base) // never nil: "self" makes the filter non-empty
	for _, tag := range shared {
		for _, m := range b.tagNodes[tag] {
			match[m] = true
		}
	}
	c := b.candidates(d, match)
	cache[key] = c
	return c, shared
}

// describeFilter renders a node filter for warnings.
func describeFilter(entries []string) string {
	if len(entries) == 0 {
		return "(no node filter)"
	}
	return fmt.Sprintf("with node filter %q", entries)
}

// finish de-duplicates edges, sorts the runs topologically and assembles the
// plan, or reports a cycle.
func (b *builder) finish() (*Plan, error) {
	nR := len(b.runNode)
	edges := 0
	for r := range b.preds {
		slices.Sort(b.preds[r])
		b.preds[r] = slices.Compact(b.preds[r])
		edges += len(b.preds[r])
	}

	// Successors in compressed rows; filled in increasing run order, so each
	// row is sorted.
	start := make([]int32, nR+1)
	for r := range b.preds {
		for _, p := range b.preds[r] {
			start[p+1]++
		}
	}
	for r := 0; r < nR; r++ {
		start[r+1] += start[r]
	}
	succ := make([]int32, edges)
	fill := slices.Clone(start[:nR])
	indeg := make([]int32, nR)
	for r := range b.preds {
		indeg[r] = int32(len(b.preds[r]))
		for _, p := range b.preds[r] {
			succ[fill[p]] = int32(r)
			fill[p]++
		}
	}

	// Kahn's algorithm taking the lowest-numbered ready run first: run
	// numbers follow (node name, node id, task position), which makes the
	// order stable.
	var ready minHeap
	for r := range indeg {
		if indeg[r] == 0 {
			ready.push(int32(r))
		}
	}
	order := make([]int32, 0, nR)
	for len(ready) > 0 {
		r := ready.pop()
		order = append(order, r)
		for _, s := range succ[start[r]:start[r+1]] {
			indeg[s]--
			if indeg[s] == 0 {
				ready.push(s)
			}
		}
	}
	if len(order) < nR {
		return nil, &CycleError{Path: b.cyclePath(indeg)}
	}

	pos := make([]int32, nR)
	for i, r := range order {
		pos[r] = int32(i)
	}
	p := &Plan{
		Runs:     make([]Run, nR),
		Edges:    make([]Edge, 0, edges),
		Warnings: b.warnings,
	}
	var row []int
	for i, r := range order {
		n := &b.nodes[b.runNode[r]]
		p.Runs[i] = Run{Index: i, NodeID: n.ID, NodeName: n.Name, Task: &b.g.tasks[b.runTask[r]]}
		row = row[:0]
		for _, s := range succ[start[r]:start[r+1]] {
			row = append(row, int(pos[s]))
		}
		slices.Sort(row)
		for _, to := range row {
			p.Edges = append(p.Edges, Edge{From: i, To: to})
		}
	}
	return p, nil
}

// cyclePath finds one cycle among the runs Kahn's algorithm could not order
// (indeg > 0). Each of them has a predecessor among them, so walking back
// from the lowest-numbered one, always to its lowest-numbered such
// predecessor, must revisit a run; the loop found is reversed into edge
// direction and rotated to start at its lowest-numbered run, which makes the
// reported path deterministic.
func (b *builder) cyclePath(indeg []int32) []string {
	first := slices.IndexFunc(indeg, func(d int32) bool { return d > 0 })
	seenAt := make(map[int32]int)
	var walk []int32
	v := int32(first)
	for {
		if _, ok := seenAt[v]; ok {
			break
		}
		seenAt[v] = len(walk)
		walk = append(walk, v)
		for _, p := range b.preds[v] {
			if indeg[p] > 0 {
				v = p
				break
			}
		}
	}
	loop := slices.Clone(walk[seenAt[v]:])
	slices.Reverse(loop)
	low := slices.Index(loop, slices.Min(loop))
	loop = slices.Concat(loop[low:], loop[:low])
	path := make([]string, 0, len(loop)+1)
	for _, r := range loop {
		path = append(path, b.g.tasks[b.runTask[r]].ID+"@"+b.nodes[b.runNode[r]].Name)
	}
	return append(path, path[0])
}

// minHeap is a binary min-heap of run numbers, smaller than container/heap's
// interface dance for the one type needed here.
type minHeap []int32

// push adds v.
func (h *minHeap) push(v int32) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if s[parent] <= s[i] {
			break
		}
		s[parent], s[i] = s[i], s[parent]
		i = parent
	}
}

// pop removes and returns the smallest value; the heap must not be empty.
func (h *minHeap) pop() int32 {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(s) && s[l] < s[small] {
			small = l
		}
		if r := l + 1; r < len(s) && s[r] < s[small] {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
