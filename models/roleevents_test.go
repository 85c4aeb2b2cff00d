package models_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
)

// roleEvents records, per noderole id, the events its role's hooks saw, in
// order, together with the state the noderole was in when called.
var roleEvents = struct {
	sync.Mutex
	byID map[int64][]string
}{byID: map[int64][]string{}}

func init() {
	for _, role := range []string{"cache", "front"} {
		for _, event := range []string{models.OnTodo, models.OnBlocked, models.OnTransition, models.OnActive, models.OnError} {
			event := event
			models.RegisterRoleHook(role, event, func(_ context.Context, _ *gorm.DB, nr *models.NodeRole) error {
				roleEvents.Lock()
				defer roleEvents.Unlock()
				roleEvents.byID[nr.ID] = append(roleEvents.byID[nr.ID], event+":"+nr.State)
				return nil
			})
		}
	}
}

func eventsOf(id int64) []string {
	roleEvents.Lock()
	defer roleEvents.Unlock()
	return append([]string(nil), roleEvents.byID[id]...)
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
	assert.Equal(t, []string{"on_todo:todo"}, eventsOf(cache.ID))
	assert.Equal(t, []string{"on_blocked:blocked"}, eventsOf(front.ID))

	_, err := c.store.TransitionNodeRole(c.ctx, cache.ID)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRole(c.ctx, cache.ID, true, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"on_todo:todo", "on_transition:transition", "on_active:active"}, eventsOf(cache.ID))
	assert.Equal(t, []string{"on_blocked:blocked", "on_todo:todo"}, eventsOf(front.ID), "the child is announced once it is todo")

	_, err = c.store.TransitionNodeRole(c.ctx, front.ID)
	require.NoError(t, err)
	_, err = c.store.FinishNodeRole(c.ctx, front.ID, false, nil)
	require.NoError(t, err)
	_, err = c.store.RetryNodeRole(c.ctx, front.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"on_blocked:blocked", "on_todo:todo", "on_transition:transition", "on_error:error", "on_todo:todo"},
		eventsOf(front.ID))
}
