// Package nodeexpr compiles and evaluates the node-selection expressions of
// scenario acts (Fuel's "yaql_exp"), written in CEL
// (https://cel.dev, the Common Expression Language) over one variable, node:
//
//	node.id          int     the node's id
//	node.name        string  its FQDN, e.g. "db-1.anneal.test"
//	node.status      string  'discover' | 'provisioned' | 'deployed'
//	node.roles       list    role names bound to the node
//	node.tags        list    tags the node holds
//	node.admin       bool
//	node.alive       bool    its agent phoned home recently
//	node.attributes  map     the node's attributes (JSON; numbers are doubles)
//	node.progress    int     0-100
//	node.error_type  string  '' when the node has none
//
// An expression must be of type bool, e.g. `'controller' in node.roles`,
// `node.status == 'discover'`, `node.name.startsWith('db-')`,
// `node.status != 'deployed' || node.progress < 100`. The standard CEL
// functions and macros (size, in, exists, all, matches, startsWith, ...) and
// the CEL strings extension (lowerAscii, split, ...) are available.
//
// The package is pure: no database, no Temporal. Compile checks the syntax,
// every field name and the result type, and reports the position (line and
// column) of the first error.
package nodeexpr

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/ext"
)

// Node is what an expression sees as `node`.
type Node struct {
	ID         int64          `json:"id"`
	Name       string         `json:"name"`
	Status     string         `json:"status"`
	Roles      []string       `json:"roles"`
	Tags       []string       `json:"tags"`
	Admin      bool           `json:"admin"`
	Alive      bool           `json:"alive"`
	Attributes map[string]any `json:"attributes"`
	Progress   int64          `json:"progress"`
	ErrorType  string         `json:"error_type"`
}

// Limits: an expression is a short filter, not a program.
const (
	// MaxLength is the longest expression accepted, in code points.
	MaxLength = 4096
	// costLimit bounds the work of one evaluation (CEL cost units).
	costLimit = 1_000_000
)

// Error is a compile error: the position of the first problem (line and
// column, both counting from 1) and every problem CEL reported.
type Error struct {
	Line   int
	Column int
	// Reason is the first problem, without its position.
	Reason string
	// Issues are all problems, each as "line:column: message".
	Issues []string
}

// Error formats the position and the reason.
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d, column %d: %s", e.Line, e.Column, e.Reason)
	}
	return e.Reason
}

// EvalError is a runtime error evaluating an expression on one node.
type EvalError struct {
	NodeID   int64
	NodeName string
	Reason   string
}

// Error names the node.
func (e *EvalError) Error() string {
	return fmt.Sprintf("evaluating on node %s (id %d): %s", e.NodeName, e.NodeID, e.Reason)
}

var env = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		ext.NativeTypes(reflect.TypeFor[Node](), ext.ParseStructTag("json")),
		cel.Variable("node", cel.ObjectType("nodeexpr.Node")),
		ext.Strings(),
		cel.ParserExpressionSizeLimit(MaxLength),
		cel.ASTValidators(cel.ValidateRegexLiterals(), cel.ValidateComprehensionNestingLimit(2)),
	)
})

// Program is a compiled, type-checked expression, safe for concurrent use.
type Program struct {
	src string
	prg cel.Program
}

// String returns the expression's source.
func (p *Program) String() string { return p.src }

// Compile parses and type-checks expr: it must be non-empty, refer only to
// the fields of node, and be of type bool.
func Compile(expr string) (*Program, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, &Error{Reason: "is empty; write a boolean CEL expression over node, e.g. \"'controller' in node.roles\""}
	}
	e, err := env()
	if err != nil {
		return nil, fmt.Errorf("build the CEL environment: %w", err)
	}
	ast, iss := e.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return nil, issuesError(iss)
	}
	if out := ast.OutputType(); !out.IsExactType(types.BoolType) {
		line, col := 1, 1
		if native := ast.NativeRep(); native != nil {
			loc := native.SourceInfo().GetStartLocation(native.Expr().ID())
			if loc.Line() > 0 {
				line, col = loc.Line(), loc.Column()+1
			}
		}
		reason := fmt.Sprintf("must be a boolean expression, but its type is %s", cel.FormatCELType(out))
		if out.IsExactType(types.DynType) {
			reason += " (its value is only known when it runs; compare it, e.g. `node.attributes.enabled == true`)"
		}
		return nil, &Error{Line: line, Column: col, Reason: reason, Issues: []string{fmt.Sprintf("%d:%d: %s", line, col, reason)}}
	}
	prg, err := e.Program(ast, cel.CostLimit(costLimit), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, &Error{Reason: err.Error()}
	}
	return &Program{src: expr, prg: prg}, nil
}

// issuesError turns CEL's issues into an Error with the first position.
func issuesError(iss *cel.Issues) *Error {
	out := &Error{}
	for i, ce := range iss.Errors() {
		line, col := ce.Location.Line(), ce.Location.Column()+1
		if i == 0 {
			out.Line, out.Column, out.Reason = line, col, ce.Message
			if line <= 0 {
				out.Line, out.Column = 0, 0
			}
		}
		if line > 0 {
			out.Issues = append(out.Issues, fmt.Sprintf("%d:%d: %s", line, col, ce.Message))
		} else {
			out.Issues = append(out.Issues, ce.Message)
		}
	}
	if out.Reason == "" {
		out.Reason = iss.Err().Error()
	}
	return out
}

// Match evaluates the program on one node; a runtime error (a missing
// attribute key, a type mismatch on a dynamic value, the cost limit) is an
// *EvalError naming the node.
func (p *Program) Match(n Node) (bool, error) {
	if n.Roles == nil {
		n.Roles = []string{}
	}
	if n.Tags == nil {
		n.Tags = []string{}
	}
	if n.Attributes == nil {
		n.Attributes = map[string]any{}
	}
	val, _, err := p.prg.Eval(map[string]any{"node": n})
	if err != nil {
		return false, &EvalError{NodeID: n.ID, NodeName: n.Name, Reason: err.Error()}
	}
	b, ok := val.Value().(bool)
	if !ok {
		return false, &EvalError{NodeID: n.ID, NodeName: n.Name, Reason: fmt.Sprintf("the expression gave %v, not a bool", val)}
	}
	return b, nil
}

// Select returns the ids of the nodes on which p is true, in the order given.
func (p *Program) Select(nodes []Node) ([]int64, error) {
	out := []int64{}
	var errs []error
	for _, n := range nodes {
		ok, err := p.Match(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			out = append(out, n.ID)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Select compiles expr and returns the ids of the nodes it is true on. A
// compile error is an *Error; runtime errors are *EvalError (joined, one per
// failing node).
func Select(expr string, nodes []Node) ([]int64, error) {
	p, err := Compile(expr)
	if err != nil {
		return nil, err
	}
	return p.Select(nodes)
}
