package models_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// The report's statement runs with a generic plan, in one pipeline whose
// setting ends with it: Postgres plans it once on a connection, never
// custom, its writes are committed, the pool's connections keep
// Postgres's default for every other statement, and an error comes back
// once, as the statement's.
func TestQueryGenericPlan(t *testing.T) {
	store, ctx := storetest.New(t)
	db := store.DB.WithContext(ctx)
	// One connection: each statement after it runs where it ran.
	sqlDB, err := store.DB.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	require.NoError(t, db.Exec(`CREATE TABLE plan_probe (id bigint PRIMARY KEY, n int NOT NULL)`).Error)
	require.NoError(t, db.Exec(`INSERT INTO plan_probe SELECT g, 0 FROM generate_series(1, 100) g`).Error)

	const bump = "UPDATE plan_probe SET n = n + 1 WHERE id = $1 RETURNING n, current_setting('plan_cache_mode')"
	for i := 1; i <= 7; i++ {
		var modes []string
		var n int
		err := models.QueryGenericPlan(db, bump, []any{int64(i % 3)}, func(rows models.RowReader) error {
			for rows.Next() {
				var mode string
				if err := rows.Scan(&n, &mode); err != nil {
					return err
				}
				modes = append(modes, mode)
			}
			return nil
		})
		require.NoError(t, err)
		if i%3 != 0 {
			assert.Equal(t, []string{"force_generic_plan"}, modes, "the statement runs with generic plans")
		}
	}
	var plans struct{ GenericPlans, CustomPlans int64 }
	require.NoError(t, db.Raw(`SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = ?`, bump).Scan(&plans).Error)
	assert.Equal(t, int64(0), plans.CustomPlans, "never planned for its arguments' values")
	assert.Equal(t, int64(7), plans.GenericPlans, "the generic plan serves each call")
	var bumped []int
	require.NoError(t, db.Raw(`SELECT n FROM plan_probe WHERE id IN (1, 2) ORDER BY id`).Scan(&bumped).Error)
	assert.Equal(t, []int{3, 2}, bumped, "its writes are committed")

	var after string
	require.NoError(t, db.Raw("SELECT current_setting('plan_cache_mode')").Scan(&after).Error)
	assert.Equal(t, "auto", after, "the setting ends with the statement")

	err = models.QueryGenericPlan(db, "SELECT 1/$1::int", []any{0}, func(rows models.RowReader) error {
		for rows.Next() {
		}
		return nil
	})
	require.ErrorContains(t, err, "division by zero")
	assert.Equal(t, 1, strings.Count(err.Error(), "division by zero"), "the error once: %v", err)

	stop := errors.New("enough")
	err = models.QueryGenericPlan(db, "SELECT g FROM generate_series(1, 1000) g", nil, func(rows models.RowReader) error {
		rows.Next()
		return stop
	})
	require.ErrorIs(t, err, stop)
	require.NoError(t, db.Exec("SELECT 1").Error, "the connection serves the next statement")

	err = db.Transaction(func(tx *gorm.DB) error {
		return models.QueryGenericPlan(tx, "SELECT 1", nil, func(models.RowReader) error { return nil })
	})
	require.ErrorContains(t, err, "not inside a transaction")
}
