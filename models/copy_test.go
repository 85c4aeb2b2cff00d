package models_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// What ConnTransaction copies is part of its transaction: seen inside it,
// committed with it, rolled back with it (an error of fn, or a COPY that
// fails), and the connection serves the next caller either way.
func TestConnTransactionCopies(t *testing.T) {
	store, ctx := storetest.New(t)
	require.NoError(t, store.DB.Exec(`CREATE TABLE copy_probe (id bigint PRIMARY KEY, name text NOT NULL)`).Error)
	rows := func(ids ...int64) pgx.CopyFromSource {
		return pgx.CopyFromSlice(len(ids), func(i int) ([]any, error) { return []any{ids[i], "n"}, nil })
	}
	count := func(db *gorm.DB) int64 {
		var n int64
		require.NoError(t, db.Table("copy_probe").Count(&n).Error)
		return n
	}

	err := models.ConnTransaction(ctx, store.DB, func(tx *gorm.DB, copyRows models.CopyFunc) error {
		n, err := copyRows(ctx, "copy_probe", []string{"id", "name"}, rows(1, 2, 3))
		require.NoError(t, err)
		assert.Equal(t, int64(3), n)
		assert.Equal(t, int64(3), count(tx), "the transaction sees its copy")
		return tx.Exec(`INSERT INTO copy_probe VALUES (4, 'm')`).Error
	})
	require.NoError(t, err)
	assert.Equal(t, int64(4), count(store.DB), "committed together")

	boom := errors.New("boom")
	err = models.ConnTransaction(ctx, store.DB, func(tx *gorm.DB, copyRows models.CopyFunc) error {
		_, err := copyRows(ctx, "copy_probe", []string{"id", "name"}, rows(5, 6))
		require.NoError(t, err)
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, int64(4), count(store.DB), "rolled back with fn's error")

	err = models.ConnTransaction(ctx, store.DB, func(tx *gorm.DB, copyRows models.CopyFunc) error {
		require.NoError(t, tx.Exec(`INSERT INTO copy_probe VALUES (7, 'm')`).Error)
		_, err := copyRows(ctx, "copy_probe", []string{"id", "name"}, rows(8, 1)) // 1 exists
		return err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "copy into copy_probe")
	assert.Equal(t, int64(4), count(store.DB), "a failed COPY rolls back the whole transaction")

	// Every connection of the pool still works.
	sqlDB, err := store.DB.DB()
	require.NoError(t, err)
	for range sqlDB.Stats().OpenConnections + 1 {
		assert.Equal(t, int64(4), count(store.DB.WithContext(context.Background())))
	}
}
