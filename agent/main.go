// Command agent is the anneal node agent. It registers the node with the
// anneal API (once, with an enrollment token; the credential it gets is kept
// in the work directory), then fetches the runs handed to the node, executes
// them and reports their results until it receives SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/anneal-dev/anneal/agent/daemon"
)

func main() {
	daemon.SetDefaultGC()
	hostname, _ := os.Hostname()
	var cfg daemon.Config
	var debug, jsonLogs bool
	flag.StringVar(&cfg.APIURL, "api", os.Getenv("ANNEAL_URL"), "base URL of the anneal API (default $ANNEAL_URL)")
	flag.StringVar(&cfg.Name, "name", hostname, "node name (FQDN inside the admin DNS domain)")
	flag.BoolVar(&cfg.Admin, "admin", false, "register the node as an admin node")
	flag.StringVar(&cfg.EnrollToken, "enroll-token", os.Getenv("ANNEAL_ENROLL_TOKEN"), "enrollment token for the first registration (default $ANNEAL_ENROLL_TOKEN)")
	flag.StringVar(&cfg.WorkDir, "workdir", "./anneal-agent", "work directory: credential, run logs, commands' working directory")
	flag.StringVar(&cfg.Address, "address", "", "host:port where peers can reach this node, if anywhere")
	flag.StringVar(&cfg.Listen, "listen", "", "host:port to accept peers' reachability checks on (default: --address)")
	flag.StringVar(&cfg.RebootCommand, "reboot-command", "", `command that reboots the machine for a reboot task (e.g. "systemctl reboot"); empty simulates a reboot`)
	flag.BoolVar(&debug, "debug", false, "log at debug level")
	flag.BoolVar(&jsonLogs, "log-json", false, "log as JSON lines")
	var audreyUUID, audreyTokenFile, audreyConfigFile string
	flag.StringVar(&audreyUUID, "audrey-instance", "", "uuid of the deployable instance this node is (speaks the config-server protocol)")
	flag.StringVar(&audreyTokenFile, "audrey-token-file", "", "file holding the instance's credential (from the deployable's import)")
	flag.StringVar(&audreyConfigFile, "audrey-config", "", "the instance-config document the instance was launched with, POSTed first (optional)")
	flag.Parse()
	if audreyUUID != "" {
		tok, err := os.ReadFile(audreyTokenFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "anneal-agent: -audrey-instance needs -audrey-token-file:", err)
			os.Exit(2)
		}
		cfg.Audrey = &daemon.AudreyConfig{UUID: audreyUUID, Token: strings.TrimSpace(string(tok))}
		if audreyConfigFile != "" {
			if cfg.Audrey.ConfigXML, err = os.ReadFile(audreyConfigFile); err != nil {
				fmt.Fprintln(os.Stderr, "anneal-agent: -audrey-config:", err)
				os.Exit(2)
			}
		}
	}
	if cfg.Listen == "" {
		cfg.Listen = cfg.Address
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "anneal-agent: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}

	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if debug {
		opts.Level = slog.LevelDebug
	}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if jsonLogs {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	cfg.Logger = slog.New(h)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := daemon.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "anneal-agent:", err)
		stop()
		os.Exit(1)
	}
}
