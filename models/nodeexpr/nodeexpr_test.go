package nodeexpr_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models/nodeexpr"
)

var nodes = []nodeexpr.Node{
	{ID: 1, Name: "ctl-1.anneal.test", Status: "deployed", Progress: 100, Roles: []string{"controller"}, Tags: []string{"controller", "api", "database"}, Alive: true,
		Attributes: map[string]any{"rack": "r1", "port": 5000.0, "flags": map[string]any{"ha": true}}},
	{ID: 2, Name: "db-1.anneal.test", Status: "provisioned", Progress: 40, Roles: []string{"database"}, Tags: []string{"database"}, Alive: true,
		Attributes: map[string]any{"rack": "r2"}},
	{ID: 3, Name: "cmp-1.anneal.test", Status: "discover", Progress: 100, Roles: []string{"compute"}, Tags: []string{"compute", "hypervisor"}, Alive: false,
		ErrorType: "provision", Attributes: map[string]any{"rack": "r1"}},
	{ID: 4, Name: "db-2.anneal.test", Status: "discover", Progress: 0, Admin: true},
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []int64
	}{
		{"'controller' in node.roles", []int64{1}},
		{"node.status == 'discover'", []int64{3, 4}},
		{"node.name.startsWith('db-')", []int64{2, 4}},
		{"node.status != 'deployed' || node.progress < 100", []int64{2, 3, 4}},
		{"'database' in node.tags && node.alive", []int64{1, 2}},
		{"node.id > 2", []int64{3, 4}},
		{"node.admin", []int64{4}},
		{"!node.admin && node.error_type == ''", []int64{1, 2}},
		{"node.error_type == 'provision'", []int64{3}},
		{"size(node.roles) == 0", []int64{4}},
		{"node.tags.exists(t, t == 'hypervisor')", []int64{3}},
		{"node.name.matches('^(ctl|cmp)-[0-9]+\\\\.')", []int64{1, 3}},
		{"'rack' in node.attributes && node.attributes.rack == 'r1'", []int64{1, 3}},
		{"has(node.attributes.port) && node.attributes.port == 5000", []int64{1}},
		{"has(node.attributes.flags) && node.attributes.flags.ha == true", []int64{1}},
		{"node.name.lowerAscii().contains('cmp')", []int64{3}},
		{"node.status == 'discover' &&\n  node.progress < 100", []int64{4}},
		{"false", []int64{}},
		{"true", []int64{1, 2, 3, 4}},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := nodeexpr.Select(tc.expr, nodes)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		expr         string
		line, column int
		reason       string
	}{
		{"", 0, 0, "is empty"},
		{"   ", 0, 0, "is empty"},
		{"node.stauts == 'discover'", 1, 5, "undefined field 'stauts'"},
		{"node.status ==", 1, 15, "Syntax error"},
		{"node.status = 'discover'", 1, 13, "Syntax error"},
		{"node.status == 'discover' &&\n  node.bogus", 2, 7, "undefined field 'bogus'"},
		{"nodes.status == 'discover'", 1, 1, "undeclared reference to 'nodes'"},
		{"node.progress < 'a'", 1, 15, "no matching overload"},
		{"node.progress", 1, 5, "must be a boolean expression, but its type is int"},
		{"node.name", 1, 5, "its type is string"},
		{"node.attributes.enabled", 1, 16, "its type is dyn"},
		{"node.roles", 1, 5, "its type is list(string)"},
		{"node.name.matches('[')", 1, 19, "invalid matches argument"},
		{"'controller' in node.role", 1, 21, "undefined field 'role'"},
		{"node.name.startsWith(1)", 1, 21, "no matching overload"},
		{strings.Repeat("a", nodeexpr.MaxLength+1), 0, 0, "size"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			_, err := nodeexpr.Compile(tc.expr)
			var ce *nodeexpr.Error
			require.ErrorAs(t, err, &ce)
			assert.Contains(t, ce.Reason, tc.reason)
			if tc.line > 0 {
				assert.Equal(t, tc.line, ce.Line, "line of %q", ce.Reason)
				assert.Equal(t, tc.column, ce.Column, "column of %q", ce.Reason)
				assert.Contains(t, ce.Error(), "line ")
				require.NotEmpty(t, ce.Issues)
			}
			// Select reports the same compile error.
			_, err = nodeexpr.Select(tc.expr, nodes)
			require.ErrorAs(t, err, &ce)
		})
	}
}

func TestEvalErrorNamesTheNode(t *testing.T) {
	// rack exists on every node but the admin one (no attributes at all).
	_, err := nodeexpr.Select("node.attributes.rack == 'r1'", nodes)
	require.Error(t, err)
	var ee *nodeexpr.EvalError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, int64(4), ee.NodeID)
	assert.Equal(t, "db-2.anneal.test", ee.NodeName)
	assert.Contains(t, err.Error(), "db-2.anneal.test")
	assert.Contains(t, err.Error(), "no such key: rack")

	// Every failing node is named.
	_, err = nodeexpr.Select("node.attributes.port == 1", nodes)
	require.Error(t, err)
	for _, name := range []string{"db-1.anneal.test", "cmp-1.anneal.test", "db-2.anneal.test"} {
		assert.Contains(t, err.Error(), name)
	}
	assert.NotContains(t, err.Error(), "ctl-1.anneal.test")

	// A dynamic value of the wrong type is a runtime error too.
	p, err := nodeexpr.Compile("node.attributes.rack > 3")
	require.NoError(t, err)
	_, err = p.Match(nodes[1])
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, int64(2), ee.NodeID)
}

func TestCostLimit(t *testing.T) {
	// A comprehension over a long list must stop at the cost limit, not run away.
	many := make([]string, 20000)
	for i := range many {
		many[i] = "t"
	}
	p, err := nodeexpr.Compile("node.tags.all(a, node.tags.all(b, b == a))")
	require.NoError(t, err)
	_, err = p.Match(nodeexpr.Node{ID: 9, Name: "big.anneal.test", Tags: many})
	var ee *nodeexpr.EvalError
	require.ErrorAs(t, err, &ee)
	assert.Contains(t, ee.Reason, "cost")
}

func TestProgramIsReusableAndNilSafe(t *testing.T) {
	p, err := nodeexpr.Compile("size(node.tags) == 0 && size(node.attributes) == 0")
	require.NoError(t, err)
	assert.Equal(t, "size(node.tags) == 0 && size(node.attributes) == 0", p.String())
	for i := 0; i < 3; i++ {
		ok, err := p.Match(nodeexpr.Node{ID: 1, Name: "x"})
		require.NoError(t, err)
		assert.True(t, ok)
	}
	ids, err := p.Select(nil)
	require.NoError(t, err)
	assert.Equal(t, []int64{}, ids)
}
