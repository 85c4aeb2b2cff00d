package models_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/anneal-dev/anneal/models"
)

func TestRedundantRequirements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		requires map[string][]string
		want     []string
	}{
		{name: "no roles", requires: nil, want: nil},
		{name: "no redundancy", requires: map[string][]string{
			"a": {"b"}, "b": {"c"}, "c": nil, "d": {"a", "e"}, "e": nil,
		}, want: nil},
		{name: "direct redundancy", requires: map[string][]string{
			"A": {"B", "C"}, "B": {"C"}, "C": nil,
		}, want: []string{`role "A" requires "C", which it already requires through "B"`}},
		{name: "deeper chain", requires: map[string][]string{
			"A": {"D", "B"}, "B": {"C"}, "C": {"D"}, "D": nil,
		}, want: []string{`role "A" requires "D", which it already requires through "B" -> "C"`}},
		{name: "diamond is not redundant", requires: map[string][]string{
			"top": {"left", "right"}, "left": {"base"}, "right": {"base"}, "base": nil,
		}, want: nil},
		{name: "diamond with a redundant edge to its base", requires: map[string][]string{
			"top": {"base", "left", "right"}, "left": {"base"}, "right": {"base"}, "base": nil,
		}, want: []string{`role "top" requires "base", which it already requires through "left"`}},
		{name: "shortest path named", requires: map[string][]string{
			// a reaches d through b -> c -> d and through e -> d.
			"a": {"b", "d", "e"}, "b": {"c"}, "c": {"d"}, "e": {"d"}, "d": nil,
		}, want: []string{`role "a" requires "d", which it already requires through "e"`}},
		{name: "a duplicate is not a path", requires: map[string][]string{
			"a": {"b", "b"}, "b": nil,
		}, want: nil},
		{name: "several, ordered by role then requirement", requires: map[string][]string{
			"web":  {"db", "base", "app"},
			"app":  {"base", "db"},
			"db":   {"base"},
			"base": nil,
			"cli":  {"base", "db"},
		}, want: []string{
			`role "app" requires "base", which it already requires through "db"`,
			`role "cli" requires "base", which it already requires through "db"`,
			`role "web" requires "base", which it already requires through "app"`,
			`role "web" requires "db", which it already requires through "app"`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, models.RedundantRequirements(tc.requires))
		})
	}
}
