package web

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
)

// Heartbeats that come within the window are recorded in one call, each
// answered with its own result; one whose request goes away does not stop
// the others'; a failed call fails them all; the next heartbeat starts a
// new batch.
func TestHeartbeatBatch(t *testing.T) {
	var mu sync.Mutex
	var calls [][]models.NodeTouch
	fail := false
	b := &heartbeatBatch{window: 100 * time.Millisecond, touch: func(_ context.Context, in []models.NodeTouch) ([]models.Touched, error) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, in)
		if fail {
			return nil, errors.New("database down")
		}
		out := make([]models.Touched, len(in))
		for i, t := range in {
			out[i] = models.Touched{Name: t.BootID, Revived: t.NodeID == 2}
		}
		return out, nil
	}}

	gone, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	answers := make([]models.Touched, 3)
	for i := range 3 {
		wg.Go(func() {
			ctx := context.Background()
			if i == 0 {
				ctx = gone // the first, whose request goes away
			}
			name, revived, err := b.record(ctx, models.NodeTouch{NodeID: int64(i + 1), BootID: []string{"a", "b", "c"}[i]})
			answers[i] = models.Touched{Name: name, Revived: revived, Err: err}
		})
		if i == 0 {
			time.Sleep(10 * time.Millisecond) // the others join its batch
			cancel()
		}
	}
	wg.Wait()
	assert.ErrorIs(t, answers[0].Err, context.Canceled)
	assert.Equal(t, models.Touched{Name: "b", Revived: true}, answers[1])
	assert.Equal(t, models.Touched{Name: "c"}, answers[2])
	mu.Lock()
	require.Len(t, calls, 1, "one call for the three")
	assert.Len(t, calls[0], 3, "the gone request's heartbeat recorded too")
	fail = true
	mu.Unlock()

	_, _, err := b.record(context.Background(), models.NodeTouch{NodeID: 4, BootID: "d"})
	assert.ErrorContains(t, err, "database down")
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, calls, 2, "a new batch")
}
