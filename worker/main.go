// Command worker runs anneal's Temporal worker and, with -api, its REST API.
// `worker token create` writes an operator token to the database and
// prints it once: a fresh install's first admin token.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // served only with -pprof, on its own listener
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/worker/server"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "token" {
		os.Exit(tokenCommand(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "secrets" {
		os.Exit(secretsCommand(os.Args[2:]))
	}
	setDefaultGC()
	cfg := server.Config{}
	var bootstrapFile, secretKeyFile, codecOrigins string
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL")
	dbMaxConns, err := envInt("ANNEAL_DB_MAX_CONNS")
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	flag.IntVar(&cfg.DBMaxConns, "db-max-conns", dbMaxConns, fmt.Sprintf("connections to Postgres at most (default $ANNEAL_DB_MAX_CONNS, else %d here: three per core, 6 to 20)", models.DefaultMaxConns()))
	flag.StringVar(&cfg.TemporalAddress, "temporal", envOr("TEMPORAL_ADDRESS", "127.0.0.1:7233"), "Temporal frontend host:port")
	flag.BoolVar(&cfg.TemporalTLS.Enabled, "temporal-tls", false, "connect to Temporal with TLS (implied by the other -temporal-tls-* flags and -temporal-api-key)")
	flag.StringVar(&cfg.TemporalTLS.CertFile, "temporal-tls-cert", "", "client certificate for mutual TLS with Temporal (PEM)")
	flag.StringVar(&cfg.TemporalTLS.KeyFile, "temporal-tls-key", "", "client key for mutual TLS with Temporal (PEM)")
	flag.StringVar(&cfg.TemporalTLS.CAFile, "temporal-tls-ca", "", "CA certificate that signed Temporal's (PEM; default: the system's roots)")
	flag.StringVar(&cfg.TemporalTLS.ServerName, "temporal-tls-server-name", "", "name to verify Temporal's certificate against (default: the host of -temporal)")
	flag.StringVar(&cfg.TemporalTLS.APIKey, "temporal-api-key", os.Getenv("TEMPORAL_API_KEY"), "Temporal API key, e.g. for Temporal Cloud (default $TEMPORAL_API_KEY; implies TLS)")
	flag.StringVar(&cfg.Namespace, "namespace", envOr("TEMPORAL_NAMESPACE", "default"), "Temporal namespace")
	flag.StringVar(&cfg.TaskQueue, "task-queue", server.DefaultTaskQueue, "Temporal task queue")
	flag.StringVar(&cfg.APIAddr, "api", "", "also serve the REST API on this address, e.g. "+server.DefaultAPIAddr)
	flag.StringVar(&cfg.Domain, "domain", envOr("ANNEAL_DOMAIN", server.DefaultDomain), "admin DNS domain of node names")
	flag.IntVar(&cfg.HeartbeatTimeoutSec, "heartbeat-timeout", 0, "seconds a run may go without an agent heartbeat, and a node without a node heartbeat (at least 30) before it counts as not alive (0: 60)")
	flag.DurationVar(&cfg.AckLease, "ack-lease", 0, "how long a run handed to an agent waits for its acknowledgement before it is offered again (0: 5s; keep it below the heartbeat timeout)")
	flag.BoolVar(&cfg.NoWorker, "no-worker", false, "serve only the API")
	flag.StringVar(&cfg.TemporalUI, "temporal-ui", os.Getenv("TEMPORAL_UI"), "base URL of the Temporal Web UI, for the API's links to workflows (e.g. http://127.0.0.1:8233)")
	flag.BoolVar(&cfg.TemporalGzip, "temporal-gzip", os.Getenv("TEMPORAL_GZIP") == "true", "gzip the gRPC requests to Temporal (worth it over a slow link only)")
	flag.StringVar(&bootstrapFile, "bootstrap-token-file", "", "a file holding the first admin token (ann_...), stored if no admin token exists yet; or set ANNEAL_BOOTSTRAP_TOKEN")
	flag.StringVar(&secretKeyFile, "secret-key-file", "", "a file of secret keys (base64 of 32 bytes each, one a line, the first one encrypting) sealing the deployments' secrets and every Temporal payload; or set "+secrets.EnvKey)
	flag.StringVar(&codecOrigins, "codec-origin", "", "comma-separated browser origins allowed to call the codec server /api/v1/codec (default: the -temporal-ui origin)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: worker [flags]\n       worker token create --name NAME [--scope admin|operator|viewer|enroll]\n       worker secrets rotate [--secret-key-file FILE] [--database-url URL]\n\nflags:\n")
		flag.PrintDefaults()
	}
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address, e.g. 127.0.0.1:6060 (off by default)")
	flag.Parse()
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.DatabaseURL == "" {
		fmt.Fprintln(os.Stderr, "worker: set -database-url or DATABASE_URL")
		os.Exit(2)
	}
	if err := checkDBMaxConns(cfg.DBMaxConns); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	keys, err := secrets.Load(secretKeyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	cfg.Keys = keys
	cfg.Log.Info("secret keys loaded", "encrypting_key_id", keys.PrimaryID(), "key_ids", strings.Join(keys.IDs(), ","))
	if codecOrigins != "" {
		cfg.CodecOrigins = strings.Split(codecOrigins, ",")
	}
	cfg.BootstrapToken = os.Getenv("ANNEAL_BOOTSTRAP_TOKEN")
	if bootstrapFile != "" {
		b, err := os.ReadFile(bootstrapFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "worker: -bootstrap-token-file: %v\n", err)
			os.Exit(2)
		}
		cfg.BootstrapToken = strings.TrimSpace(string(b))
	}
	if *pprofAddr != "" {
		// The API has its own router; the profiles go on the default mux only.
		go func() { cfg.Log.Error("pprof server stopped", "error", http.ListenAndServe(*pprofAddr, nil)) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := server.Run(ctx, cfg); err != nil {
		cfg.Log.Error("worker stopped", "error", err)
		os.Exit(1)
	}
}

// tokenCommand is `worker token create`: it stores a token and prints its
// secret once on stdout. Exit code 2 for bad usage, 1 for a failure.
func tokenCommand(args []string) int {
	if len(args) == 0 || args[0] != "create" {
		fmt.Fprintln(os.Stderr, "usage: worker token create --name NAME [--scope admin|operator|viewer|enroll] [--database-url URL]")
		return 2
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL")
	name := fs.String("name", "", "what the token is for (required)")
	scope := fs.String("scope", models.ScopeAdmin, "one of "+strings.Join(models.Scopes, ", "))
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dbURL == "" {
		fmt.Fprintln(os.Stderr, "worker token create: set --database-url or DATABASE_URL")
		return 2
	}
	tok, secret, err := server.CreateToken(context.Background(), *dbURL, *name, *scope)
	var ie *models.InputError
	if errors.As(err, &ie) {
		fmt.Fprintf(os.Stderr, "worker token create: --%s: %s\n", ie.Field, ie.Reason)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker token create: %v\n", err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "token", tok.ID, "("+tok.Name+", scope "+tok.Scope+") created; it is shown only this once:")
	fmt.Println(secret)
	return 0
}

// secretsCommand is `worker secrets rotate`: it seals again, with the
// first key, every secret and node SSH key sealed with an older one (and
// the node keys still in the clear). Exit code 2 for bad
// usage, 1 for a failure.
func secretsCommand(args []string) int {
	if len(args) == 0 || args[0] != "rotate" {
		fmt.Fprintln(os.Stderr, "usage: worker secrets rotate [--secret-key-file FILE] [--database-url URL]")
		return 2
	}
	fs := flag.NewFlagSet("secrets rotate", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL")
	keyFile := fs.String("secret-key-file", "", "the keys, new one first (or "+secrets.EnvKey+")")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dbURL == "" {
		fmt.Fprintln(os.Stderr, "worker secrets rotate: set --database-url or DATABASE_URL")
		return 2
	}
	keys, err := secrets.Load(*keyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker secrets rotate:", err)
		return 2
	}
	n, err := server.RotateSecrets(context.Background(), *dbURL, keys)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker secrets rotate: %v\n", err)
		return 1
	}
	fmt.Printf("%d secret(s) and %d node ssh key(s) sealed with key %s\n", n.Secrets, n.NodeKeys, keys.PrimaryID())
	return 0
}

// envInt reads a whole number from the environment: 0 when unset (the
// flag's default applies), an error naming the variable when it is not a
// whole number of 0 or more.
func envInt(key string) (int, error) {
	v := os.Getenv(key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a whole number of 0 or more", key, v)
	}
	return n, nil
}

// checkDBMaxConns refuses a -db-max-conns no pool can have.
func checkDBMaxConns(n int) error {
	if n < 0 {
		return fmt.Errorf("-db-max-conns: %d is not a number of connections (1 or more; 0 for the default)", n)
	}
	return nil
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// defaultGCPercent is the worker's GOGC when its environment sets none.
// The collector was a tenth of the worker's CPU per run at 100 nodes;
// collecting two thirds as often as Go's default (100) costs half the
// live heap more memory (peak RSS 257 MiB at 1,000 nodes x 20 tasks,
// against 229 MiB; 200 reached 299 MiB, at the 300 MiB target).
const defaultGCPercent = 150

// setDefaultGC sets defaultGCPercent unless $GOGC says otherwise.
func setDefaultGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}
