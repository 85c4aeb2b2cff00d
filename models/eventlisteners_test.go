package models_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// TestEventsAnnouncedOnlyWhileListened: the event triggers announce a
// change only while some server holds a live listener lease; the first
// lease learns that none was live, and which transactions had written
// then (they may commit unannounced), and AwaitTransactions waits for
// them.
func TestEventsAnnouncedOnlyWhileListened(t *testing.T) {
	store, url := storetest.Open(t)
	ctx := context.Background()
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "ev.anneal.test"}, false)
	require.NoError(t, err)
	conn := storetest.Listen(t, url, models.EventsChannel)
	// announced sets the node's progress and says whether its event came.
	announced := func(progress int) bool {
		t.Helper()
		require.NoError(t, store.DB.Model(&models.Node{}).Where("id = ?", node.ID).Update("progress", progress).Error)
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			return false
		}
		var ev struct {
			Kind     string `json:"kind"`
			ID       int64  `json:"id"`
			Progress int    `json:"progress"`
		}
		require.NoError(t, json.Unmarshal([]byte(n.Payload), &ev))
		assert.Equal(t, "node", ev.Kind)
		assert.Equal(t, node.ID, ev.ID)
		assert.Equal(t, progress, ev.Progress)
		return true
	}
	assert.False(t, announced(10), "announced with no listener")

	// A transaction that writes before the first lease, and commits after.
	tx := store.DB.Begin()
	require.NoError(t, tx.Model(&models.Node{}).Where("id = ?", node.ID).Update("error_type", "test").Error)
	lease, err := store.HoldEventListener(ctx, "server-a", time.Minute)
	require.NoError(t, err)
	assert.False(t, lease.WasLive)
	require.NotEmpty(t, lease.Writers, "the transaction that wrote before the lease")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, store.AwaitTransactions(short, lease.Writers, 10*time.Millisecond), context.DeadlineExceeded)
	require.NoError(t, tx.Commit().Error)
	require.NoError(t, store.AwaitTransactions(ctx, lease.Writers, 10*time.Millisecond))

	assert.True(t, announced(20), "not announced with a live lease")
	again, err := store.HoldEventListener(ctx, "server-b", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, models.EventLease{WasLive: true}, again)

	// Both leases lapse: nothing is announced, and the next lease knows.
	require.NoError(t, store.DB.Exec("UPDATE event_listeners SET until = now() - interval '1 second'").Error)
	assert.False(t, announced(30), "announced after every lease lapsed")
	lease, err = store.HoldEventListener(ctx, "server-a", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, models.EventLease{}, lease, "no lease was live, and no transaction had written")
	assert.True(t, announced(40))

	// Leases of servers gone for a day are removed.
	require.NoError(t, store.DB.Exec("UPDATE event_listeners SET until = now() - interval '2 days' WHERE id = 'server-b'").Error)
	_, err = store.HoldEventListener(ctx, "server-a", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int64(1), storetest.Count(t, store, &eventListener{}))
}

// eventListener is a row of event_listeners, for counting.
type eventListener struct{ ID string }

func (eventListener) TableName() string { return "event_listeners" }
