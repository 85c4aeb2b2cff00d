package models_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// The report's statement scans its rows column by column instead of through
// gorm, from pgx's rows (queryGenericPlan): what it reads must be what gorm
// reads through database/sql, for rows with every kind of
// value (a chain dispatched and reported: tokens, times, chain links; JSON
// outputs and attributes) and for a row of NULLs (the reported run's row
// of that statement is mostly NULLs).
func TestScanTaskRunsReadsWhatGormReads(t *testing.T) {
	f, txn, setup, _, first := chainOfSetupAndDB(t)
	_, err := f.Store.ReportRun(f.Ctx, f.Ctl.ID, setup.ID, protocol.RunResult{Attempt: first.Attempt, ExitCode: 0,
		StdoutTail: "out\n", FinishedAt: time.Now()}, time.Minute)
	require.NoError(t, err)
	require.NoError(t, f.Store.DB.Exec(`UPDATE task_runs SET outputs = '{"url": "http://x"}', attrs_in = '{"a": {"b": [1, "two"]}}',
		attrs_out = '{}', exit_code = 3 WHERE id = ?`, setup.ID).Error)

	columns := models.TaskRunColumns()
	all := "SELECT " + strings.Join(columns, ", ") + " FROM task_runs WHERE transaction_id = $1 ORDER BY id"
	var nulls []string
	for _, c := range columns {
		if c == "id" {
			nulls = append(nulls, "7 AS id")
		} else {
			nulls = append(nulls, "NULL AS "+c)
		}
	}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"the transaction's runs": {all, []any{txn.ID}},
		"a row of NULLs":         {"SELECT " + strings.Join(nulls, ", "), nil},
	} {
		t.Run(name, func(t *testing.T) {
			var want []models.TaskRun
			require.NoError(t, f.Store.DB.Raw(q.sql, q.args...).Find(&want).Error)
			require.NotEmpty(t, want)
			got, err := models.ScanTaskRuns(f.Store.DB, q.sql, q.args...)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
	runs := f.RunsByLabel(t, txn)
	assert.Equal(t, map[string]any{"a": map[string]any{"b": []any{1.0, "two"}}}, runs["setup@"+storetest.CtlName].AttrsIn, "the JSON columns were set")
}

// Named parameters become positional ones, one per occurrence, in order;
// an @ that starts no name is left alone.
func TestPositionalSQL(t *testing.T) {
	q, names := models.PositionalSQL("SELECT @a, @b_1 WHERE x = @a AND y @> '{}' AND z = '@'")
	assert.Equal(t, "SELECT $1, $2 WHERE x = $3 AND y @> '{}' AND z = '@'", q)
	assert.Equal(t, []string{"a", "b_1", "a"}, names)
}
