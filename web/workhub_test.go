package web

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
)

// woken says whether ch got a wake-up.
func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestWorkHubWakesOnlyTheKindNamed(t *testing.T) {
	h := newWorkHub(slog.New(slog.DiscardHandler))
	work, cancelWork := h.wait(models.WakeWork, 7)
	defer cancelWork()
	soft, cancelSoft := h.wait(models.WakeSoftware, 7)
	defer cancelSoft()
	other, cancelOther := h.wait(models.WakeWork, 8)
	defer cancelOther()

	require.NoError(t, h.notified("w:7"))
	assert.True(t, woken(work), "a dispatch wakes the node's work poll")
	assert.False(t, woken(soft), "but not its software poll")
	assert.False(t, woken(other), "nor another node's")

	require.NoError(t, h.notified("s:7"))
	assert.False(t, woken(work))
	assert.True(t, woken(soft))

	// An earlier version's bare node id wakes both (rolling upgrade).
	require.NoError(t, h.notified("7"))
	assert.True(t, woken(work))
	assert.True(t, woken(soft))
	assert.False(t, woken(other))

	for _, bad := range []string{"", "w:", "x:7", "w:seven", "7:w"} {
		assert.Error(t, h.notified(bad), bad)
	}
}
