package daemon

import (
	"os"
	"runtime/debug"
)

// DefaultGCPercent is an agent process's GOGC when its environment sets
// none. An agent's live heap is a few MiB, so collecting it a quarter as
// often as Go's default (100) costs a few MiB more; the collector was a
// tenth of an agent's own CPU per run.
const DefaultGCPercent = 400

// SetDefaultGC sets DefaultGCPercent unless $GOGC says otherwise. The
// agent's main calls it (and so does dev's bench, for its agent hosts): a
// library must not change its host process's collector.
func SetDefaultGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
}
