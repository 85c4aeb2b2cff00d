package models_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// The report's statement runs with a generic plan, in one pipeline whose
// setting ends with it: the pool's connections keep Postgres's default
// for every other statement, and an error comes back as the statement's.
func TestQueryGenericPlan(t *testing.T) {
	store, ctx := storetest.New(t)
	db := store.DB.WithContext(ctx)
	// One connection: the statement after it runs where it ran.
	sqlDB, err := store.DB.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)

	var modes []string
	var n int
	err = models.QueryGenericPlan(db, "SELECT current_setting('plan_cache_mode'), $1::int", []any{7}, func(rows models.RowReader) error {
		for rows.Next() {
			var mode string
			if err := rows.Scan(&mode, &n); err != nil {
				return err
			}
			modes = append(modes, mode)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"force_generic_plan"}, modes, "the statement runs with generic plans")
	assert.Equal(t, 7, n, "its arguments are bound")

	var after string
	require.NoError(t, db.Raw("SELECT current_setting('plan_cache_mode')").Scan(&after).Error)
	assert.Equal(t, "auto", after, "the setting ends with the statement")

	err = models.QueryGenericPlan(db, "SELECT 1/$1::int", []any{0}, func(rows models.RowReader) error {
		for rows.Next() {
		}
		return nil
	})
	require.ErrorContains(t, err, "division by zero")
	require.NoError(t, db.Exec("SELECT 1").Error, "the connection serves the next statement")
}
