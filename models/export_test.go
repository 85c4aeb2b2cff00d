package models

import (
	"context"
	"database/sql"
	"time"

	"gorm.io/gorm"
)

// ClaimWorkSQL and NextOfferSQL are the agents' work queries, positional
// (positionalSQL), for the test of their plans (TestWorkQueriesUseAnIndex).
func ClaimWorkSQL() string { q, _ := positionalSQL(claimWorkSQL); return q }

// NextOfferSQL: see ClaimWorkSQL.
func NextOfferSQL() string { q, _ := positionalSQL(nextOfferSQL); return q }

// ClaimOrNextOfferSQL is the poll's one statement, for the same test.
func ClaimOrNextOfferSQL() string { return pollStatement().sql }

// UpstreamOutputsReference reads, by a query of its own, the outputs of
// the runs run depends on, directly or not, that ended well: the reference
// the inputs hash a dispatch computes (from loadSeenOutputs) must agree
// with.
func UpstreamOutputsReference(tx *gorm.DB, run *TaskRun) ([]RunOutputs, error) {
	var rows []struct {
		TaskName string
		NodeName string
		Outputs  map[string]string `gorm:"serializer:json"`
	}
	err := tx.Raw(`
WITH RECURSIVE up(id) AS (
  SELECT parent_id FROM run_edges WHERE child_id = ?
  UNION
  SELECT e.parent_id FROM run_edges e JOIN up ON e.child_id = up.id
)
SELECT r.task_name, r.node_name, r.outputs FROM task_runs r
WHERE r.transaction_id = ? AND r.state IN ('succeeded', 'skipped') AND r.outputs <> '{}'::jsonb
  AND r.id IN (SELECT id FROM up)`, run.ID, run.TransactionID).Scan(&rows).Error
	out := make([]RunOutputs, len(rows))
	for i, r := range rows {
		out[i] = RunOutputs{TaskName: r.TaskName, NodeName: r.NodeName, Outputs: r.Outputs}
	}
	return out, err
}

// ScanTaskRuns reads the task runs query selects (positional, its columns
// those of TaskRunColumns, in that order) as the report's statement reads
// its answer (queryGenericPlan, TaskRun.columnDest), for the test that this
// reads what gorm reads.
func ScanTaskRuns(db *gorm.DB, query string, args ...any) ([]TaskRun, error) {
	var runs []TaskRun
	err := queryGenericPlan(db, query, args, func(rows rowReader) error {
		for rows.Next() {
			var r TaskRun
			dests, err := r.taskRunDests(TaskRunColumns())
			if err != nil {
				return err
			}
			if err := rows.Scan(dests...); err != nil {
				return err
			}
			runs = append(runs, r)
		}
		return nil
	})
	return runs, err
}

// TaskRunColumns are the task_runs columns TaskRun has fields for.
func TaskRunColumns() []string { return batchReportStatement().columns }

// HandAheadStatement is HandAhead's statement, positional, and its
// parameters' names in order: for a test of its plan.
func HandAheadStatement() (sql string, params []string) {
	q := handAheadStatement()
	return q.sql, q.params
}

// PositionalSQL is positionalSQL, for its test.
var PositionalSQL = positionalSQL

// ClaimWork is ClaimWorkOrNextOffer's claim alone, for tests.
func (s *Store) ClaimWork(ctx context.Context, nodeID int64, lease time.Duration) ([]TaskRun, error) {
	runs, _, err := s.ClaimWorkOrNextOffer(ctx, nodeID, lease, false)
	return runs, err
}

// NextOffer is nextOfferSQL's answer alone (no claim), for tests: when the
// earliest unacknowledged run handed to a node is offered again, or the
// zero time if none waits.
func (s *Store) NextOffer(ctx context.Context, nodeID int64) (time.Time, error) {
	var next sql.NullTime
	err := s.DB.WithContext(ctx).Raw(nextOfferSQL, sql.Named("node", nodeID)).Row().Scan(&next)
	return next.Time, err
}

// RowReader is what QueryGenericPlan hands its rows to.
type RowReader = rowReader

// QueryGenericPlan runs a statement as the report's runs, for its test.
var QueryGenericPlan = queryGenericPlan
