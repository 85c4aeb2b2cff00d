package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ANNEAL_DB_MAX_CONNS and -db-max-conns: unset is the default (0), a bad
// value is an error naming the variable or flag, never a silent default.
func TestDBMaxConnsInput(t *testing.T) {
	t.Setenv("ANNEAL_DB_MAX_CONNS", "")
	n, err := envInt("ANNEAL_DB_MAX_CONNS")
	require.NoError(t, err)
	assert.Zero(t, n)

	t.Setenv("ANNEAL_DB_MAX_CONNS", "8")
	n, err = envInt("ANNEAL_DB_MAX_CONNS")
	require.NoError(t, err)
	assert.Equal(t, 8, n)

	for _, bad := range []string{"ten", "-3", "8.5"} {
		t.Setenv("ANNEAL_DB_MAX_CONNS", bad)
		_, err = envInt("ANNEAL_DB_MAX_CONNS")
		assert.ErrorContains(t, err, "ANNEAL_DB_MAX_CONNS", bad)
	}

	assert.NoError(t, checkDBMaxConns(0))
	assert.NoError(t, checkDBMaxConns(12))
	assert.ErrorContains(t, checkDBMaxConns(-1), "-db-max-conns")
}

// The worker collects its heap less often than Go's default, unless $GOGC
// says otherwise.
func TestSetDefaultGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	t.Setenv("GOGC", "")
	setDefaultGC()
	assert.Equal(t, defaultGCPercent, debug.SetGCPercent(100))

	t.Setenv("GOGC", "120")
	setDefaultGC()
	assert.Equal(t, 100, debug.SetGCPercent(100), "an operator's GOGC stands")
}
