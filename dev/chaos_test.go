package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChaosCount: lines the tasks wrote become the table's figures: a pair
// written twice is "twice", a pair never written is "lost", and recovery is
// from the kill to the end of the first run that started after it (on the
// killed node, when an agent was killed).
func TestChaosCount(t *testing.T) {
	dir := t.TempDir()
	write := func(node, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, node), []byte(content), 0o644))
	}
	write("a", "a t01 100.000000000 100.500000000\na t02 101.000000000 101.500000000\na t02 104.000000000 104.500000000\n")
	write("b", "b t01 100.100000000 100.600000000\nb t02 102.250000000 102.750000000\npartial")
	recs, err := readRunRecords(dir)
	require.NoError(t, err)
	require.Len(t, recs, 5, "a half-written line is not a run")

	kill := time.Unix(102, 0)
	var r chaosResult
	r.count(recs, []string{"a", "b", "c"}, 2, kill, "")
	assert.Equal(t, 5, r.executed)
	assert.Equal(t, 1, r.twice, "a t02")
	assert.Equal(t, 2, r.lost, "c t01 and c t02")
	assert.Equal(t, 750*time.Millisecond, r.recovery, "b t02 started after the kill and ended 0.75s after it")
	assert.True(t, r.failed())

	r = chaosResult{}
	r.count(recs, []string{"a", "b"}, 2, kill, "a")
	assert.Equal(t, 2500*time.Millisecond, r.recovery, "only the killed node's runs count")
	assert.Zero(t, r.lost)

	r = chaosResult{recovery: -1}
	r.count(recs, []string{"a", "b"}, 2, time.Unix(200, 0), "")
	assert.Equal(t, time.Duration(-1), r.recovery, "nothing started after the kill")
}

// TestChaosReleaseIsOneChainPerNode: the generated release chains the
// tasks, carries the retries, and writes to the runs directory quoted.
func TestChaosReleaseIsOneChainPerNode(t *testing.T) {
	rel := chaosRelease(chaosConfig{tasks: 3, retries: 2, taskTime: 250 * time.Millisecond}, "/tmp/it's here")
	assert.Contains(t, rel, "      - id: t01\n")
	assert.Contains(t, rel, "      - id: t03\n        tags: [chaos]\n        requires: [t02]\n")
	assert.NotContains(t, rel, "requires: [t00]")
	assert.Contains(t, rel, "retries: 2")
	assert.Contains(t, rel, "sleep 0.250")
	assert.Contains(t, rel, `>> '/tmp/it'\''s here'/"$ANNEAL_NODE"`)
}
