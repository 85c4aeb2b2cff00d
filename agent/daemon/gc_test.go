package daemon_test

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/anneal-dev/anneal/agent/daemon"
)

// The agent collects its small heap less often than Go's default, unless
// $GOGC says otherwise.
func TestSetDefaultGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	t.Setenv("GOGC", "")
	daemon.SetDefaultGC()
	assert.Equal(t, daemon.DefaultGCPercent, debug.SetGCPercent(100))

	t.Setenv("GOGC", "150")
	daemon.SetDefaultGC()
	assert.Equal(t, 100, debug.SetGCPercent(100), "an operator's GOGC stands")
}
