package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// siteXML: a database instance and two web instances that take the
// database's address and password from it. The database's service runs
// through the built-in script hook ("script:<shell>"); the web service
// through the node's own hook "webconf" (<hooks>/webconf). web1 may not
// configure partially (204 until the database replied); web2's "web"
// service allows it (202), so web2 applies its complete "base" service
// before the database has replied.
const siteXML = `<audrey>
<template name="db-tpl"><services>
  <service name="postgres">
    <scripts><script><![CDATA[script:printf '%s' "db-$ANNEAL_NODE" > "$heat_outputs_path.db_host"; printf '%s' "$admin_password" > "$heat_outputs_path.db_password"]]></script></scripts>
    <parameter name="admin_password" required="true"/>
    <parameter name="db_host" provided="true"/>
    <parameter name="db_password" provided="true"/>
  </service>
</services></template>
<template name="web-tpl"><services>
  <service name="base">
    <scripts><script>webconf:base</script></scripts>
    <parameter name="motd" required="true"/>
  </service>
  <service name="web">
    <scripts><script>webconf:site</script></scripts>
    <parameter name="db_host" required="true"/>
    <parameter name="db_password" required="true"/>
    <parameter name="web_url" provided="true"/>
  </service>
</services></template>
<assembly name="database">
  <template type="db-tpl"/>
  <services><service name="postgres">
    <parameter name="admin_password"><value><![CDATA[s3cret-pw]]></value></parameter>
  </service></services>
</assembly>
<assembly name="webserver">
  <template type="web-tpl"/>
  <services>
    <service name="base"><parameter name="motd"><value>hello</value></parameter></service>
    <service name="web">
      <parameter name="db_host"><reference assembly="db" provided-parameter="db_host"/></parameter>
      <parameter name="db_password"><reference assembly="db" provided-parameter="db_password"/></parameter>
    </service>
  </services>
</assembly>
<assembly name="webserver-partial">
  <template type="web-tpl"/>
  <services>
    <service name="base"><parameter name="motd"><value>hello</value></parameter></service>
    <service name="web" allow-partial="true">
      <parameter name="db_host"><reference assembly="db" provided-parameter="db_host"/></parameter>
      <parameter name="db_password"><reference assembly="db" provided-parameter="db_password"/></parameter>
    </service>
  </services>
</assembly>
<deployable name="site">
  <assemblies>
    <assembly name="db" type="database" hwp="large"/>
    <assembly name="web1" type="webserver" hwp="small"/>
    <assembly name="web2" type="webserver-partial" hwp="small"/>
  </assemblies>
</deployable>
</audrey>`

// webconfHook records what it was given in <seen>/<config>.txt and answers
// the instance's web_url.
const webconfHook = `#!/bin/sh
cat > /dev/null
printf '%%s %%s %%s\n' "$db_host" "$db_password" "$motd" > %s/"$(date +%%s%%N)-$(basename "$PWD")-${ANNEAL_SOFTWARE_DEPLOYMENT}.txt"
printf '{"web_url": "http://%%s/"}' "$ANNEAL_NODE"
`

type siteInstance struct {
	instanceView
	ConfigXML string `json:"config_xml"`
}

// TestAudreyOnNodes: an imported deployable's instances come alive as
// nodes (real agents enrolled under the instances' node names) and
// configure each other through the config server: each agent POSTs the
// instance config it was launched with (201), GETs its config until
// complete (web2 acting on the partial config its base service allows,
// web1 waiting through 204s), applies each service through the hook its
// scripts name, and PUTs its provided parameters, until every instance is
// complete and the web instances' hooks saw the database's address and
// password.
func TestAudreyOnNodes(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	code, body := raw(t, http.MethodPost, st.URL+"/api/v1/deployables", "application/xml", st.AdminToken, siteXML)
	require.Equal(t, http.StatusCreated, code, body)
	var imp struct {
		Instances []siteInstance `json:"instances"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &imp))
	inst := map[string]siteInstance{}
	for _, in := range imp.Instances {
		require.Contains(t, in.ConfigXML, `<instance-config id="`+in.UUID+`"`, "the import hands each instance its config")
		inst[in.Name] = in
	}
	require.Len(t, inst, 3)

	start := func(name string) (*testenv.Agent, string) {
		in := inst[name]
		hooks, seen := t.TempDir(), t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(hooks, "webconf"), fmt.Appendf(nil, webconfHook, seen), 0o755))
		a := st.StartAgent(t, in.NodeName, func(c *daemon.Config) {
			c.HooksDir = hooks
			c.Audrey = &daemon.AudreyConfig{UUID: in.UUID, Token: in.Token, ConfigXML: []byte(in.ConfigXML), Poll: 200 * time.Millisecond}
		})
		return a, seen
	}
	state := func(a *testenv.Agent) daemon.AudreyState {
		var s daemon.AudreyState
		b, err := os.ReadFile(filepath.Join(a.WorkDir, "audrey", "state.json"))
		if err == nil {
			_ = json.Unmarshal(b, &s)
		}
		return s
	}

	// The web instances first: web2 applies its base service on the
	// partial config; web1 may not configure partially and waits.
	web1, seen1 := start("web1")
	web2, seen2 := start("web2")
	require.Eventually(t, func() bool { _, ok := state(web2).Applied["base"]; return ok }, 20*time.Second, 50*time.Millisecond,
		"web2 acts on its partial config")
	time.Sleep(time.Second) // a few more polls: nothing else may be applied without the database
	assert.NotContains(t, state(web2).Applied, "web")
	assert.Empty(t, state(web1).Applied, "web1 allows no partial config")
	var view deployableView
	code, _ = st.Do(t, http.MethodGet, "/api/v1/deployables/site", nil, &view)
	require.Equal(t, http.StatusOK, code)
	for _, in := range view.Instances {
		assert.Equal(t, map[string]string{"db": "waiting", "web1": "partial", "web2": "partial"}[in.Name], in.Status, in.Name)
	}

	// Then the database: it configures, replies, and the web instances
	// complete with its values.
	db, _ := start("db")
	require.Eventually(t, func() bool {
		return state(db).Complete && state(web1).Complete && state(web2).Complete
	}, 30*time.Second, 100*time.Millisecond, "every instance completes")
	code, _ = st.Do(t, http.MethodGet, "/api/v1/deployables/site", nil, &view)
	require.Equal(t, http.StatusOK, code)
	for _, in := range view.Instances {
		assert.Equal(t, "complete", in.Status, in.Name)
		assert.Empty(t, in.PendingProvided, in.Name)
		assert.Empty(t, in.MissingInputs, in.Name)
	}
	dbNode := inst["db"].NodeName
	assert.Equal(t, map[string]string{"db_host": "db-" + dbNode, "db_password": "s3cret-pw"}, state(db).Replied)
	for name, seen := range map[string]string{"web1": seen1, "web2": seen2} {
		files, err := filepath.Glob(filepath.Join(seen, "*.txt"))
		require.NoError(t, err)
		var lines []string
		for _, f := range files {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			lines = append(lines, strings.TrimSpace(string(b)))
		}
		// Two services, each applied once: base (motd), then web with the
		// database's values.
		assert.Equal(t, []string{"hello", "db-" + dbNode + " s3cret-pw"}, lines, name)
		assert.Equal(t, map[string]string{"web_url": "http://" + inst[name].NodeName + "/"}, state(map[string]*testenv.Agent{"web1": web1, "web2": web2}[name]).Replied)
	}

	// The instances are nodes now, alive through their agents.
	for _, in := range inst {
		var node models.Node
		code, _ = st.Do(t, http.MethodGet, "/api/v1/nodes/"+in.NodeName, nil, &node)
		require.Equal(t, http.StatusOK, code)
		assert.True(t, node.Alive, in.NodeName)
	}
}

// TestConfigServerOutOfTurn: an instance speaking out of turn gets the
// seed's code and changes nothing: a reply before it fetched its config
// and a reply for another instance are 404 (PUT /reply knows only 200 and
// 404), as is a config posted for another instance's uuid; an unknown uuid
// is 404 for Conductor (admin) too.
func TestConfigServerOutOfTurn(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	code, body := raw(t, http.MethodPost, st.URL+"/api/v1/deployables", "application/xml", st.AdminToken, siteXML)
	require.Equal(t, http.StatusCreated, code, body)
	var imp struct {
		Instances []siteInstance `json:"instances"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &imp))
	inst := map[string]siteInstance{}
	for _, in := range imp.Instances {
		inst[in.Name] = in
	}
	db, web1 := inst["db"], inst["web1"]
	reply := `<provided-parameters><provided-parameter name="db_host"><value>evil</value></provided-parameter></provided-parameters>`
	snapshot := func() string {
		_, b := st.Do(t, http.MethodGet, "/api/v1/deployables/site", nil, nil)
		var v struct {
			Instances []map[string]any `json:"instances"`
		}
		require.NoError(t, json.Unmarshal(b, &v))
		for _, in := range v.Instances {
			delete(in, "updated_at")
		}
		out, _ := json.Marshal(v.Instances)
		return string(out)
	}
	before := snapshot()

	// A reply before the instance fetched its config.
	code, body = raw(t, http.MethodPut, st.URL+"/reply/"+db.UUID, "application/xml", db.Token, reply)
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Contains(t, apiErr(t, body).Message, "has not fetched its configuration yet")
	// A reply, a config fetch and a config post for another instance.
	code, body = raw(t, http.MethodPut, st.URL+"/reply/"+db.UUID, "application/xml", web1.Token, reply)
	assert.Equal(t, http.StatusNotFound, code, body)
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/"+db.UUID, "", web1.Token, "")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = raw(t, http.MethodPost, st.URL+"/configs/"+db.UUID, "application/xml", web1.Token, db.ConfigXML)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, before, snapshot(), "nothing changed")

	// An unknown uuid, even from Conductor.
	code, _ = raw(t, http.MethodPost, st.URL+"/configs/00000000-0000-0000-0000-000000000001", "application/xml", st.AdminToken, db.ConfigXML)
	assert.Equal(t, http.StatusNotFound, code)

	// In turn: its own config (201: a record for the instance), fetched,
	// then its reply.
	code, body = raw(t, http.MethodPost, st.URL+"/configs/"+db.UUID, "application/xml", db.Token, db.ConfigXML)
	assert.Equal(t, http.StatusCreated, code, body)
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/"+db.UUID, "", db.Token, "")
	assert.Equal(t, http.StatusOK, code)
	code, body = raw(t, http.MethodPut, st.URL+"/reply/"+db.UUID, "application/xml", db.Token, reply)
	assert.Equal(t, http.StatusOK, code, body)
}
