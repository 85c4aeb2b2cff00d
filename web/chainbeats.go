package web

import (
	"sync"
	"time"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// chainBeats spaces the heartbeats the API sends for chains. Each
// heartbeat is a write on the Temporal server, and a chain of short runs
// would otherwise send one per run: what keeps its activity alive is one
// heartbeat every third of its heartbeat timeout (the agent's own run
// heartbeats cover a long run). A stop does not wait for one: the node's
// workflow cuts the chain in Postgres (CutChain).
type chainBeats struct {
	every time.Duration
	mu    sync.Mutex
	last  map[int64]time.Time // by chain head
}

// maxChainBeats bounds the map: beyond it, entries older than a heartbeat
// timeout are dropped (their chains ended without being forgotten).
const maxChainBeats = 10000

func newChainBeats(heartbeatTimeoutSec int) *chainBeats {
	return &chainBeats{every: contract.HeartbeatTimeout(heartbeatTimeoutSec) / 3, last: map[int64]time.Time{}}
}

// due says whether the chain headed by head is to heartbeat now, and if so
// counts it as done. A chain's first report sends none, only starts the
// count: its activity was started, or heartbeated by its first run's
// agent, less than a run's heartbeat period before (a chain of a node's
// ten quick tasks used to cost a heartbeat, a Temporal write, per node for
// nothing).
func (b *chainBeats) due(head int64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	last, ok := b.last[head]
	if !ok {
		b.last[head] = now
		return false
	}
	if now.Sub(last) < b.every {
		return false
	}
	if len(b.last) >= maxChainBeats {
		for h, t := range b.last {
			if now.Sub(t) > 3*b.every {
				delete(b.last, h)
			}
		}
	}
	b.last[head] = now
	return true
}

// forget drops an ended chain.
func (b *chainBeats) forget(head int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.last, head)
}
