package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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
