package aeolus_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models/audrey/aeolus"
)

// The seed's three examples, verbatim.
const seedTemplate = `<template name="Template1">
  <os>
    <name>Fedora</name>
    <version>14</version>
  </os>
  <description>This is a template</description>
  <services>
    <service name="service-name">
      <scripts>
        <script>puppet-class-name</script>
        <script>puppet-class-name</script>
      </scripts>
      <parameter name="param-name" type="scalar" required="true"/> <!-- a parameter that must have a value in an assembly -->
      <parameter name="param2-name" type="scalar" provided="true"/> <!-- a parameter whose value can be used by other assemblies in a deployable -->
    </service>
  </services>
</template>`

const seedAssembly = `<assembly name="AssemblyType">
  <template type="Template1"/>
  <services>
    <service name="service-name">
      <parameter name="param-name">
        <value><![CDATA[Parameter Value]]></value>
      </parameter>
      <parameter name="another-parameter">
        <reference assembly="AnotherAssembly" provided-parameter="param-from-another-assembly"/>
      </parameter>
    </service>
  </services>
</assembly>`

const seedDeployable = `<deployable name="Deployable1">
  <assemblies>
    <assembly name="FirstAssembly" type="AssemblyType" hwp="large"/>
    <assembly name="SecondAssembly" type="AssemblyType" hwp="large"/>
  </assemblies>
</deployable>`

// shop: a database providing connection data to two app servers that
// reference it by type (all: the list of hosts; first: the port), one not
// allowing partial configs and one allowing them for its service; a monitor
// references the database by name and the app servers by service.
const shopXML = `<audrey>
<templates>
<template name="db-tpl">
  <os><name>Fedora</name><version>14</version></os>
  <services>
    <service name="mysql">
      <scripts><script>mysql::server</script></scripts>
      <parameter name="root_password" type="scalar" required="true"/>
      <parameter name="db_host" type="scalar" provided="true"/>
      <parameter name="db_port" type="scalar" provided="true"/>
    </service>
  </services>
</template>
<template name="app-tpl">
  <services>
    <service name="jboss">
      <scripts><script>jboss::server</script></scripts>
      <parameter name="db_hosts" type="list" required="true"/>
      <parameter name="db_port" type="scalar" required="true"/>
      <parameter name="app_url" type="scalar" provided="true"/>
    </service>
  </services>
</template>
<template name="mon-tpl">
  <services>
    <service name="nagios">
      <parameter name="db" required="true"/>
      <parameter name="first_app" required="true"/>
      <parameter name="apps" required="true"/>
      <parameter name="note"/>
    </service>
  </services>
</template>
</templates>
<assemblies>
<assembly name="mysql">
  <template type="db-tpl"/>
  <services><service name="mysql">
    <parameter name="root_password"><value><![CDATA[s3cret]]></value></parameter>
  </service></services>
</assembly>
<assembly name="app-server" allow-partial="false">
  <template type="app-tpl"/>
  <services><service name="jboss">
    <parameter name="db_hosts"><reference assembly-type="mysql" provided-parameter="db_host"/></parameter>
    <parameter name="db_port"><reference assembly-type="mysql" match-type="first" provided-parameter="db_port"/></parameter>
  </service></services>
</assembly>
<assembly name="app-server-partial">
  <template type="app-tpl"/>
  <services><service name="jboss" allow-partial="true">
    <parameter name="db_hosts"><reference assembly-type="mysql" match-type="all" provided-parameter="db_host"/></parameter>
    <parameter name="db_port"><reference assembly-type="mysql" match-type="first" provided-parameter="db_port"/></parameter>
  </service></services>
</assembly>
<assembly name="monitor" allow-partial="true">
  <template type="mon-tpl"/>
  <services><service name="nagios">
    <parameter name="db"><reference assembly="db" provided-parameter="db_host"/></parameter>
    <parameter name="first_app"><reference service="jboss" match-type="first" provided-parameter="app_url"/></parameter>
    <parameter name="apps"><reference service="jboss" provided-parameter="app_url"/></parameter>
  </service></services>
</assembly>
</assemblies>
<deployable name="shop">
  <assemblies>
    <assembly name="db" type="mysql" hwp="large"/>
    <assembly name="app1" type="app-server" hwp="small"/>
    <assembly name="app2" type="app-server-partial" hwp="small"/>
    <assembly name="mon" type="monitor"/>
  </assemblies>
</deployable>
</audrey>`

const shopYAML = `
templates:
  - name: db-tpl
    os: {name: Fedora, version: "14"}
    services:
      - name: mysql
        scripts: ["mysql::server"]
        parameters:
          - {name: root_password, type: scalar, required: true}
          - {name: db_host, type: scalar, provided: true}
          - {name: db_port, type: scalar, provided: true}
  - name: app-tpl
    services:
      - name: jboss
        scripts: ["jboss::server"]
        parameters:
          - {name: db_hosts, type: list, required: true}
          - {name: db_port, type: scalar, required: true}
          - {name: app_url, type: scalar, provided: true}
  - name: mon-tpl
    services:
      - name: nagios
        parameters:
          - {name: db, required: true}
          - {name: first_app, required: true}
          - {name: apps, required: true}
          - {name: note}
assemblies:
  - name: mysql
    template: db-tpl
    services:
      - name: mysql
        parameters:
          - {name: root_password, value: s3cret}
  - name: app-server
    template: app-tpl
    allow_partial: false
    services:
      - name: jboss
        parameters:
          - {name: db_hosts, reference: {assembly_type: mysql, provided_parameter: db_host}}
          - {name: db_port, reference: {assembly_type: mysql, match_type: first, provided_parameter: db_port}}
  - name: app-server-partial
    template: app-tpl
    services:
      - name: jboss
        allow_partial: true
        parameters:
          - {name: db_hosts, reference: {assembly_type: mysql, match_type: all, provided_parameter: db_host}}
          - {name: db_port, reference: {assembly_type: mysql, match_type: first, provided_parameter: db_port}}
  - name: monitor
    template: mon-tpl
    allow_partial: true
    services:
      - name: nagios
        parameters:
          - {name: db, reference: {assembly: db, provided_parameter: db_host}}
          - {name: first_app, reference: {service: jboss, match_type: first, provided_parameter: app_url}}
          - {name: apps, reference: {service: jboss, provided_parameter: app_url}}
deployable:
  name: shop
  assemblies:
    - {name: db, type: mysql, hwp: large}
    - {name: app1, type: app-server, hwp: small}
    - {name: app2, type: app-server-partial, hwp: small}
    - {name: mon, type: monitor}
`

func TestParseSeedExamples(t *testing.T) {
	doc, err := aeolus.ParseXML([]byte(seedTemplate + "\n" + seedAssembly + "\n" + seedDeployable))
	require.NoError(t, err)
	require.Len(t, doc.Templates, 1)
	tpl := doc.Templates[0]
	assert.Equal(t, "Template1", tpl.Name)
	assert.Equal(t, aeolus.OS{Name: "Fedora", Version: "14"}, tpl.OS)
	assert.Equal(t, "This is a template", tpl.Description)
	require.Len(t, tpl.Services, 1)
	assert.Equal(t, []string{"puppet-class-name", "puppet-class-name"}, tpl.Services[0].Scripts)
	assert.Equal(t, []aeolus.Parameter{
		{Name: "param-name", Type: "scalar", Required: true},
		{Name: "param2-name", Type: "scalar", Provided: true},
	}, tpl.Services[0].Parameters)

	require.Len(t, doc.Assemblies, 1)
	a := doc.Assemblies[0]
	assert.Equal(t, "AssemblyType", a.Name)
	assert.Equal(t, "Template1", a.Template)
	require.Len(t, a.Services[0].Parameters, 2)
	assert.Equal(t, "Parameter Value", *a.Services[0].Parameters[0].Value)
	assert.Equal(t, &aeolus.Reference{Assembly: "AnotherAssembly", ProvidedParameter: "param-from-another-assembly"}, a.Services[0].Parameters[1].Reference)

	assert.Equal(t, aeolus.Deployable{Name: "Deployable1", Assemblies: []aeolus.DeployableAssembly{
		{Name: "FirstAssembly", Type: "AssemblyType", HWP: "large"},
		{Name: "SecondAssembly", Type: "AssemblyType", HWP: "large"},
	}}, doc.Deployable)

	// The seed's assembly gives a parameter its template lacks and refers
	// to an assembly the deployable does not have.
	errs := aeolus.Validate(doc)
	require.Len(t, errs, 1, errs.Error())
	assert.Equal(t, "assembly[AssemblyType].service[service-name].parameter[another-parameter]", errs[0].Field)
	assert.Contains(t, errs[0].Reason, `has no parameter "another-parameter"`)
}

func TestYAMLMatchesXML(t *testing.T) {
	x, err := aeolus.ParseXML([]byte(shopXML))
	require.NoError(t, err)
	y, err := aeolus.ParseYAML([]byte(shopYAML))
	require.NoError(t, err)
	// The same document in both syntaxes.
	assert.Equal(t, x, y)
	assert.Empty(t, aeolus.Validate(x))
}

func TestSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		yaml       bool
		line       int
	}{
		{name: "unclosed xml", body: "<audrey>\n<template name=\"x\">\n</audrey>", line: 3},
		{name: "empty xml", body: "", line: 0},
		{name: "bad yaml", body: "templates:\n  - name: x\n   bad: [\n", yaml: true, line: -1},
		{name: "unknown yaml field", body: "templates: []\nfoo: 1\n", yaml: true, line: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.yaml {
				_, err = aeolus.ParseYAML([]byte(tc.body))
			} else {
				_, err = aeolus.ParseXML([]byte(tc.body))
			}
			var se *aeolus.SyntaxError
			require.True(t, errors.As(err, &se), "%v", err)
			switch {
			case tc.line > 0:
				assert.Equal(t, tc.line, se.Line, se.Error())
			case tc.line < 0:
				assert.Positive(t, se.Line, se.Error())
			}
		})
	}
}

func TestValidationErrors(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		field, reason  string
	}{
		{"missing required value", `<parameter name="root_password"><value><![CDATA[s3cret]]></value></parameter>`, ``,
			"assembly[mysql].service[mysql].parameter[root_password]", "neither a value nor a reference"},
		{"unknown assembly name", `<reference assembly="db"`, `<reference assembly="nodb"`,
			"assembly[monitor].service[nagios].parameter[db].reference.assembly", `no assembly named "nodb"`},
		{"unknown assembly type", `<reference assembly-type="mysql" provided-parameter="db_host"/></parameter>
    <parameter name="db_port"><reference assembly-type="mysql" match-type="first" provided-parameter="db_port"/></parameter>
  </service></services>
</assembly>
<assembly name="app-server-partial">`, `<reference assembly-type="postgres" provided-parameter="db_host"/></parameter>
    <parameter name="db_port"><reference assembly-type="mysql" match-type="first" provided-parameter="db_port"/></parameter>
  </service></services>
</assembly>
<assembly name="app-server-partial">`,
			"assembly[app-server].service[jboss].parameter[db_hosts].reference.assembly-type", `no assembly type "postgres"`},
		{"unknown service", `<reference service="jboss" match-type="first"`, `<reference service="tomcat" match-type="first"`,
			"assembly[monitor].service[nagios].parameter[first_app].reference.service", `no template defines a service "tomcat"`},
		{"not a provided parameter", `<reference assembly="db" provided-parameter="db_host"/>`, `<reference assembly="db" provided-parameter="root_password"/>`,
			"assembly[monitor].service[nagios].parameter[db].reference.provided-parameter", `provides no parameter "root_password"`},
		{"duplicate instance", `<assembly name="app2"`, `<assembly name="app1"`,
			"deployable.assemblies[2].name", `"app1" is used twice`},
		{"duplicate template", `<template name="mon-tpl">`, `<template name="app-tpl">`,
			"templates[2].name", `template "app-tpl" is defined twice`},
		{"unknown instance type", `<assembly name="mon" type="monitor"/>`, `<assembly name="mon" type="monitors"/>`,
			"deployable.assemblies[3].type", `no assembly named "monitors"`},
		{"unknown template", `<template type="mon-tpl"/>`, `<template type="nope"/>`,
			"assembly[monitor].template", `no template named "nope"`},
		{"bad match type", `match-type="all"`, `match-type="some"`,
			"assembly[app-server-partial].service[jboss].parameter[db_hosts].reference.match-type", "must be all or first"},
		{"match type on a name reference", `<reference assembly="db"`, `<reference match-type="first" assembly="db"`,
			"assembly[monitor].service[nagios].parameter[db].reference.match-type", "only applies"},
		{"two targets", `<reference assembly="db"`, `<reference service="jboss" assembly="db"`,
			"assembly[monitor].service[nagios].parameter[db].reference", "exactly one of"},
		{"value and reference", `<parameter name="db"><reference`, `<parameter name="db"><value>x</value><reference`,
			"assembly[monitor].service[nagios].parameter[db]", "both a value and a reference"},
		{"an instance removed, nothing refers to it", `<assembly name="app2" type="app-server-partial" hwp="small"/>`, ``,
			"", ""}, // an assembly type without instances is fine when unreferenced
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Replace(shopXML, tc.from, tc.to, 1)
			require.NotEqual(t, shopXML, body, "fixture edit did not apply")
			doc, err := aeolus.ParseXML([]byte(body))
			var errs aeolus.Errors
			if err != nil {
				require.True(t, errors.As(err, &errs), "%v", err)
			} else {
				errs = aeolus.Validate(doc)
			}
			if tc.field == "" {
				assert.Empty(t, errs)
				return
			}
			require.NotEmpty(t, errs)
			assert.Equal(t, tc.field, errs[0].Field, errs.Error())
			assert.Contains(t, errs[0].Reason, tc.reason)
		})
	}
}

func shop(t *testing.T) []aeolus.InstanceConfig {
	doc, err := aeolus.ParseXML([]byte(shopXML))
	require.NoError(t, err)
	require.Empty(t, aeolus.Validate(doc))
	n := 0
	insts := aeolus.BuildInstances(doc, "dep-uuid", func() string { n++; return fmt.Sprintf("uuid-%d", n) })
	require.Empty(t, aeolus.ValidateInstances(insts))
	return insts
}

func TestNoDeployable(t *testing.T) {
	_, err := aeolus.ParseXML([]byte(seedTemplate + seedAssembly))
	var errs aeolus.Errors
	require.True(t, errors.As(err, &errs), "%v", err)
	assert.Equal(t, "deployable", errs[0].Field)
	assert.Contains(t, errs[0].Reason, "no <deployable> element")
}

func TestBuildInstancesAndEdges(t *testing.T) {
	insts := shop(t)
	require.Len(t, insts, 4)
	db := insts[0]
	assert.Equal(t, "uuid-1", db.ID)
	assert.Equal(t, "db", db.Name)
	assert.Equal(t, "mysql", db.Type)
	assert.Equal(t, []string{"db_host", "db_port"}, db.Provided)
	assert.Equal(t, "s3cret", *db.Services[0].Parameters[0].Value)

	assert.Equal(t, []aeolus.Edge{
		{From: "db", To: "app1", Parameter: "jboss.db_hosts", Provided: "db_host"},
		{From: "db", To: "app1", Parameter: "jboss.db_port", Provided: "db_port"},
		{From: "db", To: "app2", Parameter: "jboss.db_hosts", Provided: "db_host"},
		{From: "db", To: "app2", Parameter: "jboss.db_port", Provided: "db_port"},
		{From: "db", To: "mon", Parameter: "nagios.db", Provided: "db_host"},
		{From: "app1", To: "mon", Parameter: "nagios.first_app", Provided: "app_url"},
		{From: "app2", To: "mon", Parameter: "nagios.first_app", Provided: "app_url"},
		{From: "app1", To: "mon", Parameter: "nagios.apps", Provided: "app_url"},
		{From: "app2", To: "mon", Parameter: "nagios.apps", Provided: "app_url"},
	}, aeolus.Edges(insts))

	// The document round-trips through the seed's instance-config XML.
	for _, ic := range insts {
		back, err := aeolus.ParseInstanceConfig(aeolus.InstanceConfigXML(&ic))
		require.NoError(t, err)
		assert.Equal(t, ic, *back)
	}
}

func values(res aeolus.Resolution) map[string][]string {
	out := map[string][]string{}
	for _, s := range res.Services {
		for _, p := range s.Params {
			if p.Resolved {
				out[s.Name+"."+p.Name] = p.Values
			}
		}
	}
	return out
}

func TestResolveReferences(t *testing.T) {
	insts := shop(t)
	replies := aeolus.Replies{}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	type want struct {
		complete, partial bool
		values            map[string][]string
	}
	steps := []struct {
		name  string
		reply func()
		want  map[string]want // by instance name
	}{
		{"nothing reported", func() {}, map[string]want{
			"db":   {true, true, map[string][]string{"mysql.root_password": {"s3cret"}}},
			"app1": {false, false, map[string][]string{}}, // 204: app-server allows no partial config
			"app2": {false, true, map[string][]string{}},  // 202: its service allows it
			"mon":  {false, true, map[string][]string{}},
		}},
		{"db reports its host only", func() {
			replies["uuid-1"] = map[string]aeolus.Reply{"db_host": {Value: "10.0.0.5", At: t0}}
		}, map[string]want{
			"app1": {false, false, map[string][]string{"jboss.db_hosts": {"10.0.0.5"}}},
			"mon":  {false, true, map[string][]string{"nagios.db": {"10.0.0.5"}}},
		}},
		{"db reports its port", func() {
			replies["uuid-1"]["db_port"] = aeolus.Reply{Value: "3306", At: t0.Add(time.Second)}
		}, map[string]want{
			"app1": {true, true, map[string][]string{"jboss.db_hosts": {"10.0.0.5"}, "jboss.db_port": {"3306"}}},
			"app2": {true, true, map[string][]string{"jboss.db_hosts": {"10.0.0.5"}, "jboss.db_port": {"3306"}}},
		}},
		{"app2 reports first, then app1", func() {
			replies["uuid-3"] = map[string]aeolus.Reply{"app_url": {Value: "http://app2", At: t0.Add(2 * time.Second)}}
		}, map[string]want{
			"mon": {false, true, map[string][]string{"nagios.db": {"10.0.0.5"}, "nagios.first_app": {"http://app2"}}},
		}},
		{"app1 reports", func() {
			replies["uuid-2"] = map[string]aeolus.Reply{"app_url": {Value: "http://app1", At: t0.Add(3 * time.Second)}}
		}, map[string]want{
			// all: deployable order; first: the earliest report
			"mon": {true, true, map[string][]string{"nagios.db": {"10.0.0.5"}, "nagios.first_app": {"http://app2"}, "nagios.apps": {"http://app1", "http://app2"}}},
		}},
	}
	for _, step := range steps {
		step.reply()
		for i, ic := range insts {
			w, ok := step.want[ic.Name]
			if !ok {
				continue
			}
			res := aeolus.Resolve(insts, i, replies)
			assert.Equal(t, w.complete, res.Complete, "%s: %s complete", step.name, ic.Name)
			if !w.complete {
				assert.Equal(t, w.partial, res.PartialAllowed, "%s: %s partial", step.name, ic.Name)
			}
			got := values(res)
			delete(got, "mysql.root_password")
			if ic.Name == "db" {
				got = values(res)
			}
			assert.Equal(t, w.values, got, "%s: %s values", step.name, ic.Name)
		}
	}
	// The complete config renders values, a list as type="list".
	out := string(aeolus.ResolvedConfigXML(aeolus.Resolve(insts, 3, replies)))
	assert.Contains(t, out, `<parameter name="apps" type="list">`)
	assert.Contains(t, out, `<value>http://app1</value>`)
	assert.NotContains(t, out, "<reference")
	assert.Equal(t, []string{}, aeolus.PendingProvided(&insts[0], replies))
	assert.Equal(t, []string{"app_url"}, aeolus.PendingProvided(&insts[1], aeolus.Replies{}))
}

const deadlockXML = `<audrey>
<template name="t">
  <services><service name="s">
    <parameter name="in" required="true"/>
    <parameter name="out" provided="true"/>
  </service></services>
</template>
<assembly name="a">
  <template type="t"/>
  <services><service name="s"><parameter name="in"><reference assembly="b" provided-parameter="out"/></parameter></service></services>
</assembly>
<assembly name="b">
  <template type="t"/>
  <services><service name="s"><parameter name="in"><reference assembly-type="c" match-type="first" provided-parameter="out"/></parameter></service></services>
</assembly>
<assembly name="c">
  <template type="t"/>
  <services><service name="s"><parameter name="in"><reference assembly="a" provided-parameter="out"/></parameter></service></services>
</assembly>
<deployable name="dl">
  <assemblies>
    <assembly name="a" type="a"/>
    <assembly name="b" type="b"/>
    <assembly name="c" type="c"/>
  </assemblies>
</deployable>
</audrey>`

func TestDeadlock(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		cycle          []string
	}{
		{"three instances", "", "", []string{"a", "c", "b", "a"}},
		{"self reference by service", `<reference assembly="b" provided-parameter="out"/>`, `<reference service="s" provided-parameter="out"/>`, []string{"a", "a"}},
		{"no cycle", `<reference assembly="a" provided-parameter="out"/>`, `<value>x</value>`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := aeolus.ParseXML([]byte(strings.Replace(deadlockXML, tc.from, tc.to, 1)))
			require.NoError(t, err)
			require.Empty(t, aeolus.Validate(doc))
			insts := aeolus.BuildInstances(doc, "d", func() string { return "x" })
			errs := aeolus.ValidateInstances(insts)
			if tc.cycle == nil {
				assert.Empty(t, errs)
				return
			}
			require.Len(t, errs, 1)
			assert.Equal(t, tc.cycle, errs[0].Cycle)
			assert.Contains(t, errs[0].Reason, strings.Join(tc.cycle, " -> "))
		})
	}
}

func TestReplyAndInstanceConfigDocuments(t *testing.T) {
	vals, order, err := aeolus.ParseReply(aeolus.ReplyXML(map[string]string{"db_host": "10.0.0.5", "db_port": "3306"}, []string{"db_host", "db_port"}))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"db_host": "10.0.0.5", "db_port": "3306"}, vals)
	assert.Equal(t, []string{"db_host", "db_port"}, order)

	_, _, err = aeolus.ParseReply([]byte(`<provided-parameters><provided-parameter name="x"/></provided-parameters>`))
	var errs aeolus.Errors
	require.True(t, errors.As(err, &errs))
	assert.Equal(t, "provided-parameters[0].value", errs[0].Field)

	// The seed's instance-config example parses.
	ic, err := aeolus.ParseInstanceConfig([]byte(`<instance-config id="INSTANCE_UUID" type="AssemblyType" name="AssemblyName">
  <deployable name="DeployableName" id="DEPLOYABLE_UUID"/>
  <template name="TemplateName"/>
  <provided-parameters>
    <provided-parameter name="param-name"/>
  </provided-parameters>
  <services>
    <service name="service-name">
      <scripts>
        <script name="puppet-class-name"/>
        <script name="puppet-class-name"/>
      </scripts>
      <parameter name="param1-name">
        <value><![CDATA[Param1 Value]]></value>
      </parameter>
      <parameter name="param2-name">
        <reference assembly="Assembly2Name" provided-parameter="parameter-from-assembly2"/>
      </parameter>
    </service>
  </services>
</instance-config>`))
	require.NoError(t, err)
	assert.Equal(t, "INSTANCE_UUID", ic.ID)
	assert.Equal(t, "DEPLOYABLE_UUID", ic.DeployableID)
	assert.Equal(t, []string{"param-name"}, ic.Provided)
	assert.Equal(t, "Param1 Value", *ic.Services[0].Parameters[0].Value)
	assert.Equal(t, "Assembly2Name", ic.Services[0].Parameters[1].Reference.Assembly)
}
