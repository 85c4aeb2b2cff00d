package web_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
)

const shopYAML = `
templates:
  - name: db-tpl
    services:
      - name: mysql
        parameters:
          - {name: root_password, required: true}
          - {name: db_host, provided: true}
  - name: app-tpl
    services:
      - name: jboss
        parameters:
          - {name: db_hosts, type: list, required: true}
assemblies:
  - name: mysql
    template: db-tpl
    services:
      - name: mysql
        parameters: [{name: root_password, value: s3cret}]
  - name: app-server
    template: app-tpl
    allow_partial: true
    services:
      - name: jboss
        parameters:
          - {name: db_hosts, reference: {service: mysql, provided_parameter: db_host}}
deployable:
  name: yshop
  assemblies:
    - {name: db, type: mysql}
    - {name: web, type: app-server}
`

func TestImportDeployableErrors(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	count := func() int {
		var list []map[string]any
		code, _ := getList(t, st, "/api/v1/deployables", &list)
		require.Equal(t, http.StatusOK, code)
		return len(list)
	}
	for _, tc := range []struct {
		name, contentType, body string
		status                  int
		field, reason           string
	}{
		{"bad xml", "application/xml", "<audrey>\n<template name=\"x\">\n</audrey>", http.StatusBadRequest, "body", "line 3"},
		{"bad yaml", "application/yaml", "templates: [\n", http.StatusBadRequest, "body", "malformed"},
		{"unknown content type", "text/plain", shopXML, http.StatusUnsupportedMediaType, "Content-Type", "application/xml"},
		{"deadlock", "application/xml", deadlockXML, http.StatusUnprocessableEntity, "instance[a-1]", "a-1 -> b-1 -> a-1"},
		{"missing required value", "application/xml", strings.Replace(shopXML, `<value><![CDATA[s3cret]]></value>`, ``, 1),
			http.StatusUnprocessableEntity, "assembly[mysql].service[mysql].parameter[root_password]", "neither a value nor a reference"},
		{"unknown provided parameter", "application/xml", strings.Replace(shopXML, `provided-parameter="db_host"/>`, `provided-parameter="db_hostname"/>`, 1),
			http.StatusUnprocessableEntity, "assembly[app-server].service[jboss].parameter[db_hosts].reference.provided-parameter", `provides no parameter "db_hostname"`},
		{"unknown deployment", "application/xml", shopXML + "", http.StatusUnprocessableEntity, "deployment", "no deployment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := st.URL + "/api/v1/deployables"
			if tc.name == "unknown deployment" {
				url += "?deployment=nowhere"
			}
			code, body := raw(t, http.MethodPost, url, tc.contentType, st.AdminToken, tc.body)
			require.Equal(t, tc.status, code, body)
			e := apiErr(t, body)
			assert.Equal(t, tc.field, e.Details["field"], body)
			assert.Contains(t, e.Message, tc.reason)
			if tc.name == "deadlock" {
				assert.Equal(t, []any{"a-1", "b-1", "a-1"}, e.Details["cycle"])
			}
		})
	}
	assert.Equal(t, 0, count(), "nothing written by a refused import")
	var nodes []map[string]any
	getList(t, st, "/api/v1/nodes", &nodes)
	for _, n := range nodes {
		assert.NotContains(t, n["name"], "shop")
	}

	// Instance tokens are not admin tokens.
	code, body := raw(t, http.MethodPost, st.URL+"/api/v1/deployables", "application/yaml", st.AdminToken, shopYAML)
	require.Equal(t, http.StatusCreated, code, body)
	assert.Equal(t, 1, count())
	var imp deployableView
	require.NoError(t, jsonUnmarshal([]byte(body), &imp))
	code, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/deployables/yshop", imp.Instances[0].Token, nil, nil)
	assert.Equal(t, http.StatusUnauthorized, code)

	// YAML import, by service reference; then a duplicate name is a conflict.
	web := instanceClient{t: t, base: st.URL, uuid: imp.Instances[1].UUID, token: imp.Instances[1].Token}
	db := instanceClient{t: t, base: st.URL, uuid: imp.Instances[0].UUID, token: imp.Instances[0].Token}
	code, _ = web.getConfig()
	assert.Equal(t, http.StatusAccepted, code)
	code, _ = db.getConfig() // in turn: a reply comes after the instance's config
	assert.Equal(t, http.StatusOK, code)
	code, _ = db.reply(`<provided-parameters><provided-parameter name="db_host"><value>db.local</value></provided-parameter></provided-parameters>`)
	assert.Equal(t, http.StatusOK, code)
	code, body = web.getConfig()
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<value>db.local</value>")

	code, body = raw(t, http.MethodPost, st.URL+"/api/v1/deployables", "application/yaml", st.AdminToken, shopYAML)
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Equal(t, 1, count())
}
