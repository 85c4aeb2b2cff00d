// Command dev is anneal's one-command environment and test harness:
//
//	go run ./dev up     [--nodes N --eager-activities=false]
//	                                        bring the whole system up until Ctrl-C
//	go run ./dev test   [go test args...]   run the whole test suite on real services
//	go run ./dev bench  [--nodes N --tasks M --rounds R --pprof DIR --eager-activities]
//	                                        measure a graph against bare Temporal
//	go run ./dev bench --plan-only [--nodes N --tasks M --rounds R --pprof DIR]
//	                                        measure the planning of that graph alone
//	go run ./dev fuzz   [--time 20s] [pkgs...]  run each fuzz target for a while
//	go run ./dev replay [--since 168h]      replay a running installation's executions on this code
//	go run ./dev chaos  [--nodes N --tasks M]  kill processes mid-transaction, count lost and doubled runs
//	go run ./dev search-attributes [--address --namespace]  register anneal's search attributes
//
// It finds or starts Postgres and the Temporal dev server (see package
// devenv) and keeps its state under .dev/ at the module root.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

const usage = `usage: go run ./dev <command> [flags]

commands:
  up      start Postgres, Temporal (+ Web UI), the worker and API, and simulated nodes
  test    run the whole test suite (go test -race ./...) on a real Postgres and Temporal
  bench   run a graph on simulated nodes and compare with bare Temporal
          (--plan-only: time the planning of that graph alone, in seconds, not minutes)
  fuzz    run each fuzz target (go test -fuzz) for --time (default 20s), then a summary
  replay  replay the open and recently closed executions of a running installation
          against this checkout's workflow code; exits 1 naming any that would break
  chaos   start a stack, kill its processes mid-transaction, and count lost and doubled runs
  search-attributes
          register anneal's custom search attributes on a Temporal namespace (idempotent)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
	state := filepath.Join(root, ".dev")
	args := os.Args[2:]
	switch os.Args[1] {
	case "up":
		err = up(ctx, root, state, args, log)
	case "test":
		err = test(ctx, root, state, args, log)
	case "bench":
		err = bench(ctx, root, state, args, log)
	case "bench-agents": // run by the bench only: its agent host processes
		err = benchAgents(ctx, args)
	case "fuzz":
		err = fuzz(ctx, root, state, args, log)
	case "replay":
		err = replayCmd(ctx, state, args, log)
	case "chaos":
		err = chaos(ctx, root, state, args, log)
	case "search-attributes":
		err = searchAttributesCmd(ctx, state, args, log)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "dev: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		var exit *exitError
		if errors.As(err, &exit) {
			os.Exit(exit.code)
		}
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

// exitError passes a child's exit status through without more noise.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// moduleRoot finds the directory holding go.mod, from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run this from inside the anneal checkout (no go.mod found)")
		}
		dir = parent
	}
}
