package web_test

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// sshRelease places two tasks on the `remote` role, both run by the
// worker over SSH (parameters.jig ssh); the second reads the first's
// output as an agent's task would.
const sshRelease = `
name: over-ssh
version: "1"
roles_metadata:
  remote: {tags: [remote]}
graphs:
  deployment:
    tasks:
      - id: install
        tags: [remote]
        parameters: {jig: ssh, cmd: "echo installing on $ANNEAL_NODE; echo version=42 >> $ANNEAL_OUTPUTS", timeout: 30}
      - id: verify
        tags: [remote]
        requires: [install]
        parameters: {jig: ssh, cmd: "test \"$ANNEAL_OUT_INSTALL_VERSION\" = 42 && echo verified", timeout: 30}
`

// TestSSHJigEndToEnd: a node without an agent, reached over SSH through
// its settings (set by an admin, the key never echoed nor stored in the
// clear), runs a graph's
// tasks with outputs flowing between them; its host key is pinned on
// first use, and a wrong pinned key fails the run naming the node and the
// presented key's fingerprint.
func TestSSHJigEndToEnd(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	sshd := testenv.StartSSHD(t)
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(sshRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "d1", "release": "over-ssh"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	node := nodeName("far")
	status, body = st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": node, "deployment": "d1"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+node, map[string]any{"roles": []string{"remote"}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)

	// Bad settings are refused naming the field; nothing is stored.
	for field, req := range map[string]map[string]any{
		"private_key": {"private_key": "not a key"},
		"port":        {"port": 0},
		"known_hosts": {"known_hosts": "127.0.0.1 ssh-ed25519 garbage"},
		"user":        {"user": "two words"},
	} {
		status, body = st.Do(t, http.MethodPut, "/api/v1/nodes/"+node+"/ssh", req, nil)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %s", field, body)
		assert.Equal(t, field, apiErr(t, string(body)).Details["field"], "%s", body)
	}
	status, _ = st.Do(t, http.MethodGet, "/api/v1/nodes/"+node+"/ssh", nil, nil)
	assert.Equal(t, http.StatusNotFound, status)

	var view models.NodeSSHView
	status, body = st.Do(t, http.MethodPut, "/api/v1/nodes/"+node+"/ssh", map[string]any{
		"user": sshd.User, "port": sshd.Port, "host": sshd.Host, "private_key": sshd.ClientKey}, &view)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, "***", view.PrivateKey)
	assert.NotContains(t, string(body), "PRIVATE KEY", "the key is never echoed")
	assert.Empty(t, view.Fingerprints)

	// A viewer may not see them.
	viewer, err := st.Store.CreateAPIToken(t.Context(), "viewer", models.ScopeViewer)
	require.NoError(t, err)
	status, _ = testenv.Call(t, http.MethodGet, st.URL+"/api/v1/nodes/"+node+"/ssh", viewer, nil, nil)
	assert.Equal(t, http.StatusForbidden, status)

	ans := execute(t, st, map[string]any{"deployment": "d1", "graphs": []map[string]any{{"type": "deployment"}}})
	tx := waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxReady, tx.Status, tx.Error)
	runs := runsByKey(t, st, ans.TaskUUID, "")
	assert.Equal(t, "installing on "+node+"\n", runs["install@"+node].StdoutTail)
	assert.Equal(t, map[string]string{"version": "42"}, runs["install@"+node].Outputs)
	assert.Equal(t, "verified\n", runs["verify@"+node].StdoutTail)

	// The host key was pinned on first use.
	status, body = st.Do(t, http.MethodGet, "/api/v1/nodes/"+node+"/ssh", nil, &view)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, []string{"ssh-ed25519 " + ssh.FingerprintSHA256(sshd.HostKey)}, view.Fingerprints)
	assert.NotContains(t, string(body), "PRIVATE KEY")

	// The key is sealed at rest: no column holds it, in any form. Every
	// line of its body but the first (the same in every OpenSSH key) is
	// particular to it.
	var needles []string
	lines := strings.Split(strings.TrimSpace(sshd.ClientKey), "\n")
	require.Greater(t, len(lines), 3, "a PEM key: %q", sshd.ClientKey)
	for _, l := range lines[2 : len(lines)-1] {
		needles = append(needles, l, hex.EncodeToString([]byte(l)), base64.StdEncoding.EncodeToString([]byte(l)))
	}
	assertNotInDatabase(t, st, needles...)

	// The node was reinstalled: another key is pinned than the one it
	// presents. The run fails, naming the node and the key.
	other, _ := testenv.NewSSHKey(t)
	status, body = st.Do(t, http.MethodPut, "/api/v1/nodes/"+node+"/ssh", map[string]any{
		"known_hosts": "[127.0.0.1]:22 " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(other)))}, &view)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, "***", view.PrivateKey, "a PUT without the key keeps it")
	ans = execute(t, st, map[string]any{"deployment": "d1", "force": true, "graphs": []map[string]any{{"type": "deployment"}}})
	tx = waitDone(t, st, ans.TaskUUID, 60*time.Second)
	require.Equal(t, models.TxError, tx.Status)
	runs = runsByKey(t, st, ans.TaskUUID, "")
	install := runs["install@"+node]
	assert.Equal(t, contract.RunFailed, install.State)
	assert.Contains(t, install.Error, "host key mismatch for node "+node)
	assert.Contains(t, install.Error, ssh.FingerprintSHA256(sshd.HostKey))
	assert.Equal(t, contract.RunBlocked, runs["verify@"+node].State)
}

// sshRoles: two Crowbar roles on the ssh jig; the child sees the wall its
// parent handed back through $ANNEAL_ATTRS_OUT.
const sshRoles = `
name: crowssh
version: "1"
roles_metadata:
  base-ssh:
    jig: ssh
    script: |
      printf '{"ssh": {"seen": "%s"}}' "$ANNEAL_NODE" > "$ANNEAL_ATTRS_OUT"
  app-ssh:
    jig: ssh
    requires: [base-ssh]
    script: |
      grep -q '"seen"' "$ANNEAL_ATTRS" && echo parent wall seen
`

// TestSSHJigNodeRoles: the annealer runs roles of the ssh jig on a node
// without an agent, over SSH, in dependency order, with the attributes
// going there and back as through an agent.
func TestSSHJigNodeRoles(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{})
	sshd := testenv.StartSSHD(t)
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(sshRoles), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "crow", "release": "crowssh"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	node := nodeName("far")
	status, body = st.Do(t, http.MethodPost, "/api/v1/nodes", map[string]any{"name": node, "deployment": "crow"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPut, "/api/v1/nodes/"+node+"/ssh", map[string]any{
		"user": sshd.User, "port": sshd.Port, "host": sshd.Host, "private_key": sshd.ClientKey, "known_hosts": sshd.KnownHostsLine}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)

	bindAll(t, st, "crow", "base-ssh@far", "app-ssh@far")
	nrs := waitActive(t, st, "crow", "base-ssh@far", "app-ssh@far")
	before(t, getNodeRole(t, st, nrs["base-ssh@far"].ID), getNodeRole(t, st, nrs["app-ssh@far"].ID))
	assert.Equal(t, map[string]any{"ssh": map[string]any{"seen": node}}, nrs["base-ssh@far"].Wall)
	app := getNodeRole(t, st, nrs["app-ssh@far"].ID)
	assert.Equal(t, "parent wall seen\n", app.LastRun.StdoutTail)
}
