package devenv

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// TemporalCLIVersion is the version of the Temporal CLI whose dev server the
// development environment runs.
const TemporalCLIVersion = "1.5.1"

// temporalCLIModule is the module and package built by TemporalBinary.
const (
	temporalCLIModule  = "github.com/temporalio/cli"
	temporalCLIPackage = "github.com/temporalio/cli/cmd/temporal"
)

// Ports the dev tool uses for the Temporal dev server (the CLI's defaults).
const (
	DefaultTemporalPort   = 7233
	DefaultTemporalUIPort = 8233
)

// HeadlessUI as TemporalOptions.UIPort runs the dev server without its Web UI.
const HeadlessUI = -1

// TemporalNamespace is the namespace the dev server creates and EnsureTemporal
// checks.
const TemporalNamespace = "default"

// EnvTemporalAddress names the environment variable that points EnsureTemporal
// at an existing Temporal frontend (host:port).
const EnvTemporalAddress = "TEMPORAL_ADDRESS"

// TemporalBinary returns the path of a Temporal CLI of version
// TemporalCLIVersion: `temporal` on PATH if it is that version, else the copy
// cached in <os.UserCacheDir()>/anneal/temporal-v<version>/temporal, building
// it there with `go install` if missing (once: concurrent callers, also in
// other processes, wait for the first one's build). log may be nil.
func TemporalBinary(ctx context.Context, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if path, err := exec.LookPath("temporal"); err == nil {
		if isWantedTemporal(ctx, path) {
			return path, nil
		}
		log.Debug("ignoring the temporal on PATH: not version "+TemporalCLIVersion, "path", path)
	}
	dir, err := TemporalCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "temporal")
	if isWantedTemporal(ctx, bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("Temporal CLI cache directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".build.lock"), func() {
		log.Info("waiting for another caller building the Temporal CLI v"+TemporalCLIVersion, "dir", dir)
	})
	if err != nil {
		return "", fmt.Errorf("build the Temporal CLI: %w", err)
	}
	defer unlock()
	if isWantedTemporal(ctx, bin) { // built while we waited
		return bin, nil
	}
	if err := buildTemporal(ctx, dir, bin, log); err != nil {
		return "", err
	}
	return bin, nil
}

// TemporalCacheDir returns the directory TemporalBinary caches the CLI in:
// <os.UserCacheDir()>/anneal/temporal-v<TemporalCLIVersion>.
func TemporalCacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locate the Temporal CLI cache: %w", err)
	}
	return filepath.Join(cache, "anneal", "temporal-v"+TemporalCLIVersion), nil
}

var temporalVersionRe = regexp.MustCompile(`\b` + regexp.QuoteMeta(TemporalCLIVersion) + `\b`)

// isWantedTemporal reports whether path is a Temporal CLI of
// TemporalCLIVersion. Binaries built with `go install` say "0.0.0-DEV" to
// --version, so their Go build information is checked first.
func isWantedTemporal(ctx context.Context, path string) bool {
	if !isExecutable(path) {
		return false
	}
	if info, err := buildinfo.ReadFile(path); err == nil &&
		info.Main.Path == temporalCLIModule && info.Main.Version == "v"+TemporalCLIVersion {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	// "temporal version 1.5.1 (Server 1.29.1, UI 2.42.1)"
	return err == nil && temporalVersionRe.Match(firstLine(out))
}

func firstLine(b []byte) []byte {
	for i, c := range b {
		if c == '\n' {
			return b[:i]
		}
	}
	return b
}

// buildTemporal runs go install into a temporary GOBIN inside dir and moves
// the binary to bin, so that bin never exists half-written.
func buildTemporal(ctx context.Context, dir, bin string, log *slog.Logger) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the Temporal CLI v%s is not installed and there is no Go toolchain on PATH to build it: "+
			"install Go, or put the CLI (https://github.com/temporalio/cli/releases/tag/v%s) on PATH", TemporalCLIVersion, TemporalCLIVersion)
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return fmt.Errorf("build the Temporal CLI: %w", err)
	}
	defer os.RemoveAll(tmp)
	logPath := filepath.Join(dir, "build.log")
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("build the Temporal CLI: %w", err)
	}
	defer lf.Close()
	var start int64
	if st, err := lf.Stat(); err == nil {
		start = st.Size()
	}
	log.Info(fmt.Sprintf("building the Temporal CLI v%s once into %s (about 8 minutes on 2 cores)", TemporalCLIVersion, dir),
		"build_log", logPath)
	began := time.Now()
	cmd := exec.CommandContext(ctx, goTool, "install", temporalCLIPackage+"@v"+TemporalCLIVersion)
	cmd.Dir = dir // outside any module: `go install pkg@version` ignores it anyway
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=")
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the Temporal CLI v%s (go install %s@v%s): %w; last lines of %s:\n%s",
			TemporalCLIVersion, temporalCLIPackage, TemporalCLIVersion, err, logPath, fileTail(logPath, start, 20))
	}
	if err := os.Rename(filepath.Join(tmp, "temporal"), bin); err != nil {
		return fmt.Errorf("build the Temporal CLI: install the binary: %w", err)
	}
	log.Info("built the Temporal CLI", "path", bin, "took", time.Since(began).Round(time.Second))
	return nil
}

// TemporalOptions configures EnsureTemporal.
type TemporalOptions struct {
	// StateDir holds the default DBFile and LogFile. Required unless both
	// are set (or DBFile is not needed because Ephemeral is set).
	StateDir string
	// Port is the frontend gRPC port on 127.0.0.1. 0 picks a free port (for
	// tests); the dev tool uses DefaultTemporalPort (7233).
	Port int
	// UIPort is the Web UI port. 0 means Port+1000 when Port is set (8233
	// for 7233, the CLI's default) and a free port otherwise; HeadlessUI (-1)
	// disables the UI.
	UIPort int
	// DBFile is the SQLite file persisting the server's state. Default
	// <StateDir>/temporal.db; left empty with Ephemeral set, the state is
	// kept in memory and lost when the server stops.
	DBFile string
	// Ephemeral keeps the state in memory when DBFile is empty.
	Ephemeral bool
	// LogFile receives the server's output (appended). Default
	// <StateDir>/temporal.log.
	LogFile string
	// ExtraArgs are appended to `temporal server start-dev`, e.g.
	// "--search-attribute", "AnnealTx=Keyword" or "--dynamic-config-value", "K=V".
	ExtraArgs []string
	// StartTimeout bounds the wait for a started server to be healthy.
	// Default 60s.
	StartTimeout time.Duration
	// SearchAttributes are custom search attributes (name and type) that
	// EnsureTemporal registers on the namespace, whatever the server's
	// source, if missing (see RegisterSearchAttributes).
	SearchAttributes map[string]enumspb.IndexedValueType
}

// DefaultTemporalOptions returns the options of the dev tool's persistent
// server: the CLI's usual ports, state in <stateDir>/temporal.db, and
// anneal's custom search attributes (contract.SearchAttributes).
func DefaultTemporalOptions(stateDir string) TemporalOptions {
	return TemporalOptions{StateDir: stateDir, Port: DefaultTemporalPort, UIPort: DefaultTemporalUIPort,
		SearchAttributes: contract.SearchAttributes()}
}

// Where a Temporal came from (Temporal.Source).
const (
	// TemporalFromEnv: the frontend named by TEMPORAL_ADDRESS.
	TemporalFromEnv = "env"
	// TemporalExisting: a server that already answered on the requested port.
	TemporalExisting = "existing"
	// TemporalStarted: a dev server started by this process.
	TemporalStarted = "started"
)

// Temporal is a Temporal frontend found or started by EnsureTemporal.
type Temporal struct {
	// Address is the frontend's gRPC address, host:port.
	Address string
	// UIURL is the Web UI's URL, e.g. http://127.0.0.1:8233; "" when the
	// server is headless or its UI is unknown (TEMPORAL_ADDRESS).
	UIURL string
	// Namespace is the namespace known to exist (TemporalNamespace).
	Namespace string
	// Source tells where the server came from: TemporalFromEnv,
	// TemporalExisting or TemporalStarted.
	Source string
	// LogFile is the started server's log ("" unless Source is TemporalStarted).
	LogFile string

	proc      *Proc // non-nil if this process started the server
	closeOnce sync.Once
	closeErr  error
}

// EnsureTemporal finds or starts a Temporal frontend, in this order:
//
//  1. TEMPORAL_ADDRESS, if set (it must pass a health check);
//  2. a Temporal frontend already answering on 127.0.0.1:<Port> (only for a
//     fixed Port), reused as is;
//  3. `temporal server start-dev` (see TemporalBinary) in its own process
//     group, SQLite in WAL mode, output appended to LogFile, waiting until a
//     client connects, the health check passes and the default namespace is
//     described. A server that exits or stays unhealthy for StartTimeout
//     yields an error carrying the tail of its log.
//
// Then the custom search attributes of opts are registered if missing.
// log may be nil.
func EnsureTemporal(ctx context.Context, opts TemporalOptions, log *slog.Logger) (*Temporal, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t, err := ensureTemporal(ctx, opts, log)
	if err != nil || len(opts.SearchAttributes) == 0 {
		return t, err
	}
	if err := t.registerSearchAttributes(ctx, opts.SearchAttributes, log); err != nil {
		_ = t.Close()
		return nil, err
	}
	return t, nil
}

// registerSearchAttributes registers attrs on the server's namespace.
func (t *Temporal) registerSearchAttributes(ctx context.Context, attrs map[string]enumspb.IndexedValueType, log *slog.Logger) error {
	c, err := client.DialContext(ctx, client.Options{
		HostPort: t.Address, Namespace: t.Namespace,
		Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w", t.Address, err)
	}
	defer c.Close()
	added, err := RegisterSearchAttributes(ctx, c, t.Namespace, attrs)
	if err != nil {
		return fmt.Errorf("Temporal at %s: %w", t.Address, err)
	}
	if len(added) > 0 {
		log.Info("registered custom search attributes", "namespace", t.Namespace, "added", strings.Join(added, ","))
	}
	return nil
}

func ensureTemporal(ctx context.Context, opts TemporalOptions, log *slog.Logger) (*Temporal, error) {
	if addr := os.Getenv(EnvTemporalAddress); addr != "" {
		hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := CheckTemporal(hctx, addr); err != nil {
			return nil, fmt.Errorf("%s=%s does not answer as a Temporal frontend: %w", EnvTemporalAddress, addr, err)
		}
		log.Info("using the Temporal server from "+EnvTemporalAddress, "address", addr)
		return &Temporal{Address: addr, Namespace: TemporalNamespace, Source: TemporalFromEnv}, nil
	}

	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("Temporal dev server: bad port %d", opts.Port)
	}
	if opts.UIPort < HeadlessUI || opts.UIPort > 65535 {
		return nil, fmt.Errorf("Temporal dev server: bad UI port %d (use %d for no UI)", opts.UIPort, HeadlessUI)
	}
	port, uiPort := opts.Port, opts.UIPort
	if uiPort == 0 && port > 0 && port+1000 <= 65535 {
		uiPort = port + 1000
	}
	if port > 0 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if tcpAnswers(addr, time.Second) {
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := CheckTemporal(hctx, addr)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("%s is in use by something that does not answer as a Temporal frontend "+
					"(stop it, or choose another port): %w", addr, err)
			}
			t := &Temporal{Address: addr, Namespace: TemporalNamespace, Source: TemporalExisting}
			if uiPort > 0 && tcpAnswers(net.JoinHostPort("127.0.0.1", strconv.Itoa(uiPort)), time.Second) {
				t.UIURL = fmt.Sprintf("http://127.0.0.1:%d", uiPort)
			}
			log.Info("reusing the Temporal server already running", "address", addr, "ui", t.UIURL)
			return t, nil
		}
	}
	return startTemporal(ctx, opts, port, uiPort, log)
}

func startTemporal(ctx context.Context, opts TemporalOptions, port, uiPort int, log *slog.Logger) (*Temporal, error) {
	dbFile, logFile := opts.DBFile, opts.LogFile
	if dbFile == "" && !opts.Ephemeral {
		if opts.StateDir == "" {
			return nil, errors.New("Temporal dev server: no StateDir for the default DBFile (set StateDir, DBFile or Ephemeral)")
		}
		dbFile = filepath.Join(opts.StateDir, "temporal.db")
	}
	if logFile == "" {
		if opts.StateDir == "" {
			return nil, errors.New("Temporal dev server: no StateDir for the default LogFile (set StateDir or LogFile)")
		}
		logFile = filepath.Join(opts.StateDir, "temporal.log")
	}
	bin, err := TemporalBinary(ctx, log)
	if err != nil {
		return nil, err
	}
	// A port found free may be taken before the server binds it: when this
	// package picked the ports, try again with others.
	for attempt := 1; ; attempt++ {
		p, ui := port, uiPort
		var err2 error
		if p == 0 {
			p, err = FreePort()
		}
		if ui == 0 {
			ui, err2 = FreePort()
		}
		if err = errors.Join(err, err2); err != nil {
			return nil, fmt.Errorf("Temporal dev server: %w", err)
		}
		t, err := startTemporalOn(ctx, opts, bin, p, ui, dbFile, logFile, log)
		if err != nil && (port == 0 || uiPort == 0) && attempt < 3 && strings.Contains(err.Error(), "address already in use") {
			log.Warn("the Temporal dev server lost a race for a free port; retrying", "err", err)
			continue
		}
		return t, err
	}
}

func startTemporalOn(ctx context.Context, opts TemporalOptions, bin string, port, uiPort int, dbFile, logFile string, log *slog.Logger) (*Temporal, error) {

	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(port)}
	t := &Temporal{
		Address:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Namespace: TemporalNamespace,
		Source:    TemporalStarted,
		LogFile:   logFile,
	}
	if uiPort == HeadlessUI {
		args = append(args, "--headless")
	} else {
		args = append(args, "--ui-port", strconv.Itoa(uiPort))
		t.UIURL = fmt.Sprintf("http://127.0.0.1:%d", uiPort)
	}
	if dbFile != "" {
		if err := os.MkdirAll(filepath.Dir(dbFile), 0o755); err != nil {
			return nil, fmt.Errorf("Temporal dev server: database directory: %w", err)
		}
		args = append(args, "--db-filename", dbFile)
	}
	args = append(args, "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal")
	args = append(args, opts.ExtraArgs...)

	cmd := exec.Command(bin, args...) // not CommandContext: the server outlives ctx
	if opts.StateDir != "" {
		if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
			return nil, fmt.Errorf("Temporal dev server: state directory: %w", err)
		}
		cmd.Dir = opts.StateDir
	}
	proc, err := StartProc("temporal", cmd, logFile)
	if err != nil {
		return nil, fmt.Errorf("Temporal dev server: %w", err)
	}
	t.proc = proc
	db := dbFile
	if db == "" {
		db = "(in memory)"
	}
	log.Info("starting the Temporal dev server", "address", t.Address, "ui", t.UIURL, "db", db, "log", logFile, "pid", proc.Pid())

	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	began := time.Now()
	if err := waitTemporalHealthy(ctx, t, timeout); err != nil {
		_ = proc.Stop(5 * time.Second)
		return nil, err
	}
	log.Info("the Temporal dev server is ready", "address", t.Address, "took", time.Since(began).Round(time.Millisecond))
	return t, nil
}

// waitTemporalHealthy polls the started server until it is healthy, it exits,
// timeout passes or ctx ends.
func waitTemporalHealthy(ctx context.Context, t *Temporal, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	proc := t.proc
	crashed := func() error {
		return fmt.Errorf("the Temporal dev server exited before it was healthy (%v); last lines of %s:\n%s",
			proc.Err(), proc.LogFile(), proc.LogTail(40))
	}
	var lastErr error
	for {
		select {
		case <-proc.Done():
			return crashed()
		default:
		}
		actx, acancel := context.WithTimeout(wctx, 3*time.Second)
		lastErr = CheckTemporal(actx, t.Address)
		acancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-proc.Done():
			return crashed()
		case <-wctx.Done():
			why := "did not become healthy within " + timeout.String()
			if ctx.Err() != nil {
				why = "start interrupted: " + ctx.Err().Error()
			}
			return fmt.Errorf("the Temporal dev server at %s %s (last check: %v); last lines of %s:\n%s",
				t.Address, why, lastErr, proc.LogFile(), proc.LogTail(40))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// CheckTemporal reports whether a Temporal frontend at addr accepts a client,
// passes the health check and describes the default namespace.
func CheckTemporal(ctx context.Context, addr string) error {
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  addr,
		Namespace: TemporalNamespace,
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w", addr, err)
	}
	defer c.Close()
	if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return fmt.Errorf("Temporal at %s: health check: %w", addr, err)
	}
	if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: TemporalNamespace}); err != nil {
		return fmt.Errorf("Temporal at %s: describe namespace %q: %w", addr, TemporalNamespace, err)
	}
	return nil
}

// Pid returns the process id of the started dev server, or 0 if this process
// did not start it.
func (t *Temporal) Pid() int {
	if t == nil || t.proc == nil {
		return 0
	}
	return t.proc.Pid()
}

// Close stops the dev server if this process started it: SIGTERM to its
// process group, up to 10s of grace, then SIGKILL. Otherwise it does nothing.
// It is safe to call more than once.
func (t *Temporal) Close() error {
	if t == nil || t.proc == nil {
		return nil
	}
	t.closeOnce.Do(func() {
		if err := t.proc.Stop(10 * time.Second); err != nil {
			t.closeErr = fmt.Errorf("stop the Temporal dev server at %s: %w", t.Address, err)
		}
	})
	return t.closeErr
}

// Kill ends a dev server this process started with SIGKILL (no graceful
// shutdown), for fault injection; EnsureTemporal with the same options
// starts it again on its persisted DBFile. It is an error for a server this
// process did not start.
func (t *Temporal) Kill() error {
	if t == nil || t.proc == nil {
		return errors.New("kill the Temporal server: not started by this process")
	}
	return t.proc.Kill()
}
