package crowbar_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models/crowbar"
)

// roleEvents records, per "role@node", the events the role's hooks saw, in
// order, with the state the noderole was in when called. Keyed by names,
// not ids: parallel tests have databases of their own with the same ids.
var roleEvents = struct {
	sync.Mutex
	byKey map[string][]string
}{byKey: map[string][]string{}}

func init() {
	for _, role := range []string{"cache", "front"} {
		for _, event := range []string{crowbar.OnTodo, crowbar.OnBlocked, crowbar.OnTransition, crowbar.OnActive, crowbar.OnError} {
			event := event
			crowbar.RegisterRoleHook(role, event, func(_ context.Context, _ *gorm.DB, nr *crowbar.NodeRole) error {
				roleEvents.Lock()
				defer roleEvents.Unlock()
				key := nr.RoleName + "@" + nr.NodeName
				roleEvents.byKey[key] = append(roleEvents.byKey[key], event+":"+nr.State)
				return nil
			})
		}
	}
}

func eventsOf(nr *crowbar.NodeRole) []string {
	roleEvents.Lock()
	defer roleEvents.Unlock()
	return append([]string(nil), roleEvents.byKey[nr.RoleName+"@"+nr.NodeName]...)
}

// TestRoleEvents: each transition calls the role's hook for the event of
// the state entered, after the noderole (and its children) changed.
func TestRoleEvents(t *testing.T) {
	c := newCrowbar(t)
	c.deployment(t, "ev", "")
	c.node(t, "ev1", "ev")
	snap := c.propose(t, "ev")
	cache := c.bind(t, snap, "ev1", "cache")
	front := c.bind(t, snap, "ev1", "front")
	c.commit(t, snap)
	assert.Equal(t, []string{"on_todo:todo"}, eventsOf(cache))
	assert.Equal(t, []string{"on_blocked:blocked"}, eventsOf(front))

	_, err := c.store.TransitionNodeRole(c.ctx, cache.ID)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRole(c.ctx, cache.ID, true, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"on_todo:todo", "on_transition:transition", "on_active:active"}, eventsOf(cache))
	assert.Equal(t, []string{"on_blocked:blocked", "on_todo:todo"}, eventsOf(front), "the child is announced once it is todo")

	_, err = c.store.TransitionNodeRole(c.ctx, front.ID)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRole(c.ctx, front.ID, false, nil)
	require.NoError(t, err)
	_, err = c.store.RetryNodeRole(c.ctx, front.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"on_blocked:blocked", "on_todo:todo", "on_transition:transition", "on_error:error", "on_todo:todo"},
		eventsOf(front))
}
