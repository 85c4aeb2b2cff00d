package devenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Where a Postgres came from (Postgres.Source).
const (
	// PostgresFromEnv: the server named by the DATABASE_URL environment variable.
	PostgresFromEnv = "env"
	// PostgresLocal: a server already listening on 127.0.0.1:5432.
	PostgresLocal = "local"
	// PostgresPrivate: a private cluster under the state directory, run by this package.
	PostgresPrivate = "private"
)

// EnvPostgresMode names the environment variable that forces the choice of
// server made by EnsurePostgres. Its only non-empty value is "private": skip
// DATABASE_URL and the 127.0.0.1:5432 probe and use a private cluster.
const EnvPostgresMode = "ANNEAL_DEV_PG"

// localPostgresAddr is where EnsurePostgres looks for an already running server.
const localPostgresAddr = "127.0.0.1:5432"

// privatePostgresPort is the port a private cluster prefers.
const privatePostgresPort = 5433

// errNoPostgresServer is returned when no server is reachable and none can be run.
var errNoPostgresServer = errors.New("PostgreSQL server not found: install it " +
	"(Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; " +
	"macOS: brew install postgresql@16) or set DATABASE_URL")

// Postgres is a PostgreSQL server usable for development and tests, found or
// started by EnsurePostgres. Its methods are safe for concurrent use.
type Postgres struct {
	// URL is the admin DSN: a role that may create databases, connected to
	// a maintenance database, e.g.
	// postgres://root@127.0.0.1:5432/postgres?sslmode=disable.
	URL string
	// Source tells where the server came from: PostgresFromEnv,
	// PostgresLocal or PostgresPrivate.
	Source string
	// DataDir is the data directory of a private cluster ("" otherwise).
	DataDir string
	// LogFile is the server log of a private cluster ("" otherwise).
	LogFile string

	tools   *pgTools // private cluster only
	log     *slog.Logger
	mu      sync.Mutex
	started bool // this process started the private cluster
}

// EnsurePostgres finds or starts a PostgreSQL server, in this order:
//
//  1. DATABASE_URL, if set (it must answer);
//  2. a server on 127.0.0.1:5432, trying the roles $PGUSER, the current OS
//     user and postgres with trust authentication, and taking the first that
//     connects and may create databases;
//  3. a private cluster in <stateDir>/pg (initdb on first use, then pg_ctl
//     start on 127.0.0.1, port 5433 if free, log in <stateDir>/pg.log),
//     reused by later calls, also from other processes.
//
// Setting ANNEAL_DEV_PG=private skips the first two. When running as root the
// cluster runs as the OS user postgres; if that user cannot reach stateDir,
// the data directory goes to <os.TempDir()>/anneal-pg-<hash of stateDir>
// instead (logged). log may be nil.
func EnsurePostgres(ctx context.Context, stateDir string, log *slog.Logger) (*Postgres, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch mode := os.Getenv(EnvPostgresMode); mode {
	case "", "auto":
		if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
			if err := pingPostgres(ctx, dsn, 10*time.Second); err != nil {
				return nil, fmt.Errorf("DATABASE_URL is set (%s) but the server does not answer: %w", redactDSN(dsn), err)
			}
			log.Info("using PostgreSQL from DATABASE_URL", "url", redactDSN(dsn))
			return &Postgres{URL: dsn, Source: PostgresFromEnv, log: log}, nil
		}
		if dsn, ok := probeLocalPostgres(ctx, log); ok {
			log.Info("using the PostgreSQL server on "+localPostgresAddr, "url", redactDSN(dsn))
			return &Postgres{URL: dsn, Source: PostgresLocal, log: log}, nil
		}
	case PostgresPrivate:
		log.Debug(EnvPostgresMode + "=private: skipping DATABASE_URL and " + localPostgresAddr)
	default:
		return nil, fmt.Errorf("%s=%q: the only supported value is %q", EnvPostgresMode, mode, PostgresPrivate)
	}
	return ensurePrivatePostgres(ctx, stateDir, log)
}

// pingPostgres connects to dsn and runs a trivial query.
func pingPostgres(ctx context.Context, dsn string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// probeLocalPostgres looks for a usable role on 127.0.0.1:5432.
func probeLocalPostgres(ctx context.Context, log *slog.Logger) (string, bool) {
	if !tcpAnswers(localPostgresAddr, time.Second) {
		log.Debug("nothing listens on " + localPostgresAddr)
		return "", false
	}
	var candidates []string
	seen := map[string]bool{}
	add := func(name string) {
		if name != "" && !seen[name] {
			seen[name] = true
			candidates = append(candidates, name)
		}
	}
	add(os.Getenv("PGUSER"))
	if u, err := user.Current(); err == nil {
		add(u.Username)
	}
	add("postgres")
	for _, role := range candidates {
		u := url.URL{Scheme: "postgres", User: url.User(role), Host: localPostgresAddr, Path: "/postgres", RawQuery: "sslmode=disable"}
		dsn := u.String()
		ok, err := canCreateDatabases(ctx, dsn)
		switch {
		case err != nil:
			log.Debug("cannot use PostgreSQL role", "addr", localPostgresAddr, "role", role, "err", err)
		case !ok:
			log.Debug("PostgreSQL role may not create databases", "addr", localPostgresAddr, "role", role)
		default:
			return dsn, true
		}
	}
	log.Warn("a server answers on "+localPostgresAddr+" but none of the roles can connect without a password and create databases; using a private cluster",
		"roles", candidates)
	return "", false
}

// canCreateDatabases reports whether the role of dsn may create databases.
func canCreateDatabases(ctx context.Context, dsn string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	err = conn.QueryRow(ctx, `SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&ok)
	return ok, err
}

// pgTools runs the PostgreSQL server programs, as the postgres OS user when
// this process is root (initdb and postgres refuse to run as root).
type pgTools struct {
	binDir  string
	cred    *syscall.Credential // nil: run as ourselves
	asUser  string              // name of the user in cred, for messages
	workDir string              // a directory the tools' user can reach
}

func (t *pgTools) command(ctx context.Context, tool string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(t.binDir, tool), args...)
	cmd.Dir = t.workDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: t.cred}
	return cmd
}

// chown gives path to the tools' user (no-op when running as ourselves).
func (t *pgTools) chown(path string) error {
	if t.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(t.cred.Uid), int(t.cred.Gid)); err != nil {
		return fmt.Errorf("give %s to the %s OS user: %w", path, t.asUser, err)
	}
	return nil
}

// canReach reports whether the tools' user can traverse to dir.
func (t *pgTools) canReach(ctx context.Context, dir string) bool {
	if t.cred == nil {
		return true
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", `test -d "$1" && test -x "$1"`, "sh", dir)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: t.cred}
	return cmd.Run() == nil
}

// findPostgresBinDir finds the directory holding initdb and pg_ctl: on PATH,
// else the highest version in the usual package locations.
func findPostgresBinDir() (string, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = real // e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb
		}
		dir := filepath.Dir(initdb)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	patterns := []string{
		"/usr/lib/postgresql/*/bin",          // Debian, Ubuntu
		"/usr/pgsql-*/bin",                   // RHEL, PGDG
		"/opt/homebrew/opt/postgresql@*/bin", // macOS, Apple silicon
		"/usr/local/opt/postgresql@*/bin",    // macOS, Intel
		"/opt/homebrew/opt/postgresql/bin",   // macOS, unversioned
		"/usr/local/opt/postgresql/bin",      // macOS, unversioned
		"/usr/local/pgsql/bin",               // built from source
		"/Applications/Postgres.app/Contents/Versions/*/bin",
	}
	type cand struct {
		dir     string
		version []int
	}
	var cands []cand
	numRe := regexp.MustCompile(`\d+(\.\d+)*`)
	for _, pat := range patterns {
		dirs, _ := filepath.Glob(pat)
		for _, dir := range dirs {
			if !isExecutable(filepath.Join(dir, "initdb")) || !isExecutable(filepath.Join(dir, "pg_ctl")) {
				continue
			}
			var v []int
			if m := numRe.FindString(filepath.Base(filepath.Dir(dir))); m != "" {
				for _, part := range strings.Split(m, ".") {
					n, _ := strconv.Atoi(part)
					v = append(v, n)
				}
			}
			cands = append(cands, cand{dir, v})
		}
	}
	if len(cands) == 0 {
		return "", errNoPostgresServer
	}
	sort.SliceStable(cands, func(i, j int) bool { return versionLess(cands[j].version, cands[i].version) })
	return cands[0].dir, nil
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// EnsurePrivatePostgres is EnsurePostgres with ANNEAL_DEV_PG=private: it
// ignores DATABASE_URL and 127.0.0.1:5432 and uses (creating or starting it)
// the private cluster under stateDir. log may be nil.
func EnsurePrivatePostgres(ctx context.Context, stateDir string, log *slog.Logger) (*Postgres, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return ensurePrivatePostgres(ctx, stateDir, log)
}

// ensurePrivatePostgres initializes (once) and starts (unless running) the
// private cluster of stateDir.
func ensurePrivatePostgres(ctx context.Context, stateDir string, log *slog.Logger) (*Postgres, error) {
	if stateDir == "" {
		return nil, errors.New("private PostgreSQL cluster: no state directory given")
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("private PostgreSQL cluster: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("private PostgreSQL cluster: create state directory: %w", err)
	}
	binDir, err := findPostgresBinDir()
	if err != nil {
		return nil, err
	}
	tools := &pgTools{binDir: binDir, workDir: abs}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, but PostgreSQL refuses to run as root and there is no OS user "+
				"\"postgres\" to run it as (create one, e.g. useradd --system postgres, or run as a normal user): %w", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("OS user postgres has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
		}
		tools.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		tools.asUser = "postgres"
	}

	// Where the cluster lives: the state directory, unless the server's OS
	// user cannot get there (e.g. it is under /root or in a 0700 temp dir).
	base := abs
	if !tools.canReach(ctx, abs) {
		sum := sha256.Sum256([]byte(abs))
		base = filepath.Join(os.TempDir(), "anneal-pg-"+hex.EncodeToString(sum[:6]))
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, fmt.Errorf("private PostgreSQL cluster: %w", err)
		}
		if !tools.canReach(ctx, base) {
			return nil, fmt.Errorf("private PostgreSQL cluster: the %s OS user can reach neither %s nor %s; choose a state directory it can traverse",
				tools.asUser, abs, base)
		}
		log.Info("the "+tools.asUser+" OS user cannot reach the state directory; keeping the private PostgreSQL cluster's data outside it",
			"state_dir", abs, "data_dir", filepath.Join(base, "pg"))
	}
	tools.workDir = base
	dataDir := filepath.Join(base, "pg")
	sockDir := filepath.Join(base, "pg-sock")
	logFile := filepath.Join(abs, "pg.log")

	// Serialize initdb/start between processes sharing this cluster.
	unlock, err := lockFile(ctx, filepath.Join(base, "pg.lock"), func() {
		log.Info("waiting for another caller setting up the private PostgreSQL cluster", "data_dir", dataDir)
	})
	if err != nil {
		return nil, fmt.Errorf("private PostgreSQL cluster: %w", err)
	}
	defer unlock()

	lf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("private PostgreSQL cluster: open log file: %w", err)
	}
	defer lf.Close()
	var logStart int64
	if st, err := lf.Stat(); err == nil {
		logStart = st.Size()
	}
	tail := func() string { return fileTail(logFile, logStart, 30) }

	if err := initCluster(ctx, tools, dataDir, sockDir, lf, log); err != nil {
		return nil, fmt.Errorf("%w; last lines of %s:\n%s", err, logFile, tail())
	}

	p := &Postgres{Source: PostgresPrivate, DataDir: dataDir, LogFile: logFile, tools: tools, log: log}
	running, err := clusterRunning(ctx, tools, dataDir)
	if err != nil {
		return nil, err
	}
	var port int
	if running {
		port, err = clusterPort(dataDir)
		if err != nil {
			return nil, err
		}
		log.Info("the private PostgreSQL cluster is already running", "data_dir", dataDir, "port", port)
	} else {
		port = privatePostgresPort
		if !portFree(port) {
			if port, err = FreePort(); err != nil {
				return nil, fmt.Errorf("private PostgreSQL cluster: %w", err)
			}
		}
		opts := fmt.Sprintf("-h 127.0.0.1 -p %d", port)
		if len(sockDir)+len("/.s.PGSQL.65535") < 104 {
			opts += " -k " + shellQuote(sockDir)
		} else {
			opts += " -c unix_socket_directories=''" // path too long for a socket
		}
		fmt.Fprintf(lf, "=== %s anneal: pg_ctl start -D %s -o %q\n", time.Now().Format(time.RFC3339), dataDir, opts)
		cmd := tools.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", dataDir, "-o", opts)
		// Without -l, the server inherits this log file descriptor, so it
		// needs no access to the state directory.
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.SysProcAttr.Setpgid = true // a Ctrl-C on our terminal is not for the server
		log.Info("starting the private PostgreSQL cluster", "data_dir", dataDir, "port", port, "log", logFile)
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("start the private PostgreSQL cluster in %s with %s: %w; last lines of %s:\n%s",
				dataDir, filepath.Join(binDir, "pg_ctl"), err, logFile, tail())
		}
		p.started = true
	}
	p.URL = privateClusterURL(dataDir, port)

	var lastErr error
	for deadline := time.Now().Add(15 * time.Second); ; {
		if lastErr = pingPostgres(ctx, p.URL, 5*time.Second); lastErr == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if p.started {
				_ = p.Close()
			}
			return nil, fmt.Errorf("the private PostgreSQL cluster in %s does not answer at %s: %w; last lines of %s:\n%s",
				dataDir, p.URL, lastErr, logFile, tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return p, nil
}

// initCluster runs initdb unless dataDir already holds a cluster.
func initCluster(ctx context.Context, tools *pgTools, dataDir, sockDir string, lf *os.File, log *slog.Logger) error {
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		return fmt.Errorf("private PostgreSQL cluster: %w", err)
	}
	if err := tools.chown(sockDir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err == nil {
		return nil
	}
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is neither empty nor a PostgreSQL data directory (no PG_VERSION; an interrupted initdb?); remove it and retry", dataDir)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("private PostgreSQL cluster: %w", err)
	}
	if err := tools.chown(dataDir); err != nil {
		return err
	}
	log.Info("creating a private PostgreSQL cluster", "data_dir", dataDir, "initdb", filepath.Join(tools.binDir, "initdb"))
	fmt.Fprintf(lf, "=== %s anneal: initdb -D %s\n", time.Now().Format(time.RFC3339), dataDir)
	cmd := tools.command(ctx, "initdb", "-D", dataDir, "--auth=trust", "-U", "postgres", "--encoding=UTF8", "--no-locale", "--no-sync")
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("initdb of the private PostgreSQL cluster in %s: %w", dataDir, err)
	}
	// Tests open many connections in parallel.
	conf, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("private PostgreSQL cluster: %w", err)
	}
	_, err = conf.WriteString("\n# added by anneal dev/devenv\nmax_connections = 300\n")
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("private PostgreSQL cluster: write postgresql.conf: %w", err)
	}
	return nil
}

// clusterRunning asks pg_ctl status whether the cluster in dataDir runs.
func clusterRunning(ctx context.Context, tools *pgTools, dataDir string) (bool, error) {
	cmd := tools.command(ctx, "pg_ctl", "status", "-D", dataDir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return true, nil
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.ExitCode() == 3 {
		return false, nil
	}
	return false, fmt.Errorf("pg_ctl status -D %s: %w: %s", dataDir, err, strings.TrimSpace(out.String()))
}

// privateClusterURL is the admin DSN of the running private cluster of
// dataDir: through its Unix socket when it has one, since a statement sent
// over a local socket costs the server and its client much less CPU than
// over loopback TCP; else TCP on 127.0.0.1.
func privateClusterURL(dataDir string, port int) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres"}
	q := url.Values{"sslmode": {"disable"}}
	if dir := clusterSocketDir(dataDir); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(port))); err == nil {
			u.Host = ""
			q.Set("host", dir)
			q.Set("port", strconv.Itoa(port))
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// clusterSocketDir reads the first socket directory of a running cluster
// from its postmaster.pid (line 5), "" if it has none or it cannot be read.
func clusterSocketDir(dataDir string) string {
	dir, _ := postmasterLine(dataDir, 5)
	return dir
}

// clusterPort reads the port of a running cluster from its postmaster.pid.
func clusterPort(dataDir string) (int, error) {
	line, err := postmasterLine(dataDir, 4)
	if err != nil {
		return 0, fmt.Errorf("port of the running PostgreSQL cluster: %w", err)
	}
	port, err := strconv.Atoi(line)
	if err != nil {
		return 0, fmt.Errorf("port of the running PostgreSQL cluster: postmaster.pid line 4 %q: %w", line, err)
	}
	return port, nil
}

// postmasterLine is line n (from 1) of a running cluster's postmaster.pid,
// trimmed: 4 is its port, 5 its first socket directory.
func postmasterLine(dataDir string, n int) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < n {
		return "", fmt.Errorf("short postmaster.pid in %s", dataDir)
	}
	return strings.TrimSpace(lines[n-1]), nil
}

// Close stops the private cluster if this process started it (pg_ctl stop -m
// fast); otherwise it does nothing. It is safe to call more than once.
func (p *Postgres) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		return nil
	}
	p.started = false
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := p.tools.command(ctx, "pg_ctl", "stop", "-m", "fast", "-w", "-t", "60", "-D", p.DataDir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("stop the private PostgreSQL cluster in %s: %w: %s", p.DataDir, err, strings.TrimSpace(out.String()))
	}
	p.logger().Info("stopped the private PostgreSQL cluster", "data_dir", p.DataDir)
	return nil
}

// Restart restarts a private cluster (pg_ctl restart -m fast: sessions are
// ended, the server comes back on the same port with the same options),
// for fault injection. Only a private cluster can be restarted: another
// server is not dev's to bounce.
func (p *Postgres) Restart(ctx context.Context) error {
	if p == nil || p.Source != PostgresPrivate {
		return errors.New("restart PostgreSQL: only a private cluster (under the state directory) can be restarted")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := p.tools.command(ctx, "pg_ctl", "restart", "-m", "fast", "-w", "-t", "60", "-D", p.DataDir)
	lf, err := os.OpenFile(p.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("restart the private PostgreSQL cluster: open log file: %w", err)
	}
	defer lf.Close()
	// The restarted server inherits these descriptors, like at start.
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("restart the private PostgreSQL cluster in %s: %w; last lines of %s:\n%s",
			p.DataDir, err, p.LogFile, fileTail(p.LogFile, 0, 20))
	}
	return nil
}

func (p *Postgres) logger() *slog.Logger {
	if p.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.log
}

// DatabaseURL returns the DSN of database name on the same server, with the
// same role and options as URL.
func (p *Postgres) DatabaseURL(name string) string {
	return dsnWithDatabase(p.URL, name)
}

var dbnameRe = regexp.MustCompile(`(^|\s)dbname\s*=\s*('(?:[^'\\]|\\.)*'|\S*)`)

// dsnWithDatabase replaces the database of a URL or keyword/value DSN.
func dsnWithDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			u.RawPath = ""
			return u.String()
		}
	}
	quoted := "dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name) + "'"
	if dbnameRe.MatchString(dsn) {
		return dbnameRe.ReplaceAllStringFunc(dsn, func(m string) string {
			if m != "" && (m[0] == ' ' || m[0] == '\t' || m[0] == '\n') {
				return m[:1] + quoted
			}
			return quoted
		})
	}
	return strings.TrimSpace(dsn + " " + quoted)
}

// redactDSN hides the password of a URL DSN for logging.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)`).ReplaceAllString(dsn, "password=xxxxx")
}

func checkDatabaseName(name string) error {
	switch {
	case name == "":
		return errors.New("empty database name")
	case len(name) > 63:
		return fmt.Errorf("database name %q is longer than PostgreSQL's 63 bytes", name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("database name %q contains a NUL byte", name)
	}
	return nil
}

// admin connects to the admin database.
func (p *Postgres) admin(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", redactDSN(p.URL), err)
	}
	return conn, nil
}

// EnsureDatabase creates database name unless it exists, and returns its URL.
func (p *Postgres) EnsureDatabase(ctx context.Context, name string) (string, error) {
	if err := checkDatabaseName(name); err != nil {
		return "", fmt.Errorf("ensure database: %w", err)
	}
	conn, err := p.admin(ctx)
	if err != nil {
		return "", fmt.Errorf("ensure database %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", fmt.Errorf("ensure database %q: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		if err != nil && !isSQLState(err, "42P04") { // duplicate_database: created concurrently
			return "", fmt.Errorf("ensure database %q: create: %w", name, err)
		}
		if err == nil {
			p.logger().Debug("created database", "database", name)
		}
	}
	return p.DatabaseURL(name), nil
}

// ResetDatabase drops database name if it exists (WITH (FORCE): other
// sessions are disconnected), creates it empty, and returns its URL.
func (p *Postgres) ResetDatabase(ctx context.Context, name string) (string, error) {
	return p.recreate(ctx, name, "")
}

// CreateDatabaseFromTemplate creates database name as a copy of database
// template (which must have no other sessions; busy templates are retried
// for a few seconds) and returns its URL. An existing database name is dropped
// first (WITH (FORCE)), so each call gives a fresh copy.
func (p *Postgres) CreateDatabaseFromTemplate(ctx context.Context, name, template string) (string, error) {
	if err := checkDatabaseName(template); err != nil {
		return "", fmt.Errorf("create database %q from template: %w", name, err)
	}
	return p.recreate(ctx, name, template)
}

func (p *Postgres) recreate(ctx context.Context, name, template string) (string, error) {
	what := fmt.Sprintf("reset database %q", name)
	if template != "" {
		what = fmt.Sprintf("create database %q from template %q", name, template)
	}
	if err := checkDatabaseName(name); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if name == template {
		return "", fmt.Errorf("%s: a database cannot be its own template", what)
	}
	conn, err := p.admin(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("%s: drop: %w", what, err)
	}
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err = conn.Exec(ctx, create)
		// object_in_use: the template has other sessions; they may be closing.
		if err == nil || !isSQLState(err, "55006") || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return p.DatabaseURL(name), nil
}

// DropDatabase drops database name if it exists, disconnecting its sessions
// (WITH (FORCE)).
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	if err := checkDatabaseName(name); err != nil {
		return fmt.Errorf("drop database: %w", err)
	}
	conn, err := p.admin(ctx)
	if err != nil {
		return fmt.Errorf("drop database %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %q: %w", name, err)
	}
	return nil
}

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// shellQuote quotes s for /bin/sh (pg_ctl passes -o through a shell).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
