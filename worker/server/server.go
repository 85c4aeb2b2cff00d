// Package server assembles an anneal server process: it opens and migrates
// Postgres, dials Temporal, runs the worker (workflows and activities) and,
// when asked, the REST API. The worker binary and the tests both use it.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"golang.org/x/sync/errgroup"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/models/roles/network"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/scenarios"
	"github.com/anneal-dev/anneal/web"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/codec"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// Defaults shared by the binaries and the dev environment.
const (
	DefaultTaskQueue = contract.DefaultTaskQueue
	DefaultDomain    = "anneal.test"
	DefaultAPIAddr   = "127.0.0.1:8080"
)

// Config configures a server process.
type Config struct {
	DatabaseURL string
	// DBMaxConns sizes the pool of Postgres connections (0:
	// models.DefaultMaxConns).
	DBMaxConns      int
	TemporalAddress string
	// TemporalTLS is how to reach an external cluster (TLS, mTLS, API key).
	TemporalTLS TemporalTLS
	Namespace   string
	TaskQueue   string
	// APIAddr, when set, also serves the REST API there.
	APIAddr string
	// Domain is the admin DNS domain node names must lie in.
	Domain string
	// HeartbeatTimeoutSec is how long a run may go without its agent's
	// heartbeat (0: the workflows' default).
	HeartbeatTimeoutSec int
	// AckLease is how long a run handed to an agent waits for its
	// acknowledgement before it is offered again (0: models.DefaultAckLease).
	AckLease time.Duration
	// NoWorker serves only the API.
	NoWorker bool
	// TemporalUI is the Temporal Web UI's base address, for the API's
	// links to workflows ("" leaves them out).
	TemporalUI string
	// BootstrapToken, when set, becomes an admin token named "bootstrap"
	// if the database has no admin token yet: how a fresh install gets its
	// first one. Ignored (and said so) once an admin token exists.
	BootstrapToken string
	// CodecOrigins are the browser origins allowed to call the codec
	// server (default: TemporalUI's).
	CodecOrigins []string
	// Keys seal the deployments' secrets and every Temporal payload
	// (required: -secret-key-file or ANNEAL_SECRET_KEY).
	Keys *secrets.Keyring
	// TemporalGzip compresses the gRPC requests to Temporal, the SDK's
	// default. Off by default: on a local network it costs CPU on both
	// sides of every call for little; turn it on over a slow link.
	TemporalGzip bool
	Log          *slog.Logger
}

func (c *Config) defaults() {
	if c.TaskQueue == "" {
		c.TaskQueue = DefaultTaskQueue
	}
	if c.Namespace == "" {
		c.Namespace = client.DefaultNamespace
	}
	if c.Domain == "" {
		c.Domain = DefaultDomain
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Run runs the server until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if cfg.Keys == nil {
		return errors.New("no secret key: give -secret-key-file or set " + secrets.EnvKey)
	}
	db, done, err := models.OpenMigrated(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer done()
	if cfg.DBMaxConns > 0 {
		sqlDB, err := db.DB()
		if err != nil {
			return fmt.Errorf("size the database pool: %w", err)
		}
		models.LimitConns(sqlDB, cfg.DBMaxConns)
	}
	store := &models.Store{DB: db, Domain: cfg.Domain, Keys: cfg.Keys}
	// An install upgraded from before node SSH keys were sealed (migration
	// 0023) has them in the clear: seal them before anything reads them.
	sealed, err := store.SealPlainNodeKeys(ctx)
	if err != nil {
		return fmt.Errorf("seal the node ssh keys stored in the clear: %w", err)
	}
	if sealed > 0 {
		cfg.Log.Info("sealed the node ssh keys stored in the clear", "count", sealed, "key_id", cfg.Keys.PrimaryID())
	}
	if cfg.BootstrapToken != "" {
		created, err := store.BootstrapAdminToken(ctx, "bootstrap", cfg.BootstrapToken)
		if err != nil {
			return fmt.Errorf("bootstrap token: %w", err)
		}
		if created {
			cfg.Log.Info("stored the bootstrap token as the first admin token (named \"bootstrap\"); create others with POST /api/v1/tokens and revoke it")
		} else {
			cfg.Log.Info("bootstrap token ignored: an admin token exists already")
		}
	}
	if err := fuel.EnsureBuiltinScenarios(ctx, fuel.New(store), scenarios.Builtins()...); err != nil {
		return err
	}
	if err := fuel.EnsureBuiltinGraphs(ctx, fuel.New(store), scenarios.BuiltinGraphs()...); err != nil {
		return err
	}
	copts := ClientOptions(cfg.TemporalAddress, cfg.Namespace, cfg.Keys, log.NewStructuredLogger(cfg.Log))
	tlsCfg, err := cfg.TemporalTLS.config()
	if err != nil {
		return err
	}
	copts.ConnectionOptions.TLS = tlsCfg
	if cfg.TemporalTLS.APIKey != "" {
		copts.Credentials = client.NewAPIKeyStaticCredentials(cfg.TemporalTLS.APIKey)
	}
	// No gzip unless asked: on a local network it costs CPU on both sides
	// of every call for little.
	copts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	if cfg.TemporalGzip {
		copts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionGzip{}
	}
	tc, err := client.DialContext(ctx, copts)
	if err != nil {
		return fmt.Errorf("dial Temporal at %s: %w", cfg.TemporalAddress, err)
	}
	defer tc.Close()

	network.Register() // role hooks run wherever roles are bound or nodes deleted: worker and API
	g, ctx := errgroup.WithContext(ctx)
	if !cfg.NoWorker {
		w := NewWorker(tc, store, cfg.TaskQueue, cfg.HeartbeatTimeoutSec, cfg.Log)
		if err := w.Start(); err != nil {
			return fmt.Errorf("start worker on task queue %s: %w", cfg.TaskQueue, err)
		}
		defer w.Stop()
		cfg.Log.Info("worker started", "task_queue", cfg.TaskQueue, "temporal", cfg.TemporalAddress)
	}
	if cfg.APIAddr != "" {
		api := web.New(web.Config{
			Store: store, Temporal: tc, TaskQueue: cfg.TaskQueue, DatabaseURL: cfg.DatabaseURL,
			HeartbeatTimeoutSec: cfg.HeartbeatTimeoutSec, AckLease: cfg.AckLease, Log: cfg.Log,
			TemporalUI: cfg.TemporalUI, Namespace: cfg.Namespace, CodecOrigins: cfg.CodecOrigins,
		})
		g.Go(func() error { return api.Run(ctx, cfg.APIAddr) })
		g.Go(func() error { api.RunReconciler(ctx, reconcilePeriod); return nil })
		cfg.Log.Info("API listening", "url", "http://"+cfg.APIAddr)
	}
	g.Go(func() error { watchLiveness(ctx, store, web.NodeSilence(cfg.HeartbeatTimeoutSec), cfg.Log); return nil })
	g.Go(func() error { <-ctx.Done(); return nil })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// ClientOptions are the options of every Temporal client of anneal: each
// payload (and failure message) goes through the encrypting codec, so
// that Temporal's histories hold ciphertext only.
func ClientOptions(address, namespace string, keys *secrets.Keyring, logger log.Logger) client.Options {
	return client.Options{
		HostPort: address, Namespace: namespace, Logger: logger,
		DataConverter: codec.DataConverter(keys), FailureConverter: codec.FailureConverter(keys),
	}
}

// RotateSecrets opens the database at databaseURL and seals again, with
// the first of keys, every secret and node SSH key sealed with another key,
// and the node keys still in the clear (`worker secrets rotate`). It
// returns how many it sealed.
func RotateSecrets(ctx context.Context, databaseURL string, keys *secrets.Keyring) (models.Rotated, error) {
	db, done, err := models.OpenMigrated(ctx, databaseURL)
	if err != nil {
		return models.Rotated{}, err
	}
	defer done()
	return (&models.Store{DB: db, Keys: keys}).RotateSecrets(ctx)
}

// CreateToken opens and migrates the database at databaseURL and stores a
// new operator token there, returning its secret: the first admin token of
// an install, made on the command line (`worker token create`).
func CreateToken(ctx context.Context, databaseURL, name, scope string) (*models.APIToken, string, error) {
	db, done, err := models.OpenMigrated(ctx, databaseURL)
	if err != nil {
		return nil, "", err
	}
	defer done()
	return (&models.Store{DB: db}).CreateToken(ctx, name, scope)
}

// NewWorker creates (without starting) a worker with every workflow and
// activity registered explicitly.
func NewWorker(tc client.Client, store *models.Store, taskQueue string, heartbeatTimeoutSec int, logger *slog.Logger) worker.Worker {
	// More pollers than the SDK's default two: a transaction keeps hundreds
	// of node workflows busy at once, and their workflow tasks also run the
	// short local activities that read Postgres.
	w := worker.New(tc, taskQueue, worker.Options{
		MaxConcurrentWorkflowTaskPollers: 8,
		MaxConcurrentActivityTaskPollers: 8,
	})
	workflows.Register(w)
	plans := fuel.New(store)
	w.RegisterActivity(&activities.Activities{
		Runs: store, Plans: plans, LocalRuns: plans, SSH: plans, Reboots: store,
		NodeRoles: crowbar.New(store), Software: heat.New(store),
		Log: logger, Temporal: tc, TaskQueue: taskQueue, HeartbeatTimeoutSec: heartbeatTimeoutSec,
	})
	return w
}

// reconcilePeriod is how often the API process looks for transactions and
// software deployments whose workflow Temporal ended behind anneal's back.
const reconcilePeriod = 30 * time.Second

// livenessPeriod is how often the API process looks for silent nodes.
const livenessPeriod = 10 * time.Second

// watchLiveness marks nodes silent for longer than silence (web.NodeSilence:
// agents heartbeat every third of it) not alive until ctx ends.
func watchLiveness(ctx context.Context, store *models.Store, nodeSilence time.Duration, log *slog.Logger) {
	t := time.NewTicker(livenessPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		names, err := store.MarkSilentNodes(ctx, nodeSilence)
		if err != nil {
			log.Warn("liveness check failed", "error", err)
			continue
		}
		for _, name := range names {
			log.Warn("node is not alive: its agent stopped heartbeating", "node", name, "silence", nodeSilence)
		}
	}
}
