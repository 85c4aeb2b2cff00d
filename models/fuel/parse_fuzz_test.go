package fuel_test

// Fuzz targets for the pure parsing and validation of releases, graphs and
// scenarios. They call exported functions only (web.ParseRelease,
// fuel.ParseScenarioYAML, fuel.ValidateGraphType, fuel.GraphInput,
// models.RedundantRequirements, plan.Validate), so the file keeps
// compiling when these move, by changing the imports.

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/web"
)

// fuzzBound is far above what parsing a fuzz input takes: exceeding it
// means work grows out of proportion to the input (nesting, YAML aliases).
const fuzzBound = 5 * time.Second

// fuzzMaxInput caps fuzz inputs at a size the bound is meant for.
const fuzzMaxInput = 64 << 10

// within runs fn and fails the test when it has not returned after
// fuzzBound, so that the fuzzer records a slow input instead of hanging.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(fuzzBound):
		t.Fatalf("%s did not finish within %v", what, fuzzBound)
	}
}

// sampleFiles reads the shipped examples matching pattern (relative to the
// module root) as seeds; the fuzz test fails when there are none, so a
// moved example is noticed.
func sampleFiles(f *testing.F, pattern string) [][]byte {
	f.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", pattern))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no sample files %s (%v)", pattern, err)
	}
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// checkBodyError checks the error of a document parser: a 400 naming the
// body, with a reason.
func checkBodyError(t *testing.T, err error) {
	t.Helper()
	var ie *models.InputError
	if !errors.As(err, &ie) || ie.Status != 400 || ie.Field == "" || ie.Reason == "" {
		t.Fatalf("error %T %#v is not a 400 naming the body or a field", err, err)
	}
}

// checkTasksError checks a plan.Validate error: a *plan.ValidationError
// naming the field (and the task, for a task-level problem).
func checkTasksError(t *testing.T, tasks []plan.Task, err error) {
	t.Helper()
	var ve *plan.ValidationError
	if !errors.As(err, &ve) || ve.Field == "" || ve.Reason == "" {
		t.Fatalf("task validation error %#v names no field", err)
	}
	if ve.Task != "" && !strings.Contains(err.Error(), strconv.Quote(ve.Task)) {
		t.Fatalf("task validation error %q does not mention task %q", err, ve.Task)
	}
	if ve.Task == "" && ve.Field != "id" {
		t.Fatalf("task validation error %q names no task", err)
	}
}

// FuzzParseRelease parses release documents as POST /releases does
// (web.ParseRelease, YAML or JSON) and runs the release checks that need no
// database: every graph's plan.Validate and RedundantRequirements. A
// refused document is a 400 naming the body; an accepted one encodes as
// JSON (it is stored and answered as JSON), and that JSON parses back to a
// release encoding to the same bytes.
func FuzzParseRelease(f *testing.F) {
	for _, b := range sampleFiles(f, "scenarios/sample-release.yaml") {
		f.Add(b, false)
	}
	f.Add([]byte(`{"name":"r","version":"1","roles_metadata":{"a":{"requires":["b"]},"b":{"requires":["a"]}},"graphs":{"deployment":{"tasks":[{"id":"t","role":"a","requires":["u"]}]}}}`), true)
	f.Add([]byte(`{"name":"r","bogus":1}`), true)
	f.Add([]byte("name: r\nroles_metadata:\n  a: {template: {1: x, nested: {2: y}}}\n"), false)
	f.Add([]byte("name: r\nroles_metadata: &x {a: {requires: [a]}}\ngraphs: *x\n"), false)
	f.Add([]byte("name: [\n"), false)
	f.Add([]byte(""), false)
	f.Add([]byte("name: r\n---\nname: s\n"), false)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		if len(body) > fuzzMaxInput {
			return
		}
		ct := "application/yaml"
		if asJSON {
			ct = "application/json"
		}
		within(t, "parsing the release", func() {
			spec, err := web.ParseRelease(body, ct)
			if err != nil {
				checkBodyError(t, err)
				return
			}
			out, err := json.Marshal(spec)
			if err != nil {
				t.Fatalf("an accepted release cannot be stored as JSON: %v", err)
			}
			back, err := web.ParseRelease(out, "application/json")
			if err != nil {
				t.Fatalf("the release's JSON does not parse: %v\n%s", err, out)
			}
			if again, err := json.Marshal(back); err != nil || !bytes.Equal(out, again) {
				t.Fatalf("JSON round trip changed the release:\n%s\n%s", out, again)
			}
			requires := map[string][]string{}
			for name, role := range spec.RolesMetadata {
				requires[name] = role.Requires
			}
			for _, w := range models.RedundantRequirements(requires) {
				if !strings.HasPrefix(w, "role \"") {
					t.Fatalf("warning %q does not name its role", w)
				}
			}
			for _, g := range spec.Graphs {
				if err := plan.Validate(g.Tasks); err != nil {
					checkTasksError(t, g.Tasks, err)
				}
			}
		})
	})
}

// FuzzGraphInput decodes graph bodies as PUT .../graphs/:type does (strict
// JSON into fuel.GraphInput) and validates the type and the tasks. A
// refused graph names the field; an accepted one encodes and decodes to
// the same JSON and validates the same way again.
func FuzzGraphInput(f *testing.F) {
	for _, b := range sampleFiles(f, "scenarios/graphs/*.yaml") {
		var doc fuel.BuiltinGraphDoc
		if err := yaml.Unmarshal(b, &doc); err != nil {
			f.Fatalf("built-in graph: %v", err)
		}
		body, err := json.Marshal(fuel.GraphInput{Type: doc.Type, Name: &doc.Name, Tasks: doc.Tasks, Metadata: doc.Metadata})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body, doc.Type)
	}
	f.Add([]byte(`{"type":"deployment","name":"d","tasks":[{"id":"a","tags":["/contr/"],"requires":["b"]},{"id":"b","role":"*","cross_depends":[{"name":"/a/","role":"self"}]}]}`), "deployment")
	f.Add([]byte(`{"tasks":[{"id":"a"},{"id":"a"}]}`), "deployment")
	f.Add([]byte(`{"tasks":[{"id":"a","tags":["/(/"]}]}`), "x")
	f.Add([]byte(`{"tasks":[{"id":"a","parameters":{"timeout":-1}}]}`), "Bad Type")
	f.Add([]byte(`{"tasks":[{"id":"a","role":{"x":1}}]}`), "y")
	f.Fuzz(func(t *testing.T, body []byte, graphType string) {
		if len(body) > fuzzMaxInput {
			return
		}
		if err := fuel.ValidateGraphType(graphType); err != nil {
			var ie *models.InputError
			if !errors.As(err, &ie) || ie.Field != "type" {
				t.Fatalf("graph type error %#v does not name the field type", err)
			}
		}
		var in fuel.GraphInput
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return // decoding errors are the JSON package's, fuzzed in agent/protocol
		}
		verr := plan.Validate(in.Tasks)
		if verr != nil {
			checkTasksError(t, in.Tasks, verr)
		}
		out, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("a decoded graph does not encode: %v", err)
		}
		var back fuel.GraphInput
		dec = json.NewDecoder(bytes.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&back); err != nil {
			t.Fatalf("the encoded graph does not decode: %v\n%s", err, out)
		}
		if again, _ := json.Marshal(back); !bytes.Equal(out, again) {
			t.Fatalf("JSON round trip changed the graph:\n%s\n%s", out, again)
		}
		if verr2 := plan.Validate(back.Tasks); (verr == nil) != (verr2 == nil) || (verr != nil && verr.Error() != verr2.Error()) {
			t.Fatalf("validation changed in a round trip: %v, then %v", verr, verr2)
		}
	})
}

// FuzzParseScenarioYAML parses scenario documents (the built-in ones, or the
// POST /scenarios body as YAML). A refused document is a 400 naming the
// body; an accepted one encodes as JSON, and that parses back to the same
// scenario.
func FuzzParseScenarioYAML(f *testing.F) {
	for _, b := range sampleFiles(f, "scenarios/deploy-changes.yaml") {
		f.Add(b)
	}
	f.Add([]byte(`{"name": "computes-only", "scenario": [{"graph_type": "deployment", "nodes": {"expr": "\"compute\" in node.roles"}}]}`))
	f.Add([]byte("name: s\nscenario:\n  - graph_type: deployment\n    nodes: [1, 2, 3]\n    max_nodes_in_flight: 2\n    failure_threshold: 50\n"))
	f.Add([]byte("name: s\nscenario:\n  - graph_type: deployment\n    nodes: {yaql_exp: \"node.status == 'discover'\", ids: [1]}\n"))
	f.Add([]byte("name: s\nscenario: [{graph_type: x, nodes: {1: 2}}]\n"))
	f.Add([]byte("name: s\nscenario: [{graph_type: x, nodes: .inf}]\n"))
	f.Add([]byte("name: s\nunknown: 1\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, doc []byte) {
		if len(doc) > fuzzMaxInput {
			return
		}
		within(t, "parsing the scenario", func() {
			in, err := fuel.ParseScenarioYAML(doc)
			if err != nil {
				checkBodyError(t, err)
				return
			}
			out, err := json.Marshal(in)
			if err != nil {
				t.Fatalf("an accepted scenario does not encode as JSON: %v", err)
			}
			back, err := fuel.ParseScenarioYAML(out)
			if err != nil {
				t.Fatalf("the scenario's JSON does not parse: %v\n%s", err, out)
			}
			if again, err := json.Marshal(back); err != nil || !bytes.Equal(out, again) {
				t.Fatalf("JSON round trip changed the scenario:\n%s\n%s", out, again)
			}
			if len(back.Acts) != len(in.Acts) || back.Name != in.Name || !reflect.DeepEqual(back.Description, in.Description) {
				t.Fatalf("round trip changed the scenario: %#v, then %#v", in, back)
			}
		})
	})
}
