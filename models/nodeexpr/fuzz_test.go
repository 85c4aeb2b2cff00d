package nodeexpr_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/anneal-dev/anneal/models/nodeexpr"
)

// bound is far above what compiling an expression of MaxLength and one
// evaluation under the CEL cost limit take (microseconds to milliseconds):
// exceeding it means a limit does not hold (e.g. exponential work on nested
// input).
const bound = 5 * time.Second

// within runs fn and fails the test, naming the input, when it has not
// returned after bound; the fuzzer then records the input as a failure
// instead of hanging on it.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%s did not finish within %v", what, bound)
	}
}

// FuzzCompile compiles node selectors and evaluates the accepted ones. A
// refused expression is an *Error whose position lies inside the source; an
// accepted one keeps its source, compiles again, and evaluates on a node to
// a bool or an *EvalError naming that node, the same way twice, within a
// time bound whatever the nesting.
func FuzzCompile(f *testing.F) {
	for _, expr := range []string{
		// The built-in deploy-changes scenario and the README's examples.
		"node.status == 'discover'",
		"node.status != 'deployed' || node.progress < 100",
		`"compute" in node.roles`,
		"'controller' in node.roles",
		"node.name.startsWith('db-')",
		"node.name.matches('^(ctl|cmp)-[0-9]+\\\\.')",
		"has(node.attributes.port) && node.attributes.port == 5000",
		"node.attributes.rack == 'r1'",
		"node.tags.exists(t, t == 'hypervisor')",
		"node.tags.all(t, node.roles.exists(r, r == t))",
		"size(node.roles) == 0",
		"node.name.lowerAscii().split('.').size() > 2",
		// Refusals: syntax, unknown field, wrong type, bad regex, nesting.
		"node.status ==",
		"node.colour == 'red'",
		"node.progress",
		"node.name.matches('(')",
		"node.tags.all(a, node.tags.all(b, node.tags.all(c, a == b && b == c)))",
		"node.status == 'discover' &&\n  node.progres < 100",
		strings.Repeat("(", 300) + "true" + strings.Repeat(")", 300),
		strings.Repeat("!", 1000) + "true",
		"[1,2,3].map(x, [1,2,3].map(y, x*y)).size() > 0",
		"'é' + node.name == 'ünïcode' ||\tnode.name == '\u2028'",
		"",
		"   ",
	} {
		f.Add(expr, "ctl-1.anneal.test", "deployed", "controller", `{"rack": "r1", "port": 5000, "flags": {"ha": true}}`, int64(100), true)
	}
	f.Fuzz(func(t *testing.T, expr, name, status, tag, attrs string, progress int64, alive bool) {
		var p *nodeexpr.Program
		var err error
		within(t, fmt.Sprintf("Compile(%q)", expr), func() { p, err = nodeexpr.Compile(expr) })
		if err != nil {
			checkCompileError(t, expr, err)
			return
		}
		if utf8.RuneCountInString(expr) > nodeexpr.MaxLength {
			t.Fatalf("an expression of %d code points was accepted (limit %d)", utf8.RuneCountInString(expr), nodeexpr.MaxLength)
		}
		if p.String() != expr {
			t.Fatalf("String() = %q, want the source %q", p.String(), expr)
		}
		if _, err := nodeexpr.Compile(expr); err != nil {
			t.Fatalf("compiling an accepted expression again failed: %v", err)
		}
		var attributes map[string]any
		_ = json.Unmarshal([]byte(attrs), &attributes) // not an object: no attributes
		n := nodeexpr.Node{ID: 7, Name: name, Status: status, Roles: []string{tag}, Tags: []string{tag, "x"},
			Alive: alive, Attributes: attributes, Progress: progress}
		var got bool
		within(t, fmt.Sprintf("Match(%q)", expr), func() { got, err = p.Match(n) })
		if err != nil {
			var ee *nodeexpr.EvalError
			if !errors.As(err, &ee) || ee.NodeID != 7 || ee.NodeName != name || ee.Reason == "" {
				t.Fatalf("Match error %#v is not an EvalError naming the node", err)
			}
		}
		again, err2 := p.Match(n)
		if again != got || (err == nil) != (err2 == nil) {
			t.Fatalf("Match is not deterministic: %v, %v then %v, %v", got, err, again, err2)
		}
		ids, err := p.Select([]nodeexpr.Node{n})
		if (err == nil) != (err2 == nil) || (err == nil && (len(ids) == 1) != got) {
			t.Fatalf("Select = %v, %v disagrees with Match = %v, %v", ids, err, got, err2)
		}
	})
}

// checkCompileError checks that a compile error says where the problem is:
// a line and column inside the source, repeated in the message and first
// among the issues.
func checkCompileError(t *testing.T, expr string, err error) {
	t.Helper()
	var ce *nodeexpr.Error
	if !errors.As(err, &ce) {
		t.Fatalf("Compile(%q) error %T %v is not an *nodeexpr.Error", expr, err, err)
	}
	if ce.Reason == "" {
		t.Fatalf("Compile(%q): error without a reason", expr)
	}
	if ce.Line == 0 {
		return // no position: emptiness or the program could not be planned
	}
	lines := strings.Split(expr, "\n")
	if ce.Line < 1 || ce.Line > len(lines) {
		t.Fatalf("Compile(%q): line %d outside the source's %d lines (%v)", expr, ce.Line, len(lines), err)
	}
	width := utf8.RuneCountInString(lines[ce.Line-1])
	if ce.Column < 1 || ce.Column > width+1 {
		t.Fatalf("Compile(%q): column %d outside line %d of %d code points (%v)", expr, ce.Column, ce.Line, width, err)
	}
	if want := fmt.Sprintf("line %d, column %d: ", ce.Line, ce.Column); !strings.HasPrefix(ce.Error(), want) {
		t.Fatalf("Compile(%q): message %q does not start with %q", expr, ce.Error(), want)
	}
	if len(ce.Issues) == 0 || !strings.HasPrefix(ce.Issues[0], fmt.Sprintf("%d:%d: ", ce.Line, ce.Column)) {
		t.Fatalf("Compile(%q): issues %q do not start with the position", expr, ce.Issues)
	}
}
