package web_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/roles/network"
	"github.com/anneal-dev/anneal/scenarios"
)

// TestNetworkRoleAndNodeDelete drives the sample release's network-admin
// role: binding it gives the node an address, which its run sees through
// $ANNEAL_ATTRS; PATCH sets a node's flags; DELETE refuses a node with a
// noderole in transition, then deletes it and frees its address.
func TestNetworkRoleAndNodeDelete(t *testing.T) {
	t.Parallel()
	network.Register() // as the worker process does (server.Run)
	st := testenv.NewStack(t, testenv.Options{})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(string(scenarios.SampleRelease)), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "sample", "release": "sample"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)

	// The role runs through the node's agent and prints its address.
	st.StartAgent(t, nodeName("net1"))
	waitActive(t, st, models.SystemDeployment, "node-base@net1")
	bindAll(t, st, "sample", "network-admin@net1")
	nrs := waitActive(t, st, "sample", "network-admin@net1")
	nr := getNodeRole(t, st, nrs["network-admin@net1"].ID)
	assert.Equal(t, "192.168.124.10/24", dig(nr.SystemData, "network", "admin", "address"))
	require.NotNil(t, nr.LastRun)
	assert.Contains(t, nr.LastRun.StdoutTail, "admin address of "+nodeName("net1")+": 192.168.124.10/24")

	// PATCH: available and allocated; a wrong type names the field.
	var node models.Node
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("net1"), map[string]any{"available": false, "allocated": false}, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.False(t, node.Available)
	assert.False(t, node.Allocated)
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("net1"), map[string]any{"available": "yes"}, nil)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, string(body), "available")
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("net1"), map[string]any{"available": true}, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.True(t, node.Available)
	assert.False(t, node.Allocated, "untouched")

	// A second node, without an agent (never alive: the annealer leaves
	// it alone), gets the next address; a noderole in transition keeps it.
	_, _, err := st.Store.CreateNode(t.Context(), models.NodeInput{Name: nodeName("net2")}, false)
	require.NoError(t, err)
	bindAll(t, st, "sample", "network-admin@net2")
	nrs = noderoles(t, st, "sample")
	nr2 := nrs["network-admin@net2"]
	assert.Equal(t, "192.168.124.11/24", dig(nr2.SystemData, "network", "admin", "address"))
	_, err = crowbar.New(st.Store).TransitionNodeRole(t.Context(), nr2.ID)
	require.NoError(t, err)
	status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName("net2"), nil, nil)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	assert.Contains(t, string(body), "in transition")
	_, err = crowbar.New(st.Store).FinishNodeRole(t.Context(), nr2.ID, true, nil)
	require.NoError(t, err)

	var deleted models.Node
	status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName("net2"), nil, &deleted)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, nodeName("net2"), deleted.Name)
	status, _ = st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("net2"), nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName("net2"), nil, nil)
	assert.Equal(t, http.StatusNotFound, status, "%s", body)
	_, ok := noderoles(t, st, "sample")["network-admin@net2"]
	assert.False(t, ok, "its noderoles went with it")
	var freed int64
	require.NoError(t, st.Store.DB.Raw(`SELECT count(*) FROM network_allocations WHERE address = '192.168.124.11'`).Scan(&freed).Error)
	assert.Zero(t, freed, "on_node_delete freed its address")

	// A deleted node's agent credential stops working at once, although
	// the API trusts a verified one for a while (agentAuthTTL).
	_, secret, err := st.Store.CreateNode(t.Context(), models.NodeInput{Name: nodeName("net3")}, true)
	require.NoError(t, err)
	status, body = testenv.Call(t, http.MethodPost, st.URL+protocol.PathHeartbeat, secret, map[string]any{}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = st.Do(t, http.MethodDelete, "/api/v1/nodes/"+nodeName("net3"), nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = testenv.Call(t, http.MethodPost, st.URL+protocol.PathHeartbeat, secret, map[string]any{}, nil)
	assert.Equal(t, http.StatusUnauthorized, status, "%s", body)

	// One replaced behind the API's back (as `dev up` resets one in
	// Postgres, or another API server deletes its node) stops working
	// once Postgres announces it.
	_, secret, err = st.Store.CreateNode(t.Context(), models.NodeInput{Name: nodeName("net4")}, true)
	require.NoError(t, err)
	status, body = testenv.Call(t, http.MethodPost, st.URL+protocol.PathHeartbeat, secret, map[string]any{}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	_, fresh, err := st.Store.ResetAgentCredential(t.Context(), nodeName("net4"))
	require.NoError(t, err)
	assert.Eventually(t, func() bool {
		status, _ := testenv.Call(t, http.MethodPost, st.URL+protocol.PathHeartbeat, secret, map[string]any{}, nil)
		return status == http.StatusUnauthorized
	}, 5*time.Second, 50*time.Millisecond, "the replaced credential still works")
	status, body = testenv.Call(t, http.MethodPost, st.URL+protocol.PathHeartbeat, fresh, map[string]any{}, nil)
	assert.Equal(t, http.StatusOK, status, "%s", body)
}
