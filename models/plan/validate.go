package plan

import (
	"fmt"
	"strings"
)

// ValidationError is bad input in a graph or in Options, naming the task (if
// any) and the field so that the REST layer can answer with a precise 4xx.
type ValidationError struct {
	// Task is the offending task id; empty for node and option errors.
	Task string
	// Field is the offending field, e.g. "requires", "cross_depends[0].name",
	// "nodes" or "tasks".
	Field string
	// Reason says what is wrong with the field.
	Reason string
	// Err is the underlying error, if any (e.g. the regexp parse error).
	Err error
}

// Error renders `task "x": field "requires": unknown task "y"`.
func (e *ValidationError) Error() string {
	if e.Task == "" {
		return fmt.Sprintf("field %q: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("task %q: field %q: %s", e.Task, e.Field, e.Reason)
}

// Unwrap returns the underlying error.
func (e *ValidationError) Unwrap() error { return e.Err }

// CycleError rejects a graph whose runs depend on each other in a circle.
type CycleError struct {
	// Path is one cycle as "task@node" labels in edge direction (each run
	// must finish before the next), closed by repeating the first label.
	Path []string
}

// Error renders "dependency cycle: a@n1 -> b@n1 -> a@n1".
func (e *CycleError) Error() string {
	return "dependency cycle: " + strings.Join(e.Path, " -> ")
}

// Validate checks a graph's tasks without nodes: ids present and unique,
// every requires/required_for/cross dependency naming a known task (a
// "/regex/" name may match none), every "/regex/" compiling, parameters not
// negative, and no cycle among the same-node orderings (requires and
// required_for, through markers too): such a cycle stops every node holding
// the tasks, so it is refused before any node is known, as *CycleError with
// the task ids. Other problems come first, in input order, as
// *ValidationError.
func Validate(tasks []Task) error {
	g, err := compile(tasks)
	if err != nil {
		return err
	}
	if path := g.taskCycle(); path != nil {
		return &CycleError{Path: path}
	}
	return nil
}

// taskCycle returns one cycle of the same-node orderings as task ids in edge
// direction, closed by repeating the first, or nil.
func (g *graph) taskCycle() []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int8, len(g.tasks))
	// Iterative DFS over "i must wait for before[i]", reversed at the end to
	// read in edge direction (each task finishes before the next).
	type frame struct{ node, next int }
	for start := range g.tasks {
		if state[start] != unseen {
			continue
		}
		stack := []frame{{start, 0}}
		state[start] = onPath
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next == len(g.before[top.node]) {
				state[top.node] = done
				stack = stack[:len(stack)-1]
				continue
			}
			p := g.before[top.node][top.next]
			top.next++
			switch state[p] {
			case unseen:
				state[p] = onPath
				stack = append(stack, frame{p, 0})
			case onPath:
				// The path from p down the stack to top waits on p.
				var ids []string
				for k := len(stack) - 1; k >= 0; k-- {
					ids = append(ids, g.tasks[stack[k].node].ID)
					if stack[k].node == p {
						break
					}
				}
				// ids runs top, top-1, ..., p; each stack entry waits
				// for the one above it and top waits for p, so in edge
				// direction: p -> top -> top-1 -> ... -> p.
				out := append([]string{g.tasks[p].ID}, ids[:len(ids)-1]...)
				return append(out, g.tasks[p].ID)
			}
		}
	}
	return nil
}

// graph is a validated graph with its selectors compiled and its task names
// resolved to positions, shared by Validate and Build.
type graph struct {
	tasks  []Task         // shallow copy: runs point into it, not into the caller's slice
	byID   map[string]int // task id -> position
	sel    []matcher      // node selector per task
	before [][]int        // same-node predecessors per task, markers included
	deps   []depSpec      // every cross dependency, in task then field order
}

// depSpec is one cross_depends or cross_depended_by entry, resolved.
type depSpec struct {
	task    int     // position of the task declaring it
	out     bool    // cross_depended_by: the declaring task goes first
	field   string  // "cross_depends[i]" or "cross_depended_by[i]"
	name    string  // as written
	targets []int   // tasks (markers excluded) whose id matches name
	known   bool    // name matched at least one task, marker or not
	filter  matcher // node filter; "self" allowed

	filterEntries []string // the filter as written, for warnings
}

// compile validates tasks and prepares them for Build.
func compile(tasks []Task) (*graph, error) {
	g := &graph{
		tasks:  append([]Task(nil), tasks...),
		byID:   make(map[string]int, len(tasks)),
		sel:    make([]matcher, len(tasks)),
		before: make([][]int, len(tasks)),
	}
	// Ids first, so that later checks can resolve names in any direction.
	for i, t := range g.tasks {
		if t.ID == "" {
			return nil, &ValidationError{Field: "id", Reason: fmt.Sprintf("task at position %d has an empty id", i)}
		}
		if j, dup := g.byID[t.ID]; dup {
			return nil, &ValidationError{Task: t.ID, Field: "id", Reason: fmt.Sprintf("duplicate task id (positions %d and %d)", j, i)}
		}
		g.byID[t.ID] = i
	}
	for i := range g.tasks {
		if err := g.compileTask(i); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// compileTask validates task i and records its selector and dependencies.
func (g *graph) compileTask(i int) error {
	t := &g.tasks[i]
	bad := func(field, reason string, err error) error {
		return &ValidationError{Task: t.ID, Field: field, Reason: reason, Err: err}
	}
	// Every selector field is checked, not only the one in effect: a broken
	// legacy field is still broken input.
	for _, f := range []struct {
		name    string
		entries []string
	}{{"tags", t.Tags}, {"role", t.Role}, {"groups", t.Groups}} {
		if _, err := newMatcher(f.entries, false); err != nil {
			return bad(f.name, err.Error(), err)
		}
	}
	sel, err := newMatcher(t.Selector(), false)
	if err != nil {
		return bad("tags", err.Error(), err) // unreachable: checked above
	}
	g.sel[i] = sel

	if t.Parameters.Timeout < 0 {
		return bad("parameters.timeout", fmt.Sprintf("must not be negative, got %d", t.Parameters.Timeout), nil)
	}
	if t.Parameters.Retries < 0 {
		return bad("parameters.retries", fmt.Sprintf("must not be negative, got %d", t.Parameters.Retries), nil)
	}

	for _, name := range t.Requires {
		ids, err := g.resolveName(name, i)
		if err != nil {
			return bad("requires", err.Error(), err)
		}
		g.before[i] = append(g.before[i], ids...)
	}
	for _, name := range t.RequiredFor {
		ids, err := g.resolveName(name, i)
		if err != nil {
			return bad("required_for", err.Error(), err)
		}
		for _, next := range ids {
			g.before[next] = append(g.before[next], i)
		}
	}

	for _, f := range []struct {
		name string
		out  bool
		deps []CrossDep
	}{{"cross_depends", false, t.CrossDepends}, {"cross_depended_by", true, t.CrossDependedBy}} {
		for k, d := range f.deps {
			field := fmt.Sprintf("%s[%d]", f.name, k)
			spec, err := g.compileDep(i, d, field, f.out)
			if err != nil {
				return err
			}
			g.deps = append(g.deps, spec)
		}
	}
	return nil
}

// compileDep validates one cross dependency of task i.
func (g *graph) compileDep(i int, d CrossDep, field string, out bool) (depSpec, error) {
	id := g.tasks[i].ID
	if d.Name == "" {
		return depSpec{}, &ValidationError{Task: id, Field: field + ".name", Reason: "empty task name"}
	}
	// A cross dependency may name its own task: it then orders the task's
	// runs on the other matching nodes (the run itself is skipped).
	ids, err := g.resolveName(d.Name, -1)
	if err != nil {
		return depSpec{}, &ValidationError{Task: id, Field: field + ".name", Reason: err.Error(), Err: err}
	}
	for _, f := range []struct {
		name    string
		entries []string
	}{{"tags", d.Tags}, {"role", d.Role}} {
		if _, err := newMatcher(f.entries, true); err != nil {
			return depSpec{}, &ValidationError{Task: id, Field: field + "." + f.name, Reason: err.Error(), Err: err}
		}
	}
	filter, _ := newMatcher(d.Filter(), true) // compiled above
	spec := depSpec{task: i, out: out, field: field, name: d.Name, known: len(ids) > 0, filter: filter, filterEntries: d.Filter()}
	for _, j := range ids {
		if !g.tasks[j].IsMarker() {
			spec.targets = append(spec.targets, j)
		}
	}
	return spec, nil
}

// resolveName resolves a task id or "/regex/" to task positions in input
// order. self, when not -1, is left out of regex matches: "requires: [/.*/]"
// means the other tasks, not a cycle with itself. An unknown plain id is an
// error; a regex matching nothing is not (plugins come and go).
func (g *graph) resolveName(name string, self int) ([]int, error) {
	body, isRegex := regexBody(name)
	if !isRegex {
		j, ok := g.byID[name]
		if !ok {
			return nil, fmt.Errorf("unknown task %q", name)
		}
		return []int{j}, nil
	}
	re, err := compileRegex(body)
	if err != nil {
		return nil, &badRegexError{entry: name, err: err}
	}
	var out []int
	for j, t := range g.tasks {
		if j != self && matchPrefix(re, t.ID) {
			out = append(out, j)
		}
	}
	return out, nil
}
