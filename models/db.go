package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-gormigrate/gormigrate/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/anneal-dev/anneal/models/secrets"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is anneal's access to Postgres. Every method that writes does so in
// one database transaction, so a failed request leaves nothing half-written.
type Store struct {
	DB *gorm.DB
	// Domain is the admin DNS domain every node name must lie in.
	Domain string
	// Keys seal and open the deployments' secrets and the nodes' SSH keys
	// (nil: they can be neither set nor read, and a result from a node
	// whose deployment has secrets is refused, since it could not be
	// redacted).
	Keys *secrets.Keyring
}

// Open connects to Postgres at url. It does not migrate.
//
// Raw statements on a run's path (dispatch, report, heartbeat) read their
// rows with Find, not Scan: gorm's Scan hands each statement to a trace
// recorder that formats it with its parameters (regular expressions over
// the whole SQL), whatever the logger, which was 6 % of the worker's CPU
// at 1,000 nodes.
func Open(ctx context.Context, url string) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(url), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		NowFunc:                func() time.Time { return time.Now().UTC() },
	})
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	LimitConns(sqlDB, DefaultMaxConns())
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	if err := sqlDB.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("ping database: %w", err)
	}
	return db, nil
}

// DefaultMaxConns is the size of a process's pool of Postgres connections:
// three per core the process may use, from 6 to 20. A few are enough: a
// run's report holds one for a fraction of a millisecond, and long polls
// hold none. More cost Postgres CPU for nothing, as each connection
// prepares and plans every statement for itself (Postgres plans a
// prepared statement anew for each of its first five executions on a
// connection): with 20 on two cores, planning was 30 % of Postgres's
// CPU at 100 nodes.
func DefaultMaxConns() int {
	return min(20, max(6, 3*runtime.GOMAXPROCS(0)))
}

// LimitConns sizes a pool to n connections, as many idle ones as open
// ones: with fewer idle, a burst of agent requests closes the surplus
// after each use and Postgres forks a new backend (several ms of its CPU)
// for nearly every run. Idle ones still go after an idle time.
func LimitConns(db *sql.DB, n int) {
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
}

// OpenMigrated opens the database at url and migrates it; done closes its
// connections.
func OpenMigrated(ctx context.Context, url string) (db *gorm.DB, done func(), err error) {
	db, err = Open(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, fmt.Errorf("open database: %w", err)
	}
	if err := Migrate(ctx, db); err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	return db, func() { sqlDB.Close() }, nil
}

// Migrate applies every migration in models/migrations that the database has
// not seen yet, in file-name order, each in its own transaction.
func Migrate(ctx context.Context, db *gorm.DB) error {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	var migrations []*gormigrate.Migration
	for _, name := range names {
		body, err := migrationFiles.ReadFile(name)
		if err != nil {
			return fmt.Errorf("read migration %s: %w", name, err)
		}
		id := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		sql := string(body)
		migrations = append(migrations, &gormigrate.Migration{
			ID: id,
			Migrate: func(tx *gorm.DB) error {
				if err := tx.Exec(sql).Error; err != nil {
					return fmt.Errorf("migration %s: %w", id, err)
				}
				return nil
			},
		})
	}
	// Two processes starting at once must not both migrate.
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(7262736)").Error; err != nil {
			return fmt.Errorf("lock for migration: %w", err)
		}
		opts := *gormigrate.DefaultOptions
		opts.UseTransaction = false // already inside one
		if err := gormigrate.New(tx, &opts, migrations).Migrate(); err != nil {
			return fmt.Errorf("migrate schema: %w", err)
		}
		return nil
	})
}

// Errors the API turns into status codes.
var (
	// ErrNotFound means the addressed object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrForbidden means the caller may not touch the object.
	ErrForbidden = errors.New("forbidden")
)

// InputError is bad input naming the field and the reason; the API answers
// it with 422 (or the Status set).
type InputError struct {
	Field   string
	Reason  string
	Details map[string]any
	Status  int
}

// Error formats the field and the reason.
func (e *InputError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Invalid returns an InputError for field.
func Invalid(field, format string, args ...any) *InputError {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ConflictError means the request clashes with existing state (409).
type ConflictError struct{ Reason string }

// Error returns the reason.
func (e *ConflictError) Error() string { return e.Reason }

func NotFound(what string, key any) error {
	return fmt.Errorf("%s %v: %w", what, key, ErrNotFound)
}

// uniqueViolation turns a unique-constraint error (two requests racing for
// one name) into a conflict; other errors pass through.
func UniqueViolation(err error, reason string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return &ConflictError{Reason: reason}
	}
	return err
}

// byRef narrows a query to the row a reference names: an id when it is all
// digits, else a name.
func ByRef(q *gorm.DB, ref string) *gorm.DB {
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		return q.Where("id = ?", id)
	}
	return q.Where("name = ?", ref)
}

// byVersionedRef narrows a query to an id, a name@version, or a name (the
// newest of that name).
func ByVersionedRef(q *gorm.DB, ref string) *gorm.DB {
	if _, err := strconv.ParseInt(ref, 10, 64); err != nil {
		if name, version, ok := strings.Cut(ref, "@"); ok {
			return q.Where("name = ? AND version = ?", name, version)
		}
		return q.Where("name = ?", ref).Order("id DESC")
	}
	return ByRef(q, ref)
}

// takeRef loads the one row of a narrowed query, or ErrNotFound naming what
// was looked for.
func TakeRef[T any](q *gorm.DB, what, ref string) (*T, error) {
	var row T
	err := q.Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound(what, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s %s: %w", what, ref, err)
	}
	return &row, nil
}

// Unavailable reports whether err says that Postgres could not be reached
// or is restarting (a connection error, SQLSTATE class 08, 57P01-57P03,
// too many connections), so that the same request may succeed later;
// rather than that the request itself was refused.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", "53300":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err)
}
