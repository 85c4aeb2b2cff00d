package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
)

// Postgres plans a prepared statement anew for each of its first five
// executions on a connection, then keeps a generic plan only if that plan
// looks no dearer than the custom ones did; otherwise it plans the
// statement at every execution. The report's statement (batchReportSQL)
// and the hand-ahead's of an ack or a poll (handAheadSQL) take 2 to 4 ms to plan, more
// than they take to run, and their generic plans cost within a few percent
// of their custom ones: after an ANALYZE moves the estimates, Postgres
// chose custom plans for them at every call, and planning became half of
// its CPU at 100 nodes (the fifteenth session's report). Their plans do
// not depend on their parameters' values (runs found by id, a node's runs
// through its index), so they always run with a generic plan: planned once
// per connection, and again only when the tables' statistics change. So
// does the poll's (pollStatement), for the same reason.

// forceGenericPlanSQL makes the statements after it in the same implicit
// transaction (a pipeline, up to its Sync) use a generic plan.
const forceGenericPlanSQL = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

// rowReader is what reading a statement's rows needs, from database/sql
// or from pgx.
type rowReader interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// queryGenericPlan runs a positional statement with args on a connection
// of db's pool (not a transaction) with a generic plan, and hands its rows
// to read. It is one round trip, as a plain query is: the setting and the
// statement go in one pipeline, one implicit transaction, so the setting
// ends with the statement and the connection goes back to the pool as it
// was. It goes through gorm's raw callbacks, as rawPositional does, so
// that its logger and the tests' statement counts see it.
func queryGenericPlan(db *gorm.DB, query string, args []any, read func(rows rowReader) error) error {
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		// db.DB() would hand back the transaction's pool: the statement
		// would run outside the transaction, commit whatever became of it,
		// and could wait on its locks.
		return errors.New("a statement with a generic plan runs on a connection of its own, not inside a transaction")
	}
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("a connection for a generic plan: %w", err)
	}
	// A connection found broken before anything was sent on it is dropped
	// and the statement tried once more on another, as database/sql does
	// for a query.
	for attempt := 1; ; attempt++ {
		err := genericPlanOnce(db, sqlDB, query, args, read)
		if attempt == 2 || !pgconn.SafeToRetry(err) {
			return err
		}
	}
}

// genericPlanOnce is queryGenericPlan on one connection of sqlDB.
func genericPlanOnce(db *gorm.DB, sqlDB *sql.DB, query string, args []any, read func(rows rowReader) error) error {
	conn, err := sqlDB.Conn(db.Statement.Context)
	if err != nil {
		return fmt.Errorf("a connection for a generic plan: %w", err)
	}
	defer conn.Close()
	var stmtErr error
	err = conn.Raw(func(dc any) error {
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("a generic plan needs a pgx connection, not %T", dc)
		}
		tx := rawPositional(db.Session(&gorm.Session{NewDB: true}), query, args)
		tx.Statement.ConnPool = genericPlanConn{conn: pc.Conn(), read: read}
		stmtErr = tx.Callback().Raw().Execute(tx).Error
		if pgconn.SafeToRetry(stmtErr) {
			return driver.ErrBadConn // the pool closes the connection
		}
		return stmtErr
	})
	if stmtErr != nil {
		return stmtErr
	}
	return err
}

// genericPlanConn is a gorm connection pool of one pgx connection whose
// ExecContext runs a statement with a generic plan (see queryGenericPlan)
// and hands its rows to read. It does nothing else.
type genericPlanConn struct {
	conn *pgx.Conn
	read func(rows rowReader) error
}

// ExecContext runs query as queryGenericPlan says.
func (c genericPlanConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	b := &pgx.Batch{}
	b.Queue(forceGenericPlanSQL)
	b.Queue(query, args...)
	results := c.conn.SendBatch(ctx, b)
	// Close reads the pipeline to its end (the commit) and returns the
	// first error again: it is kept only when nothing failed before it.
	closeWith := func(err error) error {
		if cerr := results.Close(); err == nil {
			err = cerr
		}
		return err
	}
	if _, err := results.Exec(); err != nil {
		return nil, closeWith(err)
	}
	rows, err := results.Query()
	if err != nil {
		return nil, closeWith(err)
	}
	err = c.read(rows)
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return driver.RowsAffected(rows.CommandTag().RowsAffected()), closeWith(err)
}

var errOnlyExec = errors.New("a generic plan's connection runs its one statement only")

// PrepareContext is not used: see ExecContext.
func (genericPlanConn) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	return nil, errOnlyExec
}

// QueryContext is not used: see ExecContext.
func (genericPlanConn) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errOnlyExec
}

// QueryRowContext is not used: see ExecContext.
func (genericPlanConn) QueryRowContext(context.Context, string, ...any) *sql.Row { return nil }
