package fuel

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/anneal-dev/anneal/workflows/contract"
)

func TestNodeStartOrder(t *testing.T) {
	a, b, c := contract.PlannedNode{ID: 1, Name: "a"}, contract.PlannedNode{ID: 2, Name: "b"}, contract.PlannedNode{ID: 3, Name: "c"}
	names := func(ns []contract.PlannedNode) []string {
		var out []string
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out
	}
	cases := []struct {
		name string
		deps []nodeDep
		want []string
	}{
		{"no dependencies: by name", nil, []string{"a", "b", "c"}},
		{"a waits for c", []nodeDep{{Before: 3, After: 1}}, []string{"b", "c", "a"}},
		{"chain c → b → a", []nodeDep{{3, 2}, {2, 1}}, []string{"c", "b", "a"}},
		{"cycle a ↔ b, c free", []nodeDep{{1, 2}, {2, 1}}, []string{"c", "a", "b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, names(nodeStartOrder([]contract.PlannedNode{a, b, c}, tc.deps)))
		})
	}
}

func TestSortedKeys(t *testing.T) {
	assert.Equal(t, []string{"a", "b", "c"}, sortedKeys(map[string]int{"c": 1, "a": 2, "b": 3}))
}
