package models

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"gorm.io/gorm"
)

// NodeHook reacts to a node event (OnNodeCreate, OnNodeDelete) inside the
// caller's database transaction. As with noderole events, hooks run
// synchronously, so they must be fast, and must be idempotent; an error
// aborts the transaction.
type NodeHook func(ctx context.Context, tx *gorm.DB, node *Node) error

var (
	nodeHooksMu sync.RWMutex
	// nodeHooks maps role name → event → hooks in registration order.
	nodeHooks = map[string]map[string][]NodeHook{}
)

// nodeEvent reports whether event is one of the node events.
func nodeEvent(event string) bool { return event == OnNodeCreate || event == OnNodeDelete }

// RegisterNodeHook registers h for a node event of the role named role (in
// any release). Unlike noderole events, Crowbar calls node events on every
// role that defines them, whether or not it is bound to the node. event
// must be OnNodeCreate or OnNodeDelete: anything else is a programming
// error and panics.
func RegisterNodeHook(role, event string, h NodeHook) {
	if !nodeEvent(event) {
		panic(fmt.Sprintf("models.RegisterNodeHook: %q is not a node event (%s or %s)", event, OnNodeCreate, OnNodeDelete))
	}
	if h == nil {
		panic(fmt.Sprintf("models.RegisterNodeHook: nil %s hook for role %s", event, role))
	}
	nodeHooksMu.Lock()
	defer nodeHooksMu.Unlock()
	if nodeHooks[role] == nil {
		nodeHooks[role] = map[string][]NodeHook{}
	}
	nodeHooks[role][event] = append(nodeHooks[role][event], h)
}

// RunNodeHooks runs the hooks of a node event of every role that has one,
// synchronously in tx: roles in name order, each role's hooks in
// registration order, so that the outcome does not depend on map order.
// The first error stops the run and names the role and the event.
func RunNodeHooks(ctx context.Context, tx *gorm.DB, event string, node *Node) error {
	if !nodeEvent(event) {
		return fmt.Errorf("run node hooks: %q is not a node event (%s or %s)", event, OnNodeCreate, OnNodeDelete)
	}
	type roleHooks struct {
		role  string
		hooks []NodeHook
	}
	nodeHooksMu.RLock()
	all := make([]roleHooks, 0, len(nodeHooks))
	for role, events := range nodeHooks {
		if hs := events[event]; len(hs) > 0 {
			all = append(all, roleHooks{role, slices.Clone(hs)})
		}
	}
	nodeHooksMu.RUnlock()
	slices.SortFunc(all, func(a, b roleHooks) int { return cmp.Compare(a.role, b.role) })
	for _, rh := range all {
		for _, h := range rh.hooks {
			if err := h(ctx, tx, node); err != nil {
				return fmt.Errorf("%s hook of role %s on node %s: %w", event, rh.role, node.Name, err)
			}
		}
	}
	return nil
}

// Node events: every role's node hooks run at them.
const (
	OnNodeCreate = "on_node_create"
	OnNodeDelete = "on_node_delete"
)
