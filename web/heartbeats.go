package web

import (
	"context"
	"sync"
	"time"

	"github.com/anneal-dev/anneal/models"
)

// heartbeatWindow is how long the first of several agents' heartbeats
// waits for others, to record them in one statement (Store.TouchNodes):
// a thousand agents heartbeat fifty times a second, and one statement
// each was most of what an idle site cost Postgres and the API. An
// agent's heartbeat is answered this much later; it has seconds.
const heartbeatWindow = 200 * time.Millisecond

// heartbeatBatch gathers concurrent heartbeats: the first one in starts a
// flush that waits heartbeatWindow, then records all that came meanwhile
// and hands each its answer. Nothing runs between batches, so a server
// used through Handler (tests) batches too, with nothing to start or stop.
type heartbeatBatch struct {
	window time.Duration
	touch  func(context.Context, []models.NodeTouch) ([]models.Touched, error)

	mu      sync.Mutex
	pending []*heartbeat
}

// heartbeat is one agent's heartbeat waiting in a batch.
type heartbeat struct {
	in   models.NodeTouch
	out  models.Touched
	done chan struct{}
}

// record records in with the others that come within the window and
// answers what TouchNode would.
func (b *heartbeatBatch) record(ctx context.Context, in models.NodeTouch) (name string, revived bool, err error) {
	h := &heartbeat{in: in, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, h)
	first := len(b.pending) == 1
	b.mu.Unlock()
	if first {
		// The batch is recorded even if this request goes away: the
		// others wait for it.
		go b.flush(context.WithoutCancel(ctx))
	}
	select {
	case <-h.done:
		return h.out.Name, h.out.Revived, h.out.Err
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

// flush waits the window, then records the batch gathered meanwhile.
func (b *heartbeatBatch) flush(ctx context.Context) {
	time.Sleep(b.window)
	b.mu.Lock()
	batch := b.pending
	b.pending = nil
	b.mu.Unlock()
	touches := make([]models.NodeTouch, len(batch))
	for i, h := range batch {
		touches[i] = h.in
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := b.touch(ctx, touches)
	for i, h := range batch {
		if err != nil {
			h.out.Err = err
		} else {
			h.out = out[i]
		}
		close(h.done)
	}
}
