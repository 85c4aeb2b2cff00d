package aeolus_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models/audrey/aeolus"
)

// bound is far above what parsing and checking a fuzz input takes (well
// under a millisecond): exceeding it means work grows out of proportion to
// the input, e.g. exponentially with nesting or YAML aliases.
const bound = 5 * time.Second

// maxInput caps fuzz inputs: the API reads bodies of a few MiB at most, and
// the bound above is meant for inputs of this size.
const maxInput = 64 << 10

// within runs fn and fails the test when it has not returned after bound,
// so that the fuzzer records a slow input as a failure instead of hanging.
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

// checkParseError checks that a refused document says where or what: a
// *SyntaxError with a message and a line inside the document (or none), or
// Errors each naming a field.
func checkParseError(t *testing.T, data []byte, err error) {
	t.Helper()
	var se *aeolus.SyntaxError
	var errs aeolus.Errors
	switch {
	case errors.As(err, &se):
		if se.Msg == "" {
			t.Fatalf("syntax error without a message: %#v", se)
		}
		if lines := bytes.Count(data, []byte("\n")) + 1; se.Line < 0 || se.Line > lines {
			t.Fatalf("syntax error at line %d of a %d-line document: %v", se.Line, lines, se)
		}
	case errors.As(err, &errs):
		checkErrors(t, errs)
	default:
		t.Fatalf("error %T %v is neither a SyntaxError nor Errors", err, err)
	}
}

func checkErrors(t *testing.T, errs aeolus.Errors) {
	t.Helper()
	if len(errs) == 0 {
		t.Fatalf("empty Errors returned as an error")
	}
	for _, e := range errs {
		if e.Field == "" || e.Reason == "" {
			t.Fatalf("validation error without a field or reason: %#v", e)
		}
	}
}

// FuzzParseDeployable runs a deployable document (XML, or YAML when asYAML)
// through what an import does: parse, Validate, BuildInstances,
// ValidateInstances, and what the config server does with each instance
// (Resolve, InstanceConfigXML read back by ParseInstanceConfig). Errors name
// a line or a field; an accepted document re-encodes as YAML to the same
// document; every instance config survives its XML round trip; all of it
// within a time bound.
func FuzzParseDeployable(f *testing.F) {
	f.Add([]byte(shopXML), false)
	f.Add([]byte(shopYAML), true)
	f.Add([]byte(seedTemplate+"\n"+seedAssembly+"\n"+seedDeployable), false)
	f.Add([]byte(deadlockXML), false)
	f.Add([]byte(seedTemplate+seedAssembly), false)
	f.Add([]byte("<audrey><deployable name=\"d\"/><deployable name=\"e\"/></audrey>"), false)
	f.Add([]byte("<template name=\"t\"><services><service name=\"s\"><parameter name=\"p\" required=\"maybe\"/></service></services></template>"), false)
	f.Add([]byte("<a><b></a>"), false)
	f.Add([]byte(""), false)
	f.Add([]byte("templates: [\nassemblies: {}"), true)
	f.Add([]byte("templates: []\n---\ntemplates: []\n"), true)
	f.Add([]byte("a: &a [*a]\n"), true)
	f.Add([]byte("templates: &t [{name: x, services: []}]\nassemblies: []\ndeployable: {name: d, assemblies: []}\nbogus: 1\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, asYAML bool) {
		if len(data) > maxInput {
			return
		}
		within(t, "parsing and checking the document", func() { checkDeployable(t, data, asYAML) })
	})
}

func checkDeployable(t *testing.T, data []byte, asYAML bool) {
	parse := aeolus.ParseXML
	if asYAML {
		parse = aeolus.ParseYAML
	}
	doc, err := parse(data)
	if err != nil {
		checkParseError(t, data, err)
		return
	}
	// The document as YAML reads back to the same document.
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatalf("a parsed document does not encode as YAML: %v", err)
	}
	back, err := aeolus.ParseYAML(out)
	if err != nil {
		t.Fatalf("the document's YAML does not parse: %v\n%s", err, out)
	}
	if again, _ := yaml.Marshal(back); !bytes.Equal(out, again) {
		t.Fatalf("YAML round trip changed the document:\n%s\n%s", out, again)
	}

	errs := aeolus.Validate(doc)
	if got := aeolus.Validate(back); len(got) != len(errs) {
		t.Fatalf("Validate finds %d problems in the document and %d in its round trip", len(errs), len(got))
	}
	if len(errs) > 0 {
		checkErrors(t, errs)
		return
	}
	n := 0
	instances := aeolus.BuildInstances(doc, "dep-1", func() string { n++; return fmt.Sprintf("inst-%d", n) })
	if len(instances) != len(doc.Deployable.Assemblies) {
		t.Fatalf("%d instances for %d deployable assemblies", len(instances), len(doc.Deployable.Assemblies))
	}
	if errs := aeolus.ValidateInstances(instances); len(errs) > 0 {
		checkErrors(t, errs)
		if cycle := aeolus.FindCycle(instances); cycle != nil && (len(cycle) < 2 || cycle[0] != cycle[len(cycle)-1]) {
			t.Fatalf("cycle %q is not closed", cycle)
		}
		return
	}
	if cycle := aeolus.FindCycle(instances); cycle != nil {
		t.Fatalf("ValidateInstances accepted instances with the cycle %q", cycle)
	}
	names := map[string]bool{}
	for _, ic := range instances {
		names[ic.Name] = true
	}
	for _, e := range aeolus.Edges(instances) {
		if !names[e.From] || !names[e.To] || e.Provided == "" {
			t.Fatalf("edge %+v does not join two instances by a provided parameter", e)
		}
	}
	for i := range instances {
		ic := &instances[i]
		res := aeolus.Resolve(instances, i, aeolus.Replies{})
		if len(res.Services) != len(ic.Services) {
			t.Fatalf("resolution of %s has %d services, its config %d", ic.Name, len(res.Services), len(ic.Services))
		}
		_ = aeolus.ResolvedConfigXML(res)
		got, err := aeolus.ParseInstanceConfig(aeolus.InstanceConfigXML(ic))
		if err != nil {
			t.Fatalf("the config of instance %s does not parse back: %v\n%s", ic.Name, err, aeolus.InstanceConfigXML(ic))
		}
		if !reflect.DeepEqual(normalize(*got), normalize(*ic)) {
			t.Fatalf("the config of instance %s changed in its XML round trip:\n%#v\n%#v", ic.Name, *ic, *got)
		}
	}
}

// normalize makes empty and absent lists compare equal: XML cannot tell
// them apart.
func normalize(ic aeolus.InstanceConfig) aeolus.InstanceConfig {
	if len(ic.Provided) == 0 {
		ic.Provided = nil
	}
	if len(ic.Services) == 0 {
		ic.Services = nil
	}
	ic.Services = slices.Clone(ic.Services)
	for i := range ic.Services {
		s := &ic.Services[i]
		if len(s.Scripts) == 0 {
			s.Scripts = nil
		}
		if len(s.Parameters) == 0 {
			s.Parameters = nil
		}
	}
	return ic
}

// FuzzParseInstanceConfig reads instance-config documents (POST
// /configs/:uuid): errors name a line or a field; an accepted config
// renders to a document that parses back to the same config.
func FuzzParseInstanceConfig(f *testing.F) {
	doc, err := aeolus.ParseXML([]byte(shopXML))
	if err != nil {
		f.Fatal(err)
	}
	n := 0
	for _, ic := range aeolus.BuildInstances(doc, "dep-1", func() string { n++; return fmt.Sprintf("inst-%d", n) }) {
		f.Add(aeolus.InstanceConfigXML(&ic))
	}
	f.Add([]byte(`<instance-config id="i" type="t" name="n"><services><service name="s" allow-partial="yes"><parameter name="p"><value>1</value><reference provided-parameter="x"/></parameter></service></services></instance-config>`))
	f.Add([]byte(`<instance-config id="i" type="t" name="n"><provided-parameters><provided-parameter name="a"/><provided-parameter name="a"/></provided-parameters></instance-config>`))
	f.Add([]byte(`<instance-config/>`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxInput {
			return
		}
		within(t, "ParseInstanceConfig", func() {
			ic, err := aeolus.ParseInstanceConfig(data)
			if err != nil {
				checkParseError(t, data, err)
				return
			}
			out := aeolus.InstanceConfigXML(ic)
			back, err := aeolus.ParseInstanceConfig(out)
			if err != nil {
				t.Fatalf("a rendered config does not parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(normalize(*back), normalize(*ic)) {
				t.Fatalf("XML round trip changed the config:\n%#v\n%#v\n%s", *ic, *back, out)
			}
		})
	})
}

// FuzzParseReply reads PUT /reply bodies: errors name a line or a field; an
// accepted reply renders (ReplyXML) to a body that reads back the same.
func FuzzParseReply(f *testing.F) {
	f.Add(aeolus.ReplyXML(map[string]string{"db_host": "10.0.0.5", "db_port": "5432"}, []string{"db_host", "db_port"}))
	f.Add([]byte(`<provided-parameters><provided-parameter name="a"><value><![CDATA[x]]>y</value></provided-parameter></provided-parameters>`))
	f.Add([]byte(`<provided-parameters><provided-parameter name="a"/></provided-parameters>`))
	f.Add([]byte(`<provided-parameters><provided-parameter name="a"><value>1</value></provided-parameter><provided-parameter name="a"><value>2</value></provided-parameter></provided-parameters>`))
	f.Add([]byte(`<provided-parameters/>`))
	f.Add([]byte("<provided-parameters><provided-parameter name=\"a\"><value>\r\n</value></provided-parameter></provided-parameters>"))
	f.Add([]byte(`<other/>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxInput {
			return
		}
		within(t, "ParseReply", func() {
			values, order, err := aeolus.ParseReply(data)
			if err != nil {
				checkParseError(t, data, err)
				return
			}
			if len(order) != len(values) {
				t.Fatalf("order %q does not list the %d values", order, len(values))
			}
			out := aeolus.ReplyXML(values, order)
			values2, order2, err := aeolus.ParseReply(out)
			if err != nil {
				t.Fatalf("a rendered reply does not parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(values, values2) || !slices.Equal(order, order2) {
				t.Fatalf("reply round trip changed it:\n%q %q\n%q %q\n%s", values, order, values2, order2, out)
			}
		})
	})
}
