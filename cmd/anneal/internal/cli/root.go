// Package cli is the anneal command-line client: a cobra command tree over
// the REST API. Main runs it and maps failures onto exit codes: 2 for
// usage errors (bad flags or arguments, no configuration), 1 for a failed
// run or an API error, each reported as one line on stderr.
package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // a failed run or an API error
	ExitUsage   = 2 // bad flags or arguments, missing configuration
)

// usageError is a mistake in how the CLI was called.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// runFailure marks an error returned by a command's own code (as opposed
// to cobra's parsing), so that it exits 1.
type runFailure struct{ err error }

func (e *runFailure) Error() string { return e.err.Error() }
func (e *runFailure) Unwrap() error { return e.err }

// app holds what every command shares: streams, global flags, the client.
type app struct {
	stdin     io.Reader
	out, errw io.Writer
	getenv    func(string) string

	flagURL, flagToken string
	output             string
	interval           time.Duration

	client *Client
}

// Main runs the CLI with args (without the program name) and returns the
// exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{stdin: stdin, out: stdout, errw: stderr, getenv: os.Getenv}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, "anneal: "+describe(err, cmd))
	var usage *usageError
	var run *runFailure
	switch {
	case errors.As(err, &usage):
		return ExitUsage
	case errors.As(err, &run):
		return ExitFailure
	default:
		// Cobra's own errors: unknown command or flag, wrong arguments.
		return ExitUsage
	}
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "anneal",
		Short: "Operate an anneal server: status, graphs, transactions, logs, snapshots",
		Long: `anneal talks to an anneal server's REST API.

It finds the server and token in --url/--token, else ANNEAL_URL/ANNEAL_TOKEN,
else the config file written by 'anneal login' ($XDG_CONFIG_HOME/anneal/config.json).
Every command takes -o json for machine-readable output.
Exit codes: 0 success, 1 a failed run or API error, 2 a usage error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if a.output != "table" && a.output != "json" {
				return usagef("-o/--output must be table or json, not %q", a.output)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.flagURL, "url", "", "API URL (overrides "+EnvURL+" and the config file)")
	pf.StringVar(&a.flagToken, "token", "", "bearer token (overrides "+EnvToken+" and the config file)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&a.interval, "poll-interval", 500*time.Millisecond, "how often following commands poll the API")
	_ = pf.MarkHidden("poll-interval")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usagef("%v (see '%s --help')", err, c.CommandPath())
	})
	root.AddCommand(a.loginCommand(), a.statusCommand(), a.nodesCommand(), a.graphCommand(), a.txCommand(),
		a.logsCommand(), a.snapshotCommand(), a.scenarioCommand(), a.tokenCommand())
	markRunFailures(root)
	return root
}

// markRunFailures wraps every command's RunE so that its errors exit 1
// (usage errors it returns keep exiting 2).
func markRunFailures(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var usage *usageError
			if err == nil || errors.As(err, &usage) {
				return err
			}
			return &runFailure{err: err}
		}
	}
	for _, sub := range c.Commands() {
		markRunFailures(sub)
	}
}

// api returns the client, resolving the configuration on first use; no
// URL or token is a usage error.
func (a *app) api() (*Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	path, err := ConfigPath()
	if err != nil {
		return nil, err
	}
	file, err := LoadConfig(path)
	if err != nil {
		return nil, usagef("%v", err)
	}
	c := resolve(file, a.getenv, a.flagURL, a.flagToken)
	if c.URL == "" {
		return nil, usagef("no API URL: set %s, pass --url, or run 'anneal login'", EnvURL)
	}
	if c.Token == "" {
		return nil, usagef("no API token: set %s, pass --token, or run 'anneal login'", EnvToken)
	}
	a.client = &Client{BaseURL: c.URL, Token: c.Token, HTTP: newHTTPClient()}
	return a.client, nil
}

func (a *app) jsonOut() bool { return a.output == "json" }

// printJSON writes v indented.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printRaw writes an API answer indented, as the API sent it.
func (a *app) printRaw(raw []byte) error {
	var v json.RawMessage = raw
	if len(raw) == 0 {
		v = json.RawMessage("null")
	}
	return a.printJSON(v)
}

// note writes an informational line to stderr (never mixed into -o json).
func (a *app) note(format string, args ...any) {
	fmt.Fprintf(a.errw, "note: "+format+"\n", args...)
}

// table is an aligned, tab-separated listing.
type table struct{ w *tabwriter.Writer }

func (a *app) newTable(headers ...string) *table {
	t := &table{w: tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)}
	t.row(toAny(headers)...)
	return t
}

func (t *table) row(cells ...any) {
	parts := make([]string, len(cells))
	for i, c := range cells {
		s := fmt.Sprint(c)
		if s == "" {
			s = "-"
		}
		parts[i] = strings.ReplaceAll(s, "\t", " ")
	}
	fmt.Fprintln(t.w, strings.Join(parts, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// readLine reads one line from stdin (a token typed or piped in).
func (a *app) readLine() (string, error) {
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", fmt.Errorf("read from stdin: %w", err)
	}
	return strings.TrimSpace(line), nil
}
