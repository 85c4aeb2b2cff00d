// Package testenv gives integration tests a real Postgres database and a
// real Temporal server, as prepared by `go run ./dev test`, and assembles a
// whole anneal stack (worker, REST API over HTTP) on them.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/roles/network"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/scenarios"
	"github.com/anneal-dev/anneal/web"
	"github.com/anneal-dev/anneal/worker/server"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// Environment variables set by `go run ./dev test`.
const (
	EnvDatabaseURL = "ANNEAL_TEST_DATABASE_URL" // admin URL of the test Postgres server
	EnvTemplate    = "ANNEAL_TEST_TEMPLATE"     // a migrated database to clone per test
	EnvTemporal    = "ANNEAL_TEST_TEMPORAL_ADDRESS"
	EnvRequire     = "ANNEAL_REQUIRE_INTEGRATION" // set: missing services fail instead of skip
	// EnvChromium is the Chromium binary `dev test` found or installed
	// for the dashboard's browser test; EnvChromiumError says why there is
	// none.
	EnvChromium      = "ANNEAL_TEST_CHROMIUM"
	EnvChromiumError = "ANNEAL_TEST_CHROMIUM_ERROR"
)

// Chromium returns the headless browser for tests that drive the
// dashboard: the one `dev test` found, else one on this machine. Without
// one the test fails under `dev test` saying what to install (and is
// skipped under a bare go test).
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	why := os.Getenv(EnvChromiumError)
	if why == "" {
		p, err := devenv.FindChromium()
		if err == nil {
			return p
		}
		why = err.Error()
	}
	if os.Getenv(EnvRequire) != "" {
		t.Fatalf("the dashboard test needs a headless Chromium: %s", why)
	}
	t.Skipf("needs a headless Chromium: %s", why)
	return ""
}

func need(t testing.TB, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("%s is not set although %s is", key, EnvRequire)
		}
		t.Skipf("integration test: %s is not set; run the suite with `go run ./dev test`", key)
	}
	return v
}

// Database returns the URL of a fresh, migrated database of its own,
// cloned from the template and dropped when the test ends.
func Database(t testing.TB) string {
	t.Helper()
	admin := need(t, EnvDatabaseURL)
	template := need(t, EnvTemplate)
	name := "anneal_t_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err, "connect to the test Postgres server")
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{template}.Sanitize()))
	require.NoError(t, err, "clone the template database")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// Store opens a fresh database (see Database) as a Store.
func Store(t testing.TB) (*models.Store, string) {
	t.Helper()
	dbURL := Database(t)
	db, err := models.Open(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return &models.Store{DB: db, Domain: server.DefaultDomain, Keys: Keys()}, dbURL
}

// testKeys is the secret key of every test stack and client of a test
// binary: stores seal secrets with it, and Temporal payloads are
// encrypted with it as in production.
var testKeys = func() *secrets.Keyring {
	k, err := secrets.ParseKeys(secrets.GenerateKey())
	if err != nil {
		panic(err)
	}
	return k
}()

// Keys returns the test binary's secret keys.
func Keys() *secrets.Keyring { return testKeys }

// TemporalClient dials the test Temporal server. The first call of the
// process makes sure anneal's search attributes are registered on its
// namespace (`dev test` registers them on the server it starts; a server
// given by ANNEAL_TEST_TEMPORAL_ADDRESS may not have them).
func TemporalClient(t testing.TB) client.Client {
	t.Helper()
	addr := need(t, EnvTemporal)
	c, err := client.Dial(server.ClientOptions(addr, "", Keys(), quietLogger{}))
	require.NoError(t, err, "dial Temporal at %s", addr)
	t.Cleanup(c.Close)
	registerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, registerErr = devenv.RegisterSearchAttributes(ctx, c, "default", contract.SearchAttributes())
	})
	require.NoError(t, registerErr, "register anneal's search attributes on the test Temporal server")
	return c
}

var (
	registerOnce sync.Once
	registerErr  error
)

// Options tune a Stack.
type Options struct {
	// HeartbeatTimeoutSec is handed to transactions (default 3 in tests, so
	// that a dead agent fails fast).
	HeartbeatTimeoutSec int
	// TemporalUI, when set, is handed to the API for its workflow links.
	TemporalUI string
	// LogSink, when set, also receives every log line of the stack (API,
	// worker, activities) and of the agents StartAgent starts.
	LogSink io.Writer
}

// Stack is a running anneal: its own database, a worker on its own task
// queue and the REST API over real HTTP.
type Stack struct {
	URL         string
	AdminToken  string
	EnrollToken string
	Store       *models.Store
	DatabaseURL string
	Temporal    client.Client
	TaskQueue   string
	// API is the API server, for tests that call what its process runs in
	// the background (Reconcile).
	API    *web.Server
	worker worker.Worker
	log    *slog.Logger
	// heartbeatTimeoutSec is handed to the worker's noderole runs.
	heartbeatTimeoutSec int
}

// NewStack starts a stack that stops when the test ends.
func NewStack(t testing.TB, opts Options) *Stack {
	t.Helper()
	if opts.HeartbeatTimeoutSec == 0 {
		opts.HeartbeatTimeoutSec = 3
	}
	log := Logger(t)
	if opts.LogSink != nil {
		w := &testWriter{t: t}
		t.Cleanup(func() { w.done.Store(true) })
		log = slog.New(slog.NewTextHandler(io.MultiWriter(w, opts.LogSink), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	store, dbURL := Store(t)
	tc := TemporalClient(t)
	// The sample roles' hooks, as the server registers them.
	network.Register()
	require.NoError(t, fuel.EnsureBuiltinScenarios(context.Background(), fuel.New(store), scenarios.Builtins()...))
	require.NoError(t, fuel.EnsureBuiltinGraphs(context.Background(), fuel.New(store), scenarios.BuiltinGraphs()...))
	queue := "anneal-test-" + uuid.NewString()[:8]
	st := &Stack{Store: store, DatabaseURL: dbURL, Temporal: tc, TaskQueue: queue, log: log, heartbeatTimeoutSec: opts.HeartbeatTimeoutSec}
	st.StartWorker(t)
	t.Cleanup(st.StopWorker)
	api := web.New(web.Config{
		Store: store, Temporal: tc, TaskQueue: queue, DatabaseURL: dbURL,
		HeartbeatTimeoutSec: opts.HeartbeatTimeoutSec, Log: log, ReconcileGrace: time.Second, TemporalUI: opts.TemporalUI,
	})
	st.API = api
	ctx, cancel := context.WithCancel(context.Background())
	api.StartListener(ctx)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() { cancel(); srv.Close() })
	admin, err := store.CreateAPIToken(ctx, "test-admin", models.ScopeAdmin)
	require.NoError(t, err)
	enroll, err := store.CreateAPIToken(ctx, "test-enroll", models.ScopeEnroll)
	require.NoError(t, err)
	st.URL, st.AdminToken, st.EnrollToken = srv.URL, admin, enroll
	return st
}

// StartWorker starts a worker on the stack's task queue (NewStack starts
// one; a test that stopped it can start another, as after a crash).
func (s *Stack) StartWorker(t testing.TB) {
	t.Helper()
	s.worker = server.NewWorker(s.Temporal, s.Store, s.TaskQueue, s.heartbeatTimeoutSec, s.log)
	require.NoError(t, s.worker.Start())
}

// StopWorker stops the stack's worker, like a worker process going away.
func (s *Stack) StopWorker() {
	if s.worker != nil {
		s.worker.Stop()
		s.worker = nil
	}
}

// Logger writes to the test log, so output shows only for failing tests.
// Lines logged after the test has ended (by goroutines still stopping) are
// dropped, since testing panics on them.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.done.Store(true) }) // registered first, so it runs last
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	t    testing.TB
	done atomic.Bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// quietLogger drops the Temporal client's own chatter.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

// YAML is a request body sent as application/yaml.
type YAML string

// Call sends a JSON request with the given token and decodes a JSON answer
// into out (when not nil). It returns the status code and the raw body.
func Call(t testing.TB, method, url, token string, body any, out any) (int, []byte) {
	t.Helper()
	var reader io.Reader
	contentType := "application/json"
	switch b := body.(type) {
	case nil:
	case YAML:
		reader, contentType = strings.NewReader(string(b)), "application/yaml"
	case string:
		reader = strings.NewReader(b)
	case []byte:
		reader = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		require.NoError(t, err)
		reader = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, url, reader)
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "%s %s", method, url)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && len(raw) > 0 && resp.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(raw, out), "decode %s", raw)
	}
	return resp.StatusCode, raw
}

// Do calls the stack's API with the admin token.
func (s *Stack) Do(t testing.TB, method, path string, body, out any) (int, []byte) {
	t.Helper()
	return Call(t, method, s.URL+path, s.AdminToken, body, out)
}

// Agent is a real node agent running in the test process against the
// stack's API over HTTP, in its own work directory.
type Agent struct {
	Name    string
	WorkDir string
	// Address is where the agent accepts peers' reachability checks.
	Address string
	cancel  context.CancelFunc
	done    chan error
}

// StartAgent starts an agent that phones home as name and stops when the
// test ends (or when Stop is called, simulating a dead node).
func (s *Stack) StartAgent(t testing.TB, name string, tune ...func(*daemon.Config)) *Agent {
	t.Helper()
	a := &Agent{Name: name, WorkDir: t.TempDir(), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a.Address = ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := daemon.Config{
		APIURL: s.URL, Name: name, EnrollToken: s.EnrollToken, WorkDir: a.WorkDir, Address: a.Address, Listen: a.Address,
		HeartbeatEvery: time.Second, RunHeartbeatEvery: time.Second, PollWait: 5 * time.Second,
		RetryMin: 50 * time.Millisecond, RetryMax: time.Second, Logger: s.log.With("agent", name),
	}
	for _, f := range tune {
		f(&cfg)
	}
	go func() { a.done <- daemon.Run(ctx, cfg) }()
	t.Cleanup(a.Stop)
	require.Eventually(t, func() bool {
		_, err := os.Stat(a.WorkDir + "/" + daemon.CredentialFile)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "agent %s did not register", name)
	return a
}

// Stop stops the agent and waits for it, like a node that dies.
func (a *Agent) Stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	<-a.done
}

// Token returns the agent's own credential, as stored in its work directory.
func (a *Agent) Token(t testing.TB) string {
	t.Helper()
	c, err := daemon.LoadCredential(a.WorkDir + "/" + daemon.CredentialFile)
	require.NoError(t, err)
	return c.Token
}
