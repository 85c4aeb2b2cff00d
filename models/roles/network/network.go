// Package network is a sample role in the manner of Crowbar's network
// barclamp: binding the role network-admin to a node allocates the node an
// address of the admin network's range (its on_proposed event), once per
// node and network, and deleting the node frees it (on_node_delete).
//
// The range comes from the noderole's user data, seeded from the
// deployment role's data, seeded from the role's template:
//
//	{"network": {"name": "admin", "prefix": 24,
//	             "range": {"first": "192.168.124.10", "last": "192.168.124.250"}}}
//
// and the address lands in the noderole's system data, which the role's
// runs see among their attributes:
//
//	{"network": {"admin": {"address": "192.168.124.10/24"}}}
//
// Allocations live in the table network_allocations (migration 0011).
package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
)

// Role is the name of the role whose events this package handles.
const Role = "network-admin"

// maxClaims bounds the attempts to claim an address in one allocation:
// each failed claim means a concurrent transaction took that address (or
// gave this node one), so a few suffice unless many nodes race at once.
const maxClaims = 64

var registerOnce sync.Once

// Register registers the hooks of the network-admin role with models. It
// is called explicitly by the processes that bind roles or delete nodes
// (rather than from init) so that importing the package has no effect of
// its own; calling it again does nothing, so hooks never run twice.
func Register() {
	registerOnce.Do(func() {
		crowbar.RegisterRoleHook(Role, crowbar.OnProposed, onProposed)
		models.RegisterNodeHook(Role, models.OnNodeDelete, onNodeDelete)
	})
}

// Range is a network's allocatable addresses: First to Last inclusive,
// inside the subnet of Prefix bits that First lies in.
type Range struct {
	// Network names the network; allocations are unique per network.
	Network string
	First   netip.Addr
	Last    netip.Addr
	Prefix  int
}

// String shows the range as "admin 192.168.124.10-192.168.124.250/24".
func (r Range) String() string {
	return fmt.Sprintf("%s %s-%s/%d", r.Network, r.First, r.Last, r.Prefix)
}

// Contains reports whether a lies in the range.
func (r Range) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && a.Compare(r.First) >= 0 && a.Compare(r.Last) <= 0
}

// LowestFree returns the lowest address of the range that is not in used
// (in any order; addresses outside the range are ignored), and false when
// every address is taken.
func (r Range) LowestFree(used []netip.Addr) (netip.Addr, bool) {
	taken := slices.DeleteFunc(slices.Clone(used), func(a netip.Addr) bool { return !r.Contains(a) })
	slices.SortFunc(taken, netip.Addr.Compare)
	cand := r.First
	for _, a := range taken {
		switch c := a.Compare(cand); {
		case c < 0: // a duplicate of an address already passed
			continue
		case c > 0: // a gap: cand is free
			return cand, true
		}
		if cand == r.Last {
			return netip.Addr{}, false
		}
		cand = cand.Next()
	}
	return cand, true
}

// ParseRange reads a network's range from a role's data (see the package
// documentation). An error is an *models.InputError naming the field
// (network.name, network.prefix, network.range.first, ...) and the reason.
func ParseRange(data map[string]any) (Range, error) {
	netw, ok := data["network"].(map[string]any)
	if !ok {
		return Range{}, models.Invalid("network", "must be an object with name, range {first, last} and prefix, got %s", show(data["network"]))
	}
	var r Range
	r.Network, ok = netw["name"].(string)
	if !ok || r.Network == "" {
		return Range{}, models.Invalid("network.name", "must be a non-empty string, got %s", show(netw["name"]))
	}
	rng, ok := netw["range"].(map[string]any)
	if !ok {
		return Range{}, models.Invalid("network.range", "must be an object with first and last addresses, got %s", show(netw["range"]))
	}
	var err error
	if r.First, err = parseAddr(rng, "first"); err != nil {
		return Range{}, err
	}
	if r.Last, err = parseAddr(rng, "last"); err != nil {
		return Range{}, err
	}
	if r.First.BitLen() != r.Last.BitLen() {
		return Range{}, models.Invalid("network.range", "first %s and last %s are not of the same address family", r.First, r.Last)
	}
	if r.Last.Less(r.First) {
		return Range{}, models.Invalid("network.range", "last %s comes before first %s", r.Last, r.First)
	}
	prefix, ok := wholeNumber(netw["prefix"])
	if !ok || prefix < 1 || prefix > r.First.BitLen() {
		return Range{}, models.Invalid("network.prefix", "must be a prefix length from 1 to %d for %s, got %s", r.First.BitLen(), r.First, show(netw["prefix"]))
	}
	r.Prefix = prefix
	subnet := netip.PrefixFrom(r.First, prefix).Masked()
	if !subnet.Contains(r.Last) {
		return Range{}, models.Invalid("network.range.last", "%s is outside %s, the subnet of first %s", r.Last, subnet, r.First)
	}
	// In an IPv4 subnet with room for it, the all-zeros and all-ones host
	// addresses are the network and broadcast addresses: never a node's.
	if r.First.Is4() && prefix <= 30 {
		if r.First == subnet.Addr() {
			return Range{}, models.Invalid("network.range.first", "%s is the network address of %s", r.First, subnet)
		}
		if r.Last == lastOf(subnet) {
			return Range{}, models.Invalid("network.range.last", "%s is the broadcast address of %s", r.Last, subnet)
		}
	}
	return r, nil
}

// parseAddr reads the address at key of a range object.
func parseAddr(rng map[string]any, key string) (netip.Addr, error) {
	s, ok := rng[key].(string)
	if !ok {
		return netip.Addr{}, models.Invalid("network.range."+key, "must be an IP address string, got %s", show(rng[key]))
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, models.Invalid("network.range."+key, "%q is not an IP address", s)
	}
	return a.Unmap(), nil
}

// lastOf returns the highest address of a masked prefix.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// wholeNumber reads a JSON (float64) or YAML (int) number that must be
// whole.
func wholeNumber(v any) (int, bool) {
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || math.Abs(n) > math.MaxInt32 {
			return 0, false
		}
		return int(n), true
	case int:
		return n, true
	case int64:
		return int(n), true
	case json.Number:
		i, err := n.Int64()
		return int(i), err == nil
	}
	return 0, false
}

// show renders a value of the role's data for an error message.
func show(v any) string {
	if v == nil {
		return "nothing"
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(raw)
}

// onProposed allocates the noderole's node an address of the range in its
// user data and records it in the noderole's system data.
func onProposed(ctx context.Context, tx *gorm.DB, nr *crowbar.NodeRole) error {
	r, err := ParseRange(nr.UserData)
	if err != nil {
		var ie *models.InputError
		if errors.As(err, &ie) {
			// Said in the answer to the bind: where the operator fixes it.
			ie.Reason += fmt.Sprintf(" (in the user data of noderole %d on node %s, seeded from the deployment role's data, seeded from the template of role %s)",
				nr.ID, nr.NodeName, Role)
		}
		return fmt.Errorf("read the range of role %s: %w", Role, err)
	}
	addr, err := allocate(ctx, tx, r, nr.NodeID, nr.NodeName)
	if err != nil {
		return err
	}
	sd := nr.SystemData
	if sd == nil {
		sd = map[string]any{}
	}
	nets, _ := sd["network"].(map[string]any)
	if nets == nil {
		nets = map[string]any{}
	}
	entry, _ := nets[r.Network].(map[string]any)
	if entry == nil {
		entry = map[string]any{}
	}
	entry["address"] = netip.PrefixFrom(addr, r.Prefix).String()
	nets[r.Network] = entry
	sd["network"] = nets
	raw, err := json.Marshal(sd)
	if err != nil {
		return fmt.Errorf("encode system data of noderole %d: %w", nr.ID, err)
	}
	if err := tx.WithContext(ctx).Exec(`UPDATE noderoles SET system_data = ?::jsonb, updated_at = now() WHERE id = ?`,
		string(raw), nr.ID).Error; err != nil {
		return fmt.Errorf("record address %s of node %s in noderole %d: %w", addr, nr.NodeName, nr.ID, err)
	}
	nr.SystemData = sd
	return nil
}

// allocate returns the node's address in the network: the one it has, else
// the lowest free one of the range, claimed. Two transactions allocating
// at once cannot take one address twice (the table's unique keys); the
// loser's claim does nothing (after waiting for the winner to commit) and
// it looks again.
func allocate(ctx context.Context, tx *gorm.DB, r Range, nodeID int64, nodeName string) (netip.Addr, error) {
	db := tx.WithContext(ctx)
	for range maxClaims {
		var have []string
		if err := db.Raw(`SELECT host(address) FROM network_allocations WHERE network = ? AND node_id = ?`,
			r.Network, nodeID).Scan(&have).Error; err != nil {
			return netip.Addr{}, fmt.Errorf("look up the address of node %s in network %s: %w", nodeName, r.Network, err)
		}
		if len(have) > 0 {
			// Kept even if the range has changed since: a node's address
			// does not move under it.
			a, err := netip.ParseAddr(have[0])
			if err != nil {
				return netip.Addr{}, fmt.Errorf("address %q of node %s in network %s: %w", have[0], nodeName, r.Network, err)
			}
			return a, nil
		}
		var taken []string
		if err := db.Raw(`SELECT host(address) FROM network_allocations
			WHERE network = ? AND address BETWEEN ?::inet AND ?::inet ORDER BY address`,
			r.Network, r.First.String(), r.Last.String()).Scan(&taken).Error; err != nil {
			return netip.Addr{}, fmt.Errorf("load the addresses taken in network %s: %w", r.Network, err)
		}
		used := make([]netip.Addr, 0, len(taken))
		for _, s := range taken {
			if a, err := netip.ParseAddr(s); err == nil {
				used = append(used, a)
			}
		}
		addr, ok := r.LowestFree(used)
		if !ok {
			return netip.Addr{}, &models.ConflictError{Reason: fmt.Sprintf(
				"network %s is full: all %d addresses of its range %s-%s are allocated; node %s gets none (widen the range in the deployment role's data, or delete nodes)",
				r.Network, len(used), r.First, r.Last, nodeName)}
		}
		res := db.Exec(`INSERT INTO network_allocations (network, address, node_id) VALUES (?, ?::inet, ?)
			ON CONFLICT DO NOTHING`, r.Network, addr.String(), nodeID)
		if res.Error != nil {
			return netip.Addr{}, fmt.Errorf("allocate %s of network %s to node %s: %w", addr, r.Network, nodeName, res.Error)
		}
		if res.RowsAffected == 1 {
			return addr, nil
		}
	}
	return netip.Addr{}, &models.ConflictError{Reason: fmt.Sprintf(
		"network %s: no address could be claimed for node %s in %d attempts, too many nodes are being given one at once; try again",
		r.Network, nodeName, maxClaims)}
}

// onNodeDelete frees every address the node holds.
func onNodeDelete(ctx context.Context, tx *gorm.DB, node *models.Node) error {
	if err := tx.WithContext(ctx).Exec(`DELETE FROM network_allocations WHERE node_id = ?`, node.ID).Error; err != nil {
		return fmt.Errorf("free the addresses of node %s: %w", node.Name, err)
	}
	return nil
}
