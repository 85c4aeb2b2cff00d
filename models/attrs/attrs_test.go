package attrs

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type m = map[string]any
type l = []any

// jsonCopy round-trips v through encoding/json, which both snapshots an
// input (to prove it was not mutated) and models storing a wall in jsonb.
func jsonCopy(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestDeepMerge(t *testing.T) {
	cases := []struct {
		name   string
		layers []map[string]any
		want   map[string]any
	}{
		{"no layers", nil, m{}},
		{"only nil layers", []map[string]any{nil, nil}, m{}},
		{"empty layers", []map[string]any{{}, {}}, m{}},
		{"nil layer skipped", []map[string]any{{"a": 1.0}, nil, {"b": 2.0}}, m{"a": 1.0, "b": 2.0}},
		{"empty layer changes nothing", []map[string]any{{"a": 1.0}, {}}, m{"a": 1.0}},
		{"later wins", []map[string]any{{"a": 1.0}, {"a": 2.0}, {"a": 3.0}}, m{"a": 3.0}},
		{
			"nested maps merge",
			[]map[string]any{
				{"net": m{"ip": "10.0.0.1", "mtu": 1500.0, "opts": m{"x": true}}},
				{"net": m{"mtu": 9000.0, "opts": m{"y": false}}},
			},
			m{"net": m{"ip": "10.0.0.1", "mtu": 9000.0, "opts": m{"x": true, "y": false}}},
		},
		{
			"lists replace, never concatenate",
			[]map[string]any{{"ntp": l{"a", "b"}}, {"ntp": l{"c"}}},
			m{"ntp": l{"c"}},
		},
		{
			"empty list replaces",
			[]map[string]any{{"ntp": l{"a"}}, {"ntp": l{}}},
			m{"ntp": l{}},
		},
		{
			"lists of maps replace whole",
			[]map[string]any{{"d": l{m{"a": 1.0}}}, {"d": l{m{"b": 2.0}}}},
			m{"d": l{m{"b": 2.0}}},
		},
		{"null replaces", []map[string]any{{"a": m{"b": 1.0}}, {"a": nil}}, m{"a": nil}},
		{"scalar replaces map", []map[string]any{{"a": m{"b": 1.0}}, {"a": "x"}}, m{"a": "x"}},
		{"map replaces scalar", []map[string]any{{"a": "x"}, {"a": m{"b": 1.0}}}, m{"a": m{"b": 1.0}}},
		{"map replaces list", []map[string]any{{"a": l{1.0}}, {"a": m{"b": 1.0}}}, m{"a": m{"b": 1.0}}},
		{"empty map merges as no-op", []map[string]any{{"a": m{"b": 1.0}}, {"a": m{}}}, m{"a": m{"b": 1.0}}},
		{"nil map reads as empty", []map[string]any{{"a": map[string]any(nil)}}, m{"a": m{}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]map[string]any, len(tc.layers))
			for i, layer := range tc.layers {
				before[i] = jsonCopy(t, layer)
			}
			got := DeepMerge(tc.layers...)
			assert.Equal(t, tc.want, got)
			for i, layer := range tc.layers {
				assert.Equal(t, before[i], jsonCopy(t, layer), "layer %d mutated", i)
			}
		})
	}
}

func TestDeepMergeResultSharesNothing(t *testing.T) {
	a := m{"n": m{"x": 1.0}, "list": l{m{"k": "v"}}}
	b := m{"n": m{"y": 2.0}, "only": m{"z": 3.0}}
	got := DeepMerge(a, b)

	// Mutating the result must not reach any input...
	got["n"].(m)["x"] = "changed"
	got["list"].(l)[0].(m)["k"] = "changed"
	got["only"].(m)["z"] = "changed"
	assert.Equal(t, m{"n": m{"x": 1.0}, "list": l{m{"k": "v"}}}, a)
	assert.Equal(t, m{"n": m{"y": 2.0}, "only": m{"z": 3.0}}, b)

	// ...and mutating an input afterwards must not reach the result.
	got = DeepMerge(a, b)
	a["n"].(m)["x"] = "later"
	b["only"].(m)["z"] = "later"
	assert.Equal(t, 1.0, got["n"].(m)["x"])
	assert.Equal(t, 3.0, got["only"].(m)["z"])
}

func TestVisibleOrder(t *testing.T) {
	// Every layer sets "who" and its own marker key; the winner of "who"
	// reveals the precedence, the markers prove every layer took part.
	layer := func(name string) map[string]any {
		return m{"who": name, "seen": m{name: true}}
	}
	onNode := []map[string]any{layer("node1"), layer("node2")}
	parents := [][]map[string]any{
		{layer("grandparent-dr"), layer("grandparent")},
		{layer("parent-dr"), layer("parent")},
	}
	own := []map[string]any{layer("user"), layer("system")}
	all := []string{"node1", "node2", "grandparent-dr", "grandparent", "parent-dr", "parent", "user", "system"}

	seen := func(names ...string) m {
		out := m{}
		for _, n := range names {
			out[n] = true
		}
		return out
	}

	cases := []struct {
		name    string
		onNode  []map[string]any
		parents [][]map[string]any
		own     []map[string]any
		want    map[string]any
	}{
		{"own beats everything", onNode, parents, own, m{"who": "system", "seen": seen(all...)}},
		{"closest parents beat distant parents and node", onNode, parents, nil,
			m{"who": "parent", "seen": seen(all[:6]...)}},
		{"distant parents beat node", onNode, parents[:1], nil,
			m{"who": "grandparent", "seen": seen(all[:4]...)}},
		{"node alone", onNode, nil, nil, m{"who": "node2", "seen": seen("node1", "node2")}},
		{"own beats node without parents", onNode, nil, own[:1],
			m{"who": "user", "seen": seen("node1", "node2", "user")}},
		{"nil and empty sets skipped", []map[string]any{nil}, [][]map[string]any{nil, {}, {nil}}, []map[string]any{nil}, m{}},
		{"nothing", nil, nil, nil, m{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Visible(tc.onNode, tc.parents, tc.own))
		})
	}
}

func TestVisibleNestedAndImmutable(t *testing.T) {
	onNode := []map[string]any{{"ntp": m{"servers": l{"pool"}, "iburst": true}, "dns": m{"domain": "node"}}}
	parents := [][]map[string]any{
		{{"dns": m{"domain": "far", "search": l{"far"}}}},
		{{"dns": m{"domain": "near"}}},
	}
	own := []map[string]any{{"ntp": m{"servers": l{"10.0.0.1"}}}}
	snapshot := jsonCopy(t, m{"n": onNode, "p": parents, "o": own})

	got := Visible(onNode, parents, own)
	assert.Equal(t, m{
		"ntp": m{"servers": l{"10.0.0.1"}, "iburst": true},
		"dns": m{"domain": "near", "search": l{"far"}},
	}, got)
	got["dns"].(m)["search"].(l)[0] = "mutated"
	assert.Equal(t, snapshot, jsonCopy(t, m{"n": onNode, "p": parents, "o": own}))
}

type diffCase struct {
	name     string
	sent     map[string]any
	returned map[string]any
	want     map[string]any
}

var diffCases = []diffCase{
	{"both nil", nil, nil, m{}},
	{"both empty", m{}, m{}, m{}},
	{"unchanged", m{"a": 1.0, "b": m{"c": l{1.0, "x"}}}, m{"a": 1.0, "b": m{"c": l{1.0, "x"}}}, m{}},
	{"added top", m{"a": 1.0}, m{"a": 1.0, "b": "new"}, m{"b": "new"}},
	{"added to nil sent", nil, m{"a": m{"b": 1.0}}, m{"a": m{"b": 1.0}}},
	{"changed top", m{"a": 1.0, "b": 2.0}, m{"a": 1.0, "b": 3.0}, m{"b": 3.0}},
	{"deleted top", m{"a": 1.0, "b": 2.0}, m{"a": 1.0}, m{"b": Deleted()}},
	{"everything deleted", m{"a": 1.0, "b": m{"c": 2.0}}, nil, m{"a": Deleted(), "b": Deleted()}},
	{"changed to null", m{"a": 1.0}, m{"a": nil}, m{"a": nil}},
	{"null to value", m{"a": nil}, m{"a": false}, m{"a": false}},
	{
		"nested added changed deleted",
		m{"net": m{"ip": "10.0.0.1", "mtu": 1500.0, "gw": "10.0.0.254", "same": "s"}},
		m{"net": m{"ip": "10.0.0.1", "mtu": 9000.0, "dns": "10.0.0.53", "same": "s"}},
		m{"net": m{"mtu": 9000.0, "dns": "10.0.0.53", "gw": Deleted()}},
	},
	{
		"deep nested only changed leaf",
		m{"a": m{"b": m{"c": m{"d": 1.0, "e": 2.0}}, "f": 3.0}},
		m{"a": m{"b": m{"c": m{"d": 1.0, "e": 4.0}}, "f": 3.0}},
		m{"a": m{"b": m{"c": m{"e": 4.0}}}},
	},
	{"nested deleted leaf", m{"a": m{"b": m{"c": 1.0}}}, m{"a": m{"b": m{}}}, m{"a": m{"b": m{"c": Deleted()}}}},
	{"nested map emptied vs deleted", m{"a": m{"b": 1.0}, "c": m{"d": 1.0}}, m{"a": m{}}, m{"a": m{"b": Deleted()}, "c": Deleted()}},
	{"list unchanged", m{"l": l{1.0, 2.0}}, m{"l": l{1.0, 2.0}}, m{}},
	{"list element changed appears whole", m{"l": l{1.0, 2.0, 3.0}}, m{"l": l{1.0, 9.0, 3.0}}, m{"l": l{1.0, 9.0, 3.0}}},
	{"list appended appears whole", m{"l": l{1.0}}, m{"l": l{1.0, 2.0}}, m{"l": l{1.0, 2.0}}},
	{"list reordered appears whole", m{"l": l{1.0, 2.0}}, m{"l": l{2.0, 1.0}}, m{"l": l{2.0, 1.0}}},
	{"list emptied", m{"l": l{1.0}}, m{"l": l{}}, m{"l": l{}}},
	{"list of maps changed appears whole", m{"l": l{m{"a": 1.0}, m{"b": 2.0}}}, m{"l": l{m{"a": 1.0}, m{"b": 3.0}}}, m{"l": l{m{"a": 1.0}, m{"b": 3.0}}}},
	{"list of maps unchanged", m{"l": l{m{"a": 1.0}}}, m{"l": l{m{"a": 1.0}}}, m{}},
	{"nested list changed", m{"a": m{"l": l{"x"}, "k": 1.0}}, m{"a": m{"l": l{"y"}, "k": 1.0}}, m{"a": m{"l": l{"y"}}}},
	{"map to scalar", m{"a": m{"b": 1.0}}, m{"a": "flat"}, m{"a": "flat"}},
	{"scalar to map", m{"a": "flat"}, m{"a": m{"b": 1.0}}, m{"a": m{"b": 1.0}}},
	{"map to list", m{"a": m{"b": 1.0}}, m{"a": l{1.0}}, m{"a": l{1.0}}},
	{"list to map", m{"a": l{1.0}}, m{"a": m{"b": 1.0}}, m{"a": m{"b": 1.0}}},
	{"map to null", m{"a": m{"b": 1.0}}, m{"a": nil}, m{"a": nil}},
	{"null to map", m{"a": nil}, m{"a": m{"b": 1.0}}, m{"a": m{"b": 1.0}}},
	{"scalar to empty map", m{"a": 1.0}, m{"a": m{}}, m{"a": m{}}},
	{"number type change", m{"a": 1.0}, m{"a": "1"}, m{"a": "1"}},
	{"bool change", m{"a": true}, m{"a": false}, m{"a": false}},
	{"nil map equals empty map", m{"a": map[string]any(nil)}, m{"a": m{}}, m{}},
	// Returned data that looks like a directive is escaped so that it is
	// not mistaken for a deletion (or a wrapper) by Apply.
	{"literal marker added", m{}, m{"a": m{"$deleted": true}}, m{"a": m{"$value": m{"$deleted": true}}}},
	{"literal marker replaces scalar", m{"a": 1.0}, m{"a": m{"$deleted": true}}, m{"a": m{"$value": m{"$deleted": true}}}},
	{"literal wrapper added", m{}, m{"a": m{"$value": 1.0}}, m{"a": m{"$value": m{"$value": 1.0}}}},
	{"literal marker nested in added map", m{}, m{"a": m{"b": m{"$deleted": false}}}, m{"a": m{"b": m{"$value": m{"$deleted": false}}}}},
	{"literal marker added inside existing map", m{"a": m{}}, m{"a": m{"b": m{"$deleted": true}}}, m{"a": m{"b": m{"$value": m{"$deleted": true}}}}},
	{"literal marker becomes map with two keys", m{"a": m{"$deleted": true}}, m{"a": m{"$deleted": true, "x": 1.0}}, m{"a": m{"x": 1.0}}},
	{"map with marker key plus others is plain data", m{}, m{"a": m{"$deleted": true, "x": 1.0}}, m{"a": m{"$deleted": true, "x": 1.0}}},
	{"literal marker inside list needs no escape", m{}, m{"a": l{m{"$deleted": true}}}, m{"a": l{m{"$deleted": true}}}},
	{"marker removed from literal map", m{"a": m{"$deleted": true, "x": 1.0}}, m{"a": m{"x": 1.0}}, m{"a": m{"$value": m{"x": 1.0}}}},
	{"only changed nested key named like the wrapper", m{"a": m{"$value": 1.0, "x": 1.0}}, m{"a": m{"$value": 2.0, "x": 1.0}}, m{"a": m{"$value": m{"$value": 2.0, "x": 1.0}}}},
	{"directive-named key changed with others stays nested", m{"a": m{"$value": 1.0, "x": 1.0}}, m{"a": m{"$value": 2.0, "x": 2.0}}, m{"a": m{"$value": 2.0, "x": 2.0}}},
}

func TestDiff(t *testing.T) {
	for _, tc := range diffCases {
		t.Run(tc.name, func(t *testing.T) {
			sentBefore, returnedBefore := jsonCopy(t, tc.sent), jsonCopy(t, tc.returned)
			got := Diff(tc.sent, tc.returned)
			require.NotNil(t, got)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, sentBefore, jsonCopy(t, tc.sent), "sent mutated")
			assert.Equal(t, returnedBefore, jsonCopy(t, tc.returned), "returned mutated")
		})
	}
}

// normalize maps nil maps to empty ones, the documented equivalence.
func normalize(v map[string]any) map[string]any { return Clone(v) }

func assertRoundTrip(t *testing.T, sent, returned map[string]any) {
	t.Helper()
	sentBefore, returnedBefore := jsonCopy(t, sent), jsonCopy(t, returned)
	d := Diff(sent, returned)
	dBefore := jsonCopy(t, d)

	assert.Equal(t, normalize(returned), Apply(sent, d), "Apply(sent, Diff(sent, returned))")
	// The wall is stored as JSON; it must still apply after a JSON trip.
	assert.Equal(t, normalize(returned), Apply(sent, jsonCopy(t, d)), "after JSON round trip of the diff")
	// Diffing a value against itself yields nothing.
	assert.Empty(t, Diff(returned, returned))
	assert.Equal(t, normalize(returned), Apply(returned, Diff(returned, returned)))

	assert.Equal(t, sentBefore, jsonCopy(t, sent), "sent mutated")
	assert.Equal(t, returnedBefore, jsonCopy(t, returned), "returned mutated")
	assert.Equal(t, dBefore, jsonCopy(t, d), "diff mutated by Apply")
}

func TestApplyRoundTripTable(t *testing.T) {
	for _, tc := range diffCases {
		t.Run(tc.name, func(t *testing.T) {
			assertRoundTrip(t, tc.sent, tc.returned)
			assertRoundTrip(t, tc.returned, tc.sent) // and back
		})
	}
}

func TestApply(t *testing.T) {
	cases := []struct {
		name       string
		base, diff map[string]any
		want       map[string]any
	}{
		{"nil base nil diff", nil, nil, m{}},
		{"empty diff copies base", m{"a": m{"b": 1.0}}, m{}, m{"a": m{"b": 1.0}}},
		{"delete absent key is a no-op", m{"a": 1.0}, m{"b": Deleted()}, m{"a": 1.0}},
		{"nested delete", m{"a": m{"b": 1.0, "c": 2.0}}, m{"a": m{"b": Deleted()}}, m{"a": m{"c": 2.0}}},
		{"wrapper stored verbatim", m{}, m{"a": m{"$value": m{"$deleted": true}}}, m{"a": m{"$deleted": true}}},
		// A nested diff applied where base has no map must not leak markers.
		{"nested diff onto scalar", m{"a": 1.0}, m{"a": m{"b": 2.0, "c": Deleted()}}, m{"a": m{"b": 2.0}}},
		{"list replaces", m{"a": l{1.0, 2.0}}, m{"a": l{3.0}}, m{"a": l{3.0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			baseBefore, diffBefore := jsonCopy(t, tc.base), jsonCopy(t, tc.diff)
			assert.Equal(t, tc.want, Apply(tc.base, tc.diff))
			assert.Equal(t, baseBefore, jsonCopy(t, tc.base), "base mutated")
			assert.Equal(t, diffBefore, jsonCopy(t, tc.diff), "diff mutated")
		})
	}
}

func TestApplyResultSharesNothing(t *testing.T) {
	base := m{"a": m{"b": l{1.0}}}
	diff := m{"c": m{"d": l{2.0}}, "e": m{"$value": m{"$deleted": true}}}
	got := Apply(base, diff)
	got["a"].(m)["b"].(l)[0] = "x"
	got["c"].(m)["d"].(l)[0] = "x"
	got["e"].(m)["$deleted"] = "x"
	assert.Equal(t, m{"a": m{"b": l{1.0}}}, base)
	assert.Equal(t, m{"c": m{"d": l{2.0}}, "e": m{"$value": m{"$deleted": true}}}, diff)
}

func TestDeletedMarker(t *testing.T) {
	assert.Equal(t, m{"$deleted": true}, Deleted())
	b, err := json.Marshal(Deleted())
	require.NoError(t, err)
	assert.JSONEq(t, `{"$deleted": true}`, string(b))
	assert.True(t, IsDeleted(Deleted()))
	assert.False(t, IsDeleted(m{"$deleted": true, "x": 1.0}))
	assert.False(t, IsDeleted(m{"$value": true}))
	assert.False(t, IsDeleted(true))
	assert.False(t, IsDeleted(nil))

	// Each call returns a fresh map, so a caller cannot corrupt the marker.
	Deleted()[DeletedKey] = false
	assert.Equal(t, true, Deleted()[DeletedKey])
}

// genValue produces a JSON-like value: the shapes encoding/json decodes,
// plus, now and then, maps that look like directives to exercise escaping.
func genValue(r *rand.Rand, depth int) any {
	choice := r.Intn(10)
	if depth <= 0 && choice >= 6 {
		choice = r.Intn(6)
	}
	switch choice {
	case 0:
		return nil
	case 1:
		return r.Intn(2) == 0
	case 2, 3:
		return float64(r.Intn(5))
	case 4, 5:
		return fmt.Sprintf("s%d", r.Intn(4))
	case 6:
		n := r.Intn(4)
		out := make([]any, n)
		for i := range out {
			out[i] = genValue(r, depth-1)
		}
		return out
	case 7:
		if r.Intn(2) == 0 {
			return m{DeletedKey: genValue(r, depth-1)}
		}
		return m{ValueKey: genValue(r, depth-1)}
	default:
		return genMap(r, depth-1)
	}
}

var genKeys = []string{"a", "b", "c", "d", "e", DeletedKey, ValueKey}

func genMap(r *rand.Rand, depth int) map[string]any {
	out := m{}
	for range r.Intn(5) {
		out[genKeys[r.Intn(len(genKeys))]] = genValue(r, depth)
	}
	return out
}

// mutate returns a copy of v with random edits (add, change, delete,
// change type), recursing into maps so nested diffs are exercised.
func mutate(r *rand.Rand, v map[string]any, depth int) map[string]any {
	out := Clone(v)
	for k, e := range out {
		switch r.Intn(6) {
		case 0:
			delete(out, k)
		case 1:
			out[k] = genValue(r, depth)
		case 2:
			if sub, ok := e.(map[string]any); ok {
				out[k] = mutate(r, sub, depth-1)
			}
		default: // keep most keys, so diffs stay partial
		}
	}
	if r.Intn(3) == 0 {
		out[genKeys[r.Intn(len(genKeys))]] = genValue(r, depth)
	}
	return out
}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewSource(20240601))
	for i := range 2000 {
		sent := genMap(r, 4)
		var returned map[string]any
		if r.Intn(5) == 0 {
			returned = genMap(r, 4) // unrelated blob
		} else {
			returned = mutate(r, sent, 3)
		}
		// Go through JSON so the inputs are exactly what a jig would send.
		sent, returned = jsonCopy(t, sent), jsonCopy(t, returned)
		ok := t.Run(fmt.Sprint(i), func(t *testing.T) {
			assertRoundTrip(t, sent, returned)
		})
		if !ok {
			t.Logf("sent=%v\nreturned=%v\ndiff=%v", sent, returned, Diff(sent, returned))
			return
		}
	}
}
