// Package devenv provides the development environment of anneal: a
// PostgreSQL server (found or run privately, see EnsurePostgres), a Temporal
// dev server with its Web UI (see EnsureTemporal and TemporalBinary), and a
// small helper to run and stop child processes with their output in log
// files (see StartProc). It is used by the dev tool (`go run ./dev up | test
// | bench`) and by integration tests.
//
// It targets Linux and macOS; PeakRSS works on Linux only.
package devenv
