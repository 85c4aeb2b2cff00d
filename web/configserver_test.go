package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
)

// shopXML is the seed's scenario: a database assembly providing connection
// data to two app-server assemblies that reference it by type — the list of
// every database host (match-type all) and the first reported port
// (match-type first). app-server allows no partial config (204 until the
// database replied); app-server-partial allows one for its service (202).
const shopXML = `<audrey>
<template name="db-tpl">
  <os><name>Fedora</name><version>14</version></os>
  <description>database server</description>
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
  <os><name>Fedora</name><version>14</version></os>
  <services>
    <service name="jboss">
      <scripts><script>jboss::server</script></scripts>
      <parameter name="db_hosts" type="list" required="true"/>
      <parameter name="db_port" type="scalar" required="true"/>
      <parameter name="app_url" type="scalar" provided="true"/>
    </service>
  </services>
</template>
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
<deployable name="shop">
  <assemblies>
    <assembly name="db" type="mysql" hwp="large"/>
    <assembly name="app1" type="app-server" hwp="small"/>
    <assembly name="app2" type="app-server-partial" hwp="small"/>
  </assemblies>
</deployable>
</audrey>`

// The seed's deadlock: two assemblies each waiting for the other's
// provided parameter.
const deadlockXML = `<audrey>
<template name="t"><services><service name="s">
  <parameter name="in" required="true"/><parameter name="out" provided="true"/>
</service></services></template>
<assembly name="a"><template type="t"/><services><service name="s">
  <parameter name="in"><reference assembly="b-1" provided-parameter="out"/></parameter>
</service></services></assembly>
<assembly name="b"><template type="t"/><services><service name="s">
  <parameter name="in"><reference assembly-type="a" match-type="first" provided-parameter="out"/></parameter>
</service></services></assembly>
<deployable name="stuck"><assemblies>
  <assembly name="a-1" type="a"/><assembly name="b-1" type="b"/>
</assemblies></deployable>
</audrey>`

type instanceView struct {
	UUID            string   `json:"uuid"`
	Name            string   `json:"name"`
	AssemblyType    string   `json:"assembly_type"`
	NodeID          int64    `json:"node_id"`
	NodeName        string   `json:"node_name"`
	Status          string   `json:"status"`
	Token           string   `json:"token"`
	MissingInputs   []string `json:"missing_inputs"`
	PendingProvided []string `json:"pending_provided"`
}

type deployableView struct {
	ID         int64                                  `json:"id"`
	UUID       string                                 `json:"uuid"`
	Name       string                                 `json:"name"`
	Instances  []instanceView                         `json:"instances"`
	Edges      []struct{ From, To, Parameter string } `json:"edges"`
	ServiceMap map[string]struct {
		Role      string   `json:"role"`
		Scripts   []string `json:"scripts"`
		Instances []string `json:"instances"`
	} `json:"service_map"`
}

// raw sends a request with a content type and answers status and body.
func raw(t *testing.T, method, url, contentType, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func apiErr(t *testing.T, body string) protocol.ErrorDetail {
	t.Helper()
	var eb protocol.ErrorBody
	require.NoError(t, json.Unmarshal([]byte(body), &eb), body)
	return eb.Error
}

// instanceClient is a simulated instance: a plain HTTP client with its own
// credential talking to the config server.
type instanceClient struct {
	t     *testing.T
	base  string
	uuid  string
	token string
}

func (c instanceClient) getConfig() (int, string) {
	return raw(c.t, http.MethodGet, c.base+"/configs/"+c.uuid, "", c.token, "")
}

func (c instanceClient) getParams() (int, string) {
	return raw(c.t, http.MethodGet, c.base+"/params/"+c.uuid, "", c.token, "")
}

func (c instanceClient) reply(body string) (int, string) {
	return raw(c.t, http.MethodPut, c.base+"/reply/"+c.uuid, "application/xml", c.token, body)
}

func TestConfigServerEndToEnd(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	code, body := raw(t, http.MethodPost, st.URL+"/api/v1/deployables", "application/xml", st.AdminToken, shopXML)
	require.Equal(t, http.StatusCreated, code, body)
	var imp deployableView
	require.NoError(t, json.Unmarshal([]byte(body), &imp))
	require.Len(t, imp.Instances, 3)
	inst := map[string]instanceClient{}
	for _, in := range imp.Instances {
		require.NotEmpty(t, in.Token, "the import answer carries each instance's credential")
		require.NotEmpty(t, in.UUID)
		assert.Equal(t, in.Name+".shop.anneal.test", in.NodeName)
		assert.Equal(t, "waiting", in.Status)
		inst[in.Name] = instanceClient{t: t, base: st.URL, uuid: in.UUID, token: in.Token}
	}
	assert.Equal(t, []string{"app1", "app2"}, imp.ServiceMap["jboss"].Instances)
	assert.Equal(t, []string{"mysql::server"}, imp.ServiceMap["mysql"].Scripts)
	assert.Len(t, imp.Edges, 4) // db → app1, app2 for db_hosts and db_port

	// Each instance is a node-to-be.
	var node struct {
		Name       string         `json:"name"`
		Attributes map[string]any `json:"attributes"`
	}
	code, _ = st.Do(t, http.MethodGet, "/api/v1/nodes/app1.shop.anneal.test", nil, &node)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, inst["app1"].uuid, node.Attributes["audrey"].(map[string]any)["instance_uuid"])

	db, app1, app2 := inst["db"], inst["app1"], inst["app2"]

	// Credentials: none 401, garbage 401, another instance's uuid 404 (the
	// seed's code: that uuid is not known to this instance), unknown uuid 404.
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/"+db.uuid, "", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/"+db.uuid, "", "aud_nope", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/"+db.uuid, "", app1.token, "")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = raw(t, http.MethodPut, st.URL+"/reply/"+db.uuid, "application/xml", app1.token, `<provided-parameters><provided-parameter name="db_host"><value>evil</value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusNotFound, code)
	for _, path := range []string{"/configs/", "/params/"} {
		code, _ = raw(t, http.MethodGet, st.URL+path+"00000000-0000-0000-0000-000000000000", "", db.token, "")
		assert.Equal(t, http.StatusNotFound, code, path)
	}
	code, _ = raw(t, http.MethodPut, st.URL+"/reply/00000000-0000-0000-0000-000000000000", "application/xml", db.token, `<provided-parameters/>`)
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = raw(t, http.MethodGet, st.URL+"/configs/not-a-uuid", "", db.token, "")
	assert.Equal(t, http.StatusNotFound, code)

	// Before the database replies: app1 may not configure partially (204),
	// app2 gets what is known so far (202); the database is complete.
	code, body = app1.getConfig()
	assert.Equal(t, http.StatusNoContent, code)
	assert.Empty(t, body)
	code, body = app2.getConfig()
	assert.Equal(t, http.StatusAccepted, code)
	assert.Contains(t, body, `<instance-config id="`+app2.uuid+`" type="app-server-partial" name="app2">`)
	assert.Contains(t, body, `<reference assembly-type="mysql" match-type="first" provided-parameter="db_port">`)
	code, body = db.getConfig()
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<value>s3cret</value>")
	assert.Contains(t, body, `<provided-parameter name="db_host">`)

	// The database's provided parameters are expected (202), then stored.
	code, body = db.getParams()
	assert.Equal(t, http.StatusAccepted, code)
	assert.Contains(t, body, `<provided-parameter name="db_host">`)
	assert.Contains(t, body, `<provided-parameter name="db_port">`)
	code, body = db.reply(`<provided-parameters><provided-parameter name="nope"><value>x</value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusBadRequest, code, body)
	code, _ = db.reply(`<provided-parameters><provided-parameter name="db_host">`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, body = db.reply(`<provided-parameters><provided-parameter name="db_host"><value><![CDATA[10.0.0.5]]></value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusOK, code, body)

	// Half the data: app1 still 204, app2 202 with the host list.
	code, _ = app1.getConfig()
	assert.Equal(t, http.StatusNoContent, code)
	code, body = app2.getConfig()
	assert.Equal(t, http.StatusAccepted, code)
	assert.Contains(t, body, "<value>10.0.0.5</value>")

	code, body = db.reply(`<provided-parameters><provided-parameter name="db_port"><value>3306</value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusOK, code, body)
	code, _ = db.getParams()
	assert.Equal(t, http.StatusOK, code, "nothing more needed from the database")

	// After the database replied: both app servers get complete configs.
	for _, app := range []instanceClient{app1, app2} {
		code, body = app.getConfig()
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, `<parameter name="db_hosts" type="list">`)
		assert.Contains(t, body, "<value>10.0.0.5</value>")
		assert.Contains(t, body, `<parameter name="db_port">`)
		assert.Contains(t, body, "<value>3306</value>")
		assert.NotContains(t, body, "<reference")
	}
	code, _ = app1.reply(`<provided-parameters><provided-parameter name="app_url"><value>http://app1</value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusOK, code)

	// The deployable shows each instance's status and the ordering edges.
	var view deployableView
	code, _ = st.Do(t, http.MethodGet, "/api/v1/deployables/shop", nil, &view)
	require.Equal(t, http.StatusOK, code)
	status := map[string]instanceView{}
	for _, in := range view.Instances {
		assert.Empty(t, in.Token, "credentials are shown only at import")
		status[in.Name] = in
	}
	assert.Equal(t, "complete", status["db"].Status)
	assert.Equal(t, "complete", status["app1"].Status)
	assert.Equal(t, "configured", status["app2"].Status)
	assert.Equal(t, []string{"app_url"}, status["app2"].PendingProvided)
	assert.Equal(t, "db", view.Edges[0].From)
	code, _ = st.Do(t, http.MethodGet, "/api/v1/deployables/"+imp.UUID, nil, nil)
	assert.Equal(t, http.StatusOK, code)

	// Conductor (admin token) posts a new instance config for app2: 201;
	// another instance may not (404: not its uuid); an invalid document is
	// 400; unknown uuid 404.
	newConfig := `<instance-config id="` + app2.uuid + `" type="app-server-partial" name="app2">
  <deployable name="shop" id="` + imp.UUID + `"/>
  <template name="app-tpl"/>
  <provided-parameters><provided-parameter name="app_url"/></provided-parameters>
  <services><service name="jboss">
    <parameter name="db_hosts"><value><![CDATA[10.9.9.9]]></value></parameter>
    <parameter name="db_port"><reference assembly="db" provided-parameter="db_port"/></parameter>
  </service></services>
</instance-config>`
	code, body = raw(t, http.MethodPost, st.URL+"/configs/"+app2.uuid, "application/xml", st.AdminToken, newConfig)
	assert.Equal(t, http.StatusCreated, code, body)
	code, _ = raw(t, http.MethodPost, st.URL+"/configs/"+app2.uuid, "application/xml", app1.token, newConfig)
	assert.Equal(t, http.StatusNotFound, code)
	code, body = raw(t, http.MethodPost, st.URL+"/configs/"+app2.uuid, "application/xml", st.AdminToken, "<instance-config id=")
	assert.Equal(t, http.StatusBadRequest, code, body)
	code, body = raw(t, http.MethodPost, st.URL+"/configs/"+app2.uuid, "application/xml", st.AdminToken,
		strings.Replace(newConfig, `assembly="db"`, `assembly="nodb"`, 1))
	assert.Equal(t, http.StatusBadRequest, code, body)
	code, _ = raw(t, http.MethodPost, st.URL+"/configs/00000000-0000-0000-0000-000000000000", "application/xml", st.AdminToken, newConfig)
	assert.Equal(t, http.StatusNotFound, code)
	code, body = app2.getConfig()
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<value>10.9.9.9</value>")
	assert.Contains(t, body, "<value>3306</value>")
}
