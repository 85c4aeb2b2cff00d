package network_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/roles/network"
	"github.com/anneal-dev/anneal/models/storetest"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = addr(s)
	}
	return out
}

// netData is role data holding a network's settings.
func netData(name string, first, last any, prefix any) map[string]any {
	return map[string]any{"network": map[string]any{
		"name": name, "prefix": prefix, "range": map[string]any{"first": first, "last": last}}}
}

func TestParseRange(t *testing.T) {
	ok := []struct {
		name string
		data map[string]any
		want network.Range
	}{
		{"JSON number", netData("admin", "192.168.124.10", "192.168.124.250", float64(24)),
			network.Range{Network: "admin", First: addr("192.168.124.10"), Last: addr("192.168.124.250"), Prefix: 24}},
		{"YAML int", netData("admin", "10.0.0.1", "10.0.0.1", 8),
			network.Range{Network: "admin", First: addr("10.0.0.1"), Last: addr("10.0.0.1"), Prefix: 8}},
		{"point to point /31 uses both", netData("p2p", "10.0.0.0", "10.0.0.1", 31),
			network.Range{Network: "p2p", First: addr("10.0.0.0"), Last: addr("10.0.0.1"), Prefix: 31}},
		{"IPv6", netData("v6", "fd00::10", "fd00::ff", 64),
			network.Range{Network: "v6", First: addr("fd00::10"), Last: addr("fd00::ff"), Prefix: 64}},
		{"IPv4-mapped is IPv4", netData("m", "::ffff:10.1.0.5", "10.1.0.9", 24),
			network.Range{Network: "m", First: addr("10.1.0.5"), Last: addr("10.1.0.9"), Prefix: 24}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			got, err := network.ParseRange(tc.data)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	bad := []struct {
		name   string
		data   map[string]any
		field  string
		reason string
	}{
		{"no network", map[string]any{}, "network", "must be an object"},
		{"network not an object", map[string]any{"network": "admin"}, "network", `got "admin"`},
		{"no name", netData("", "10.0.0.1", "10.0.0.2", 24), "network.name", "non-empty string"},
		{"no range", map[string]any{"network": map[string]any{"name": "a", "prefix": 24}}, "network.range", "got nothing"},
		{"first not a string", netData("a", 10, "10.0.0.2", 24), "network.range.first", "IP address string"},
		{"first not an address", netData("a", "10.0.0.300", "10.0.0.2", 24), "network.range.first", `"10.0.0.300"`},
		{"last missing", netData("a", "10.0.0.1", nil, 24), "network.range.last", "got nothing"},
		{"zone", netData("a", "fe80::1%eth0", "fe80::9", 64), "network.range.first", "not an IP address"},
		{"mixed families", netData("a", "10.0.0.1", "fd00::1", 24), "network.range", "same address family"},
		{"reversed", netData("a", "10.0.0.9", "10.0.0.1", 24), "network.range", "last 10.0.0.1 comes before first 10.0.0.9"},
		{"no prefix", netData("a", "10.0.0.1", "10.0.0.2", nil), "network.prefix", "from 1 to 32"},
		{"fractional prefix", netData("a", "10.0.0.1", "10.0.0.2", 24.5), "network.prefix", "24.5"},
		{"prefix too long", netData("a", "10.0.0.1", "10.0.0.2", 33), "network.prefix", "from 1 to 32"},
		{"last outside the subnet", netData("a", "10.0.0.10", "10.0.1.10", 24), "network.range.last", "outside 10.0.0.0/24"},
		{"network address", netData("a", "10.0.0.0", "10.0.0.9", 24), "network.range.first", "network address of 10.0.0.0/24"},
		{"broadcast address", netData("a", "10.0.0.1", "10.0.0.255", 24), "network.range.last", "broadcast address of 10.0.0.0/24"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := network.ParseRange(tc.data)
			var ie *models.InputError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, tc.field, ie.Field, "reason: %s", ie.Reason)
			assert.Contains(t, ie.Reason, tc.reason)
		})
	}
}

func TestLowestFree(t *testing.T) {
	r := network.Range{Network: "admin", First: addr("192.168.124.10"), Last: addr("192.168.124.13"), Prefix: 24}
	cases := []struct {
		name string
		used []netip.Addr
		want string // "" when full
	}{
		{"empty", nil, "192.168.124.10"},
		{"first taken", addrs("192.168.124.10"), "192.168.124.11"},
		{"a gap", addrs("192.168.124.10", "192.168.124.12"), "192.168.124.11"},
		{"unsorted with duplicates", addrs("192.168.124.11", "192.168.124.10", "192.168.124.11", "192.168.124.13"), "192.168.124.12"},
		{"outside the range ignored", addrs("192.168.124.9", "192.168.124.14", "10.0.0.10", "fd00::1"), "192.168.124.10"},
		{"only the last free", addrs("192.168.124.12", "192.168.124.10", "192.168.124.11"), "192.168.124.13"},
		{"full", addrs("192.168.124.10", "192.168.124.11", "192.168.124.12", "192.168.124.13"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.LowestFree(tc.used)
			if tc.want == "" {
				assert.False(t, ok, "got %s", got)
				return
			}
			require.True(t, ok)
			assert.Equal(t, addr(tc.want), got)
		})
	}

	top := network.Range{Network: "top", First: addr("255.255.255.254"), Last: addr("255.255.255.255"), Prefix: 31}
	got, ok := top.LowestFree(addrs("255.255.255.254"))
	require.True(t, ok)
	assert.Equal(t, addr("255.255.255.255"), got)
	_, ok = top.LowestFree(addrs("255.255.255.255", "255.255.255.254"))
	assert.False(t, ok, "full at the end of the address space")

	v6 := network.Range{Network: "v6", First: addr("fd00::ff"), Last: addr("fd00::101"), Prefix: 64}
	got, ok = v6.LowestFree(addrs("fd00::ff"))
	require.True(t, ok)
	assert.Equal(t, addr("fd00::100"), got, "carries into the next byte")

	assert.True(t, r.Contains(addr("192.168.124.13")))
	assert.False(t, r.Contains(addr("192.168.124.14")))
	assert.False(t, r.Contains(addr("::ffff:192.168.124.10")), "another family")
	assert.Equal(t, "admin 192.168.124.10-192.168.124.13/24", r.String())
}

// releaseYAML has the network role with a range of three addresses.
const releaseYAML = `
name: net
version: "1.0"
roles_metadata:
  network-admin:
    template:
      network: {name: admin, prefix: 24, range: {first: 192.168.124.10, last: 192.168.124.12}}
`

type env struct {
	store *storetest.Stores
	ctx   context.Context
}

func newEnv(t *testing.T, release string) *env {
	t.Helper()
	t.Parallel()
	network.Register()
	store, _ := storetest.Open(t)
	e := &env{store: store, ctx: context.Background()}
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(release), &spec))
	_, err := store.ImportRelease(e.ctx, spec)
	require.NoError(t, err)
	return e
}

// node registers a node in the system deployment: every deployment's
// snapshots can bind roles to it.
func (e *env) node(t *testing.T, name string) *models.Node {
	t.Helper()
	n, _, err := e.store.CreateNode(e.ctx, models.NodeInput{Name: name + ".anneal.test"}, true)
	require.NoError(t, err)
	return n
}

// deployment creates a deployment of the release and proposes a snapshot.
func (e *env) deployment(t *testing.T, name string) *crowbar.Snapshot {
	t.Helper()
	_, err := e.store.CreateDeployment(e.ctx, models.DeploymentInput{Name: name, Release: "net"})
	require.NoError(t, err)
	snap, err := e.store.ProposeSnapshot(e.ctx, name)
	require.NoError(t, err)
	return snap
}

func (e *env) bind(snap *crowbar.Snapshot, node string) (*crowbar.NodeRole, error) {
	nr, _, err := e.store.BindRole(e.ctx, snap.ID, crowbar.BindInput{Node: node + ".anneal.test", Role: network.Role})
	return nr, err
}

// address is the admin address a noderole's system data holds.
func address(nr *crowbar.NodeRole) any {
	nets, _ := nr.SystemData["network"].(map[string]any)
	admin, _ := nets["admin"].(map[string]any)
	return admin["address"]
}

// allocations maps node id to address in network admin.
func (e *env) allocations(t *testing.T) map[int64]string {
	t.Helper()
	var rows []struct {
		NodeID  int64
		Address string
	}
	require.NoError(t, e.store.DB.Raw(`SELECT node_id, host(address) AS address FROM network_allocations WHERE network = 'admin'`).
		Scan(&rows).Error)
	out := map[int64]string{}
	for _, r := range rows {
		out[r.NodeID] = r.Address
	}
	return out
}

func TestAllocateOnProposed(t *testing.T) {
	e := newEnv(t, releaseYAML)
	n1, n2, n3, n4 := e.node(t, "n1"), e.node(t, "n2"), e.node(t, "n3"), e.node(t, "n4")
	a := e.deployment(t, "a")

	nr1, err := e.bind(a, "n1")
	require.NoError(t, err)
	want := map[string]any{"network": map[string]any{"admin": map[string]any{"address": "192.168.124.10/24"}}}
	assert.Equal(t, want, nr1.SystemData, "the lowest address, with the prefix")
	assert.Equal(t, "admin", nr1.UserData["network"].(map[string]any)["name"], "the user data is the template's")
	nr2, err := e.bind(a, "n2")
	require.NoError(t, err)
	assert.Equal(t, "192.168.124.11/24", address(nr2))

	// Bound again elsewhere (another deployment's snapshot): the same
	// address, not a second one.
	b := e.deployment(t, "b")
	again, err := e.bind(b, "n1")
	require.NoError(t, err)
	assert.NotEqual(t, nr1.ID, again.ID)
	assert.Equal(t, "192.168.124.10/24", address(again))
	assert.Equal(t, map[int64]string{n1.ID: "192.168.124.10", n2.ID: "192.168.124.11"}, e.allocations(t))

	// A proposal copies the committed noderoles with their system data.
	_, err = e.store.CommitSnapshot(e.ctx, a.ID)
	require.NoError(t, err)
	a2, err := e.store.ProposeSnapshot(e.ctx, "a")
	require.NoError(t, err)
	copied, err := e.store.Snapshot(e.ctx, a2.ID)
	require.NoError(t, err)
	for _, nr := range copied.NodeRoles {
		if nr.NodeID == n1.ID {
			assert.Equal(t, "192.168.124.10/24", address(&nr))
		}
	}

	// The last address, then a full range: the bind fails naming the
	// network and the range, and leaves nothing behind.
	nr3, err := e.bind(b, "n3")
	require.NoError(t, err)
	assert.Equal(t, "192.168.124.12/24", address(nr3))
	_, err = e.bind(b, "n4")
	var ce *models.ConflictError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, ce.Reason, "network admin is full")
	assert.Contains(t, ce.Reason, "192.168.124.10-192.168.124.12")
	assert.Contains(t, ce.Reason, "n4.anneal.test")
	var bound int64
	require.NoError(t, e.store.DB.Model(&crowbar.NodeRole{}).Where("node_id = ?", n4.ID).Count(&bound).Error)
	assert.Zero(t, bound, "the binding was rolled back")

	// on_node_delete frees the node's address; the lowest free one is
	// handed out next.
	_, err = e.store.DeleteNode(e.ctx, n2.Name)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{n1.ID: "192.168.124.10", n3.ID: "192.168.124.12"}, e.allocations(t))
	nr4, err := e.bind(b, "n4")
	require.NoError(t, err)
	assert.Equal(t, "192.168.124.11/24", address(nr4))

	// A node that never had an address is deleted all the same.
	spare := e.node(t, "spare")
	_, err = e.store.DeleteNode(e.ctx, spare.Name)
	require.NoError(t, err)
}

func TestAllocateRejectsBadRange(t *testing.T) {
	e := newEnv(t, releaseYAML)
	n := e.node(t, "n1")
	snap := e.deployment(t, "bad")
	// The operator's deployment role data, not the template, seeds the
	// noderole's user data.
	require.NoError(t, e.store.DB.Exec(`INSERT INTO deployment_roles (deployment_id, role_id, data)
		SELECT s.deployment_id, r.id, '{"network": {"name": "admin", "prefix": 24, "range": {"first": "192.168.124.300", "last": "192.168.124.12"}}}'
		FROM snapshots s, roles r WHERE s.id = ? AND r.name = ?
		ON CONFLICT (deployment_id, role_id) DO UPDATE SET data = EXCLUDED.data`, snap.ID, network.Role).Error)
	_, err := e.bind(snap, "n1")
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "network.range.first", ie.Field)
	assert.Contains(t, ie.Reason, `"192.168.124.300" is not an IP address`)
	assert.Contains(t, ie.Reason, "on node "+n.Name)
	assert.Empty(t, e.allocations(t))
}

// TestAllocateConcurrently: nodes bound at once (in snapshots of their own,
// so that nothing else serializes them) get distinct addresses, and one
// node bound at once in several snapshots gets one address.
func TestAllocateConcurrently(t *testing.T) {
	e := newEnv(t, `
name: net
version: "1.0"
roles_metadata:
  network-admin:
    template:
      network: {name: admin, prefix: 24, range: {first: 192.168.124.10, last: 192.168.124.250}}
`)
	const n = 8
	snaps := make([]*crowbar.Snapshot, n)
	for i := range n {
		e.node(t, fmt.Sprintf("c%d", i))
		snaps[i] = e.deployment(t, fmt.Sprintf("d%d", i))
	}
	same := e.node(t, "same")

	got := make([]any, n)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			nr, err := e.bind(snaps[i], fmt.Sprintf("c%d", i))
			if err != nil {
				errs <- err
				return
			}
			got[i] = address(nr)
		})
	}
	wg.Wait()
	sameGot := make([]any, n)
	for i := range n {
		wg.Go(func() {
			nr, err := e.bind(snaps[i], "same")
			if err != nil {
				errs <- err
				return
			}
			sameGot[i] = address(nr)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	want := make([]any, n)
	for i := range n {
		want[i] = fmt.Sprintf("192.168.124.%d/24", 10+i)
	}
	assert.ElementsMatch(t, want, got, "distinct, and the lowest ones")
	for i := range n {
		assert.Equal(t, fmt.Sprintf("192.168.124.%d/24", 10+n), sameGot[i], "one address for one node")
	}
	allocs := e.allocations(t)
	assert.Len(t, allocs, n+1)
	assert.Equal(t, fmt.Sprintf("192.168.124.%d", 10+n), allocs[same.ID])
}
