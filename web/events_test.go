package web

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func quietHub() *eventHub { return newEventHub(slog.New(slog.NewTextHandler(io.Discard, nil))) }

// TestEventHubDropsSlowSubscribers: a subscriber that does not read is
// dropped once its queue is full, and publishing neither blocks nor stops
// reaching a subscriber that reads.
func TestEventHubDropsSlowSubscribers(t *testing.T) {
	h := quietHub()
	slow, _, _ := h.subscribe(0, "")
	fast, _, _ := h.subscribe(0, "")
	received := make(chan int, 1)
	go func() {
		n := 0
		for range fast.ch {
			n++
			if n == eventQueue+10 {
				received <- n
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		for i := 0; i < eventQueue+10; i++ {
			h.publish(fmt.Sprintf(`{"kind": "run", "id": %d, "deployment_id": 1, "state": "running"}`, i))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("publishing blocked on a subscriber that does not read")
	}
	select {
	case <-slow.gone:
		assert.Contains(t, slow.reason, "fell behind")
	default:
		t.Fatal("the slow subscriber was not dropped")
	}
	select {
	case n := <-received:
		assert.Equal(t, eventQueue+10, n)
	case <-time.After(5 * time.Second):
		t.Fatal("the reading subscriber did not get every event")
	}
	assert.Len(t, h.subs, 1)
}

// TestEventHubFilterAndReplay: a deployment's subscriber gets its events
// (a node moved away included) and no others; Last-Event-ID replays what
// followed, and an id the hub cannot replay asks for a resync.
func TestEventHubFilterAndReplay(t *testing.T) {
	h := quietHub()
	sub, _, _ := h.subscribe(2, "")
	h.publish(`{"kind" : "node", "id" : 1, "deployment_id" : 2, "state" : "discover"}`)
	h.publish(`{"kind": "node", "id": 2, "deployment_id": 3, "state": "discover"}`)
	h.publish(`{"kind": "node", "id": 1, "deployment_id": 3, "from_deployment_id": 2, "state": "discover"}`)
	h.publish(`not json`)
	h.resync("test")
	var got []event
	for len(sub.ch) > 0 {
		got = append(got, <-sub.ch)
	}
	require.Len(t, got, 3)
	assert.Equal(t, `{"kind":"node","id":1,"deployment_id":2,"state":"discover"}`, string(got[0].data))
	assert.Equal(t, uint64(3), got[1].seq)
	assert.Equal(t, eventResync, got[2].kind)

	_, missed, resync := h.subscribe(2, h.id(got[0]))
	assert.False(t, resync)
	require.Len(t, missed, 2)
	assert.Equal(t, got[1].seq, missed[0].seq)
	_, _, resync = h.subscribe(2, "other-1")
	assert.True(t, resync)
	_, _, resync = h.subscribe(2, h.epoch+"-999")
	assert.True(t, resync)

	h.close()
	select {
	case <-sub.gone:
	default:
		t.Fatal("closing the hub did not end the streams")
	}
	late, _, _ := h.subscribe(0, "")
	<-late.gone
}
