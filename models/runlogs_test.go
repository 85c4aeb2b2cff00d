package models_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// TestRunLogAppend: chunks are stored idempotently by offset (a repeated or
// overlapping chunk adds only its new bytes), a chunk past the end is
// refused with the offset to send from, another node's run is refused, and
// beyond the cap the head is kept and the rest only counted.
func TestRunLogAppend(t *testing.T) {
	f := storetest.NewFixture(t)
	txn, _ := f.Plan(t)
	setup := f.RunsByLabel(t, txn)["setup@"+storetest.CtlName]
	_, err := f.Store.DispatchRun(f.Ctx, setup.ID, []byte("token-1"))
	require.NoError(t, err)
	app := func(offset int64, data string) (models.RunLogState, error) {
		return f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, 1, offset, []byte(data))
	}

	st, err := app(0, "hello ")
	require.NoError(t, err)
	assert.Equal(t, models.RunLogState{Size: 6, Stored: 6}, st)
	st, err = app(0, "hello ") // sent again: nothing new
	require.NoError(t, err)
	assert.Equal(t, int64(6), st.Size)
	st, err = app(3, "lo world\n") // overlaps: only "world\n" is new
	require.NoError(t, err)
	assert.Equal(t, int64(12), st.Size)
	_, err = app(20, "gap")
	var oe *models.LogOffsetError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, int64(12), oe.Expected)
	st, err = app(12, "") // asks where to resume
	require.NoError(t, err)
	assert.Equal(t, int64(12), st.Size)

	data, st, err := f.Store.RunLog(f.Ctx, setup.ID, 1, 0)
	require.NoError(t, err)
	assert.Equal(t, "hello world\n", string(data))
	data, _, err = f.Store.RunLog(f.Ctx, setup.ID, 1, 8)
	require.NoError(t, err)
	assert.Equal(t, "rld\n", string(data), "read from an offset inside a chunk")

	_, err = f.Store.AppendRunLog(f.Ctx, f.Cmp.ID, setup.ID, 1, 12, []byte("x"))
	assert.ErrorIs(t, err, models.ErrForbidden, "another node's run")
	_, err = f.Store.AppendRunLog(f.Ctx, f.Cmp.ID, setup.ID, 1, 0, []byte("x"))
	assert.ErrorIs(t, err, models.ErrForbidden, "another node's run, at the start of its log (the one-statement path)")
	_, err = f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, 2, 0, []byte("x"))
	var ie *models.InputError
	require.ErrorAs(t, err, &ie, "a later attempt than the run's")
	assert.Equal(t, "attempt", ie.Field)

	// The cap: fill to just below it, then cross it.
	big := bytes.Repeat([]byte("0123456789abcdef"), models.MaxLogChunkBytes/16)
	pos := st.Size
	for pos+int64(len(big)) <= models.MaxRunLogBytes {
		st, err = f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, 1, pos, big)
		require.NoError(t, err)
		pos = st.Size
	}
	assert.False(t, st.Truncated)
	st, err = f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, 1, pos, big)
	require.NoError(t, err)
	assert.True(t, st.Truncated)
	assert.Equal(t, int64(models.MaxRunLogBytes), st.Stored)
	assert.Equal(t, pos+int64(len(big)), st.Size, "the bytes past the cap are counted")
	// Truncated: the agent may skip ahead, only the length counts.
	st, err = f.Store.AppendRunLog(f.Ctx, f.Ctl.ID, setup.ID, 1, st.Size+1000, nil)
	require.NoError(t, err)
	assert.Equal(t, pos+int64(len(big))+1000, st.Size)
	data, st, err = f.Store.RunLog(f.Ctx, setup.ID, 1, 0)
	require.NoError(t, err)
	assert.Len(t, data, models.MaxRunLogBytes)
	assert.True(t, strings.HasPrefix(string(data), "hello world\n0123"))
	assert.True(t, st.Truncated)
}
