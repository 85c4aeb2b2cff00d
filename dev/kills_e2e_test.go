package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKillsLoseNothing is issue 11's promise on real processes: a
// transaction of 20 nodes × 10 tasks survives a SIGKILL of the process
// that serves the worker and the API, then (processes split) of the
// API-only process and of the worker-only process, each restarted. Every
// time the transaction ends ready, and the files the tasks append to on
// the node side, outside the agents, show every (node, task) exactly once.
// Tasks have no retries, so a lost run would fail the transaction.
func TestKillsLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole stack of processes")
	}
	root, err := moduleRoot()
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cfg := chaosConfig{
		nodes: 20, tasks: 10, retries: 0, heartbeatSec: 30,
		taskTime: 200 * time.Millisecond, down: 2 * time.Second, timeout: 5 * time.Minute, killAt: 0.3,
		scenarios: []string{chaosCombined, chaosAPIOnly, chaosWorkerOnly},
		postgres:  "auto", database: "anneal_kills_" + uuid.NewString()[:8],
	}
	h, err := newChaosHarness(ctx, root, t.TempDir(), cfg, log)
	if h != nil {
		defer h.close()
	}
	require.NoError(t, err)
	for _, s := range cfg.scenarios {
		r := h.run(ctx, s)
		t.Log(r.line())
		require.NoError(t, r.err, s)
		assert.Equal(t, "ready", r.status, "%s: %s", s, r.txError)
		assert.Equal(t, r.expected, r.executed, "%s: every (node, task) ran", s)
		assert.Zero(t, r.twice, "%s: nothing ran twice", s)
		assert.Zero(t, r.lost, "%s: nothing was lost", s)
		assert.NotEmpty(t, r.killed, fmt.Sprintf("%s: something was killed", s))
	}
}

// TestTwoWorkersOneKilled is issue 12's several workers on real processes:
// an API-only process (-no-worker) and two worker-only processes (no -api)
// on one task queue. A transaction of 12 nodes × 8 tasks is spread across
// both workers (the histories show activity tasks started by each
// process's identity), then one worker is SIGKILLed for good mid-run: the
// transaction still ends ready, every (node, task) run exactly once.
func TestTwoWorkersOneKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole stack of processes")
	}
	root, err := moduleRoot()
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cfg := chaosConfig{
		nodes: 12, tasks: 8, retries: 0, heartbeatSec: 30,
		taskTime: 200 * time.Millisecond, down: time.Second, timeout: 5 * time.Minute, killAt: 0.4,
		scenarios: []string{chaosTwoWorkers},
		postgres:  "auto", database: "anneal_workers_" + uuid.NewString()[:8],
	}
	h, err := newChaosHarness(ctx, root, t.TempDir(), cfg, log)
	if h != nil {
		defer h.close()
	}
	require.NoError(t, err)
	r := h.run(ctx, chaosTwoWorkers)
	t.Log(r.line())
	require.NoError(t, r.err)
	assert.Equal(t, "ready", r.status, r.txError)
	assert.Equal(t, r.expected, r.executed, "every (node, task) ran")
	assert.Zero(t, r.twice, "nothing ran twice")
	assert.Zero(t, r.lost, "nothing was lost")
	assert.Contains(t, r.killed, "worker-only (pid")
	require.Len(t, r.workers, 2)
	for _, w := range r.workers {
		n := 0
		for identity, count := range r.activities {
			if strings.HasPrefix(identity, w) {
				n += count
			}
		}
		assert.Positive(t, n, "worker %s took activity tasks of the transaction (identities %v)", w, r.activities)
	}
}
