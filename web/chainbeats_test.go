package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A chain heartbeats at most once every third of the heartbeat timeout,
// counted from its first report, which sends none; so does another chain,
// and one forgotten at its end starts over.
func TestChainBeatsSpaced(t *testing.T) {
	b := newChainBeats(3)
	now := time.Now()
	assert.False(t, b.due(1, now), "the first report starts the count")
	assert.False(t, b.due(1, now.Add(500*time.Millisecond)))
	assert.False(t, b.due(2, now.Add(500*time.Millisecond)))
	assert.True(t, b.due(1, now.Add(time.Second)))
	assert.False(t, b.due(1, now.Add(1500*time.Millisecond)))
	assert.True(t, b.due(2, now.Add(1500*time.Millisecond)))
	assert.True(t, b.due(1, now.Add(2*time.Second)))
	b.forget(2)
	assert.False(t, b.due(2, now.Add(2100*time.Millisecond)), "a forgotten chain starts over")
	assert.Equal(t, 20*time.Second, newChainBeats(0).every, "a third of the default timeout")
}
