// Command worker runs anneal's Temporal worker and, with -api, its REST API.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // served only with -pprof, on its own listener
	"os"
	"os/signal"
	"syscall"

	"github.com/anneal-dev/anneal/worker/server"
)

func main() {
	cfg := server.Config{}
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL")
	flag.StringVar(&cfg.TemporalAddress, "temporal", envOr("TEMPORAL_ADDRESS", "127.0.0.1:7233"), "Temporal frontend host:port")
	flag.StringVar(&cfg.Namespace, "namespace", envOr("TEMPORAL_NAMESPACE", "default"), "Temporal namespace")
	flag.StringVar(&cfg.TaskQueue, "task-queue", server.DefaultTaskQueue, "Temporal task queue")
	flag.StringVar(&cfg.APIAddr, "api", "", "also serve the REST API on this address, e.g. "+server.DefaultAPIAddr)
	flag.StringVar(&cfg.Domain, "domain", envOr("ANNEAL_DOMAIN", server.DefaultDomain), "admin DNS domain of node names")
	flag.IntVar(&cfg.HeartbeatTimeoutSec, "heartbeat-timeout", 0, "seconds a run may go without an agent heartbeat (0: 60)")
	flag.BoolVar(&cfg.NoWorker, "no-worker", false, "serve only the API")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address, e.g. 127.0.0.1:6060 (off by default)")
	flag.Parse()
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.DatabaseURL == "" {
		fmt.Fprintln(os.Stderr, "worker: set -database-url or DATABASE_URL")
		os.Exit(2)
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

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}
