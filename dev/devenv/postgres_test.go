package devenv_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/devenv"
)

// localPostgres returns the server on 127.0.0.1:5432, or skips the test.
func localPostgres(t *testing.T) *devenv.Postgres {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second)
	if err != nil {
		t.Skipf("no PostgreSQL server answers on 127.0.0.1:5432 (%v); start one to run this test", err)
	}
	c.Close()
	t.Setenv("DATABASE_URL", "")
	t.Setenv(devenv.EnvPostgresMode, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg, err := devenv.EnsurePostgres(ctx, t.TempDir(), testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pg.Close()) })
	if pg.Source != devenv.PostgresLocal {
		t.Skipf("the server on 127.0.0.1:5432 has no role usable without a password (got %s)", pg.Source)
	}
	return pg
}

func query[T any](t *testing.T, dsn, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v T
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&v))
	return v
}

func execSQL(t *testing.T, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err)
}

func dbExists(t *testing.T, pg *devenv.Postgres, name string) bool {
	return query[bool](t, pg.URL, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name)
}

func TestEnsurePostgresLocal(t *testing.T) {
	pg := localPostgres(t)
	assert.Contains(t, pg.URL, "@127.0.0.1:5432/postgres")
	assert.Empty(t, pg.DataDir)
	assert.Equal(t, 1, query[int](t, pg.URL, "SELECT 1"))
}

func TestEnsurePostgresFromEnv(t *testing.T) {
	pg := localPostgres(t)
	t.Setenv("DATABASE_URL", pg.URL)
	got, err := devenv.EnsurePostgres(context.Background(), t.TempDir(), testLogger(t))
	require.NoError(t, err)
	assert.Equal(t, devenv.PostgresFromEnv, got.Source)
	assert.Equal(t, pg.URL, got.URL)

	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	_, err = devenv.EnsurePostgres(context.Background(), t.TempDir(), testLogger(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DATABASE_URL")
}

func TestDatabaseRoundTrip(t *testing.T) {
	pg := localPostgres(t)
	ctx := context.Background()
	// A name that needs quoting, both in SQL and in the URL.
	name := fmt.Sprintf(`anneal devenv "t%d"`, os.Getpid())
	clone := name + " clone"
	t.Cleanup(func() {
		assert.NoError(t, pg.DropDatabase(ctx, name))
		assert.NoError(t, pg.DropDatabase(ctx, clone))
	})

	dsn, err := pg.EnsureDatabase(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, pg.DatabaseURL(name), dsn)
	assert.Equal(t, name, query[string](t, dsn, "SELECT current_database()"))
	execSQL(t, dsn, "CREATE TABLE marker (id int); INSERT INTO marker VALUES (42)")

	again, err := pg.EnsureDatabase(ctx, name)
	require.NoError(t, err, "EnsureDatabase is idempotent")
	assert.Equal(t, dsn, again)
	assert.Equal(t, 42, query[int](t, dsn, "SELECT id FROM marker"), "EnsureDatabase keeps the data")

	cloneDSN, err := pg.CreateDatabaseFromTemplate(ctx, clone, name)
	require.NoError(t, err)
	assert.Equal(t, 42, query[int](t, cloneDSN, "SELECT id FROM marker"), "the clone has the template's data")
	execSQL(t, cloneDSN, "UPDATE marker SET id = 7")
	cloneDSN, err = pg.CreateDatabaseFromTemplate(ctx, clone, name)
	require.NoError(t, err, "cloning again replaces the clone")
	assert.Equal(t, 42, query[int](t, cloneDSN, "SELECT id FROM marker"))

	// Reset disconnects open sessions and empties the database.
	held, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer held.Close(ctx)
	dsn, err = pg.ResetDatabase(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 0, query[int](t, dsn, "SELECT count(*)::int FROM pg_tables WHERE tablename = 'marker'"))

	require.NoError(t, pg.DropDatabase(ctx, clone))
	assert.False(t, dbExists(t, pg, clone))
	require.NoError(t, pg.DropDatabase(ctx, clone), "dropping a missing database is fine")
	assert.True(t, dbExists(t, pg, name))

	_, err = pg.CreateDatabaseFromTemplate(ctx, clone, "anneal_devenv_no_such_template")
	require.Error(t, err)
	_, err = pg.EnsureDatabase(ctx, "")
	require.Error(t, err)
	_, err = pg.EnsureDatabase(ctx, strings.Repeat("x", 64))
	require.Error(t, err)
}

func TestDatabaseURL(t *testing.T) {
	cases := []struct{ dsn, name, want string }{
		{"postgres://root@127.0.0.1:5432/postgres?sslmode=disable", "app", "postgres://root@127.0.0.1:5432/app?sslmode=disable"},
		{"postgresql://u:p%40ss@h/db", "a b", "postgresql://u:p%40ss@h/a%20b"},
		{"postgres://h:1", "x", "postgres://h:1/x"},
		{"host=h user=u dbname=old sslmode=disable", "new", "host=h user=u dbname='new' sslmode=disable"},
		{"dbname='o ld' host=h", "it's", `dbname='it\'s' host=h`},
		{"host=h", "n", "host=h dbname='n'"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, devenv.DSNWithDatabase(c.dsn, c.name), c.dsn)
	}
}

func TestPrivateCluster(t *testing.T) {
	if _, err := devenv.FindPostgresBinDir(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	t.Setenv(devenv.EnvPostgresMode, devenv.PostgresPrivate)
	t.Setenv("DATABASE_URL", "postgres://ignored@127.0.0.1:1/x") // must be skipped
	// t.TempDir has a 0700 parent: when we are root, the postgres OS user
	// cannot reach it, which exercises the data-outside-the-state-dir path.
	stateDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := testLogger(t)

	pg, err := devenv.EnsurePostgres(ctx, stateDir, log)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = pg.Close()
		if dir := filepath.Dir(pg.DataDir); strings.HasPrefix(filepath.Base(dir), "anneal-pg-") {
			os.RemoveAll(dir) // the data went outside the state dir
		}
	})
	assert.Equal(t, devenv.PostgresPrivate, pg.Source)
	assert.True(t, pg.StartedHere())
	assert.FileExists(t, filepath.Join(pg.DataDir, "PG_VERSION"))
	assert.Equal(t, filepath.Join(stateDir, "pg.log"), pg.LogFile)
	assert.FileExists(t, pg.LogFile)
	assert.Contains(t, pg.URL, "postgres://postgres@/postgres?host=")
	assert.True(t, query[bool](t, pg.URL, "SELECT inet_server_addr() IS NULL"), "connected through the cluster's Unix socket, not TCP")
	dsn, err := pg.EnsureDatabase(ctx, "anneal_private")
	require.NoError(t, err)
	execSQL(t, dsn, "CREATE TABLE kept (id int)")

	// Restart bounces it: a session is ended, the data and the URL stay.
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, pg.Restart(ctx))
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the old session was ended by the restart")
	assert.Equal(t, 0, query[int](t, dsn, "SELECT count(*)::int FROM kept"))
	assert.True(t, pg.StartedHere(), "still ours to stop")

	// A second call finds it running and does not own it.
	pg2, err := devenv.EnsurePostgres(ctx, stateDir, log)
	require.NoError(t, err)
	assert.Equal(t, pg.URL, pg2.URL)
	assert.Equal(t, pg.DataDir, pg2.DataDir)
	assert.False(t, pg2.StartedHere())
	require.NoError(t, pg2.Close())
	assert.Equal(t, 1, query[int](t, pg.URL, "SELECT 1"), "closing the second handle leaves the server up")

	// Close stops it.
	require.NoError(t, pg.Close())
	assert.False(t, pg.StartedHere())
	require.NoError(t, pg.Close(), "second Close")
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = pgx.Connect(pctx, pg.URL)
	pcancel()
	require.Error(t, err, "the server should be stopped")

	// A third call restarts the same cluster, data intact, without initdb.
	pg3, err := devenv.EnsurePostgres(ctx, stateDir, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg3.Close() })
	assert.True(t, pg3.StartedHere())
	assert.Equal(t, pg.DataDir, pg3.DataDir)
	assert.Equal(t, 0, query[int](t, pg3.DatabaseURL("anneal_private"), "SELECT count(*)::int FROM kept"))
	require.NoError(t, pg3.Close())
	b, err := os.ReadFile(pg.LogFile)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(b), "anneal: initdb"), "initdb ran once")
}

func TestRestartOnlyAPrivateCluster(t *testing.T) {
	pg := &devenv.Postgres{URL: "postgres://x@127.0.0.1:5432/postgres", Source: devenv.PostgresLocal}
	err := pg.Restart(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "only a private cluster")
}

func TestEnsurePostgresBadMode(t *testing.T) {
	t.Setenv(devenv.EnvPostgresMode, "docker")
	_, err := devenv.EnsurePostgres(context.Background(), t.TempDir(), nil)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), devenv.EnvPostgresMode), err.Error())
	assert.False(t, errors.Is(err, context.Canceled))
}

func TestPrivateClusterConcurrentCallers(t *testing.T) {
	if _, err := devenv.FindPostgresBinDir(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	t.Setenv(devenv.EnvPostgresMode, devenv.PostgresPrivate)
	stateDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var pgs [2]*devenv.Postgres
	var errs [2]error
	var wg sync.WaitGroup
	for i := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pgs[i], errs[i] = devenv.EnsurePostgres(ctx, stateDir, testLogger(t))
		}()
	}
	wg.Wait()
	for i := range pgs {
		require.NoError(t, errs[i])
		p := pgs[i]
		t.Cleanup(func() {
			_ = p.Close()
			if dir := filepath.Dir(p.DataDir); strings.HasPrefix(filepath.Base(dir), "anneal-pg-") {
				os.RemoveAll(dir)
			}
		})
	}
	assert.Equal(t, pgs[0].URL, pgs[1].URL)
	assert.True(t, pgs[0].StartedHere() != pgs[1].StartedHere(), "exactly one caller started the cluster")
}
