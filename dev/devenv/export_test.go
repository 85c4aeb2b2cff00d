package devenv

// Internals exposed to the external tests.
var (
	DSNWithDatabase    = dsnWithDatabase
	FindPostgresBinDir = findPostgresBinDir
	IsWantedTemporal   = isWantedTemporal
)

// StartedHere reports whether this Postgres started its private cluster and
// has not stopped it yet.
func (p *Postgres) StartedHere() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}
