package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSetAsideKeepsRecentBenches: the previous bench's directory is moved
// out of the way and kept, as is one set aside an hour ago; one set aside
// two days ago is deleted once the rounds are over.
func TestSetAsideKeepsRecentBenches(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	dir := filepath.Join(state, "bench")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nodes"), 0o755))
	hourOld := fmt.Sprintf("%s.old-%d", dir, time.Now().Add(-time.Hour).UnixNano())
	daysOld := fmt.Sprintf("%s.old-%d", dir, time.Now().Add(-48*time.Hour).UnixNano())
	for _, d := range []string{hourOld, daysOld} {
		require.NoError(t, os.MkdirAll(filepath.Join(d, "nodes"), 0o755))
	}

	removeOld, err := setAside(dir)
	require.NoError(t, err)
	assert.NoDirExists(t, dir, "the previous bench is moved out of the way")
	removeOld()

	olds, err := filepath.Glob(dir + ".old-*")
	require.NoError(t, err)
	assert.Len(t, olds, 2, "the previous bench and the one set aside an hour ago are kept")
	assert.Contains(t, olds, hourOld)
	assert.NoDirExists(t, daysOld, "a bench set aside two days ago is deleted")
}
