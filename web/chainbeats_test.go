package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A chain heartbeats at most once every third of the heartbeat timeout;
// another chain, or one forgotten at its end, is due at once.
func TestChainBeatsSpaced(t *testing.T) {
	b := newChainBeats(3)
	now := time.Now()
	assert.True(t, b.due(1, now))
	assert.False(t, b.due(1, now.Add(500*time.Millisecond)))
	assert.True(t, b.due(2, now.Add(500*time.Millisecond)))
	assert.True(t, b.due(1, now.Add(time.Second)))
	b.forget(2)
	assert.True(t, b.due(2, now.Add(1100*time.Millisecond)))
	assert.Equal(t, 20*time.Second, newChainBeats(0).every, "a third of the default timeout")
}
