package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/anneal-dev/anneal/agent/daemon"
)

// defaultAgentsPerProcess is how many simulated agents the bench runs in
// one agent host process. Real agents are one process per node: a process
// holding a thousand of them is not a thousand small ones. Each command an
// agent starts is a fork and exec, and the exec closes every descriptor of
// the process (a thousand agents' journals, locks and connections: 8.6 %
// of the machine's CPU at 1,000 × 20, against a few dozen descriptors per
// agent host of 40); and each garbage collection scans every agent's
// goroutines. The agents in one host share nothing else (each has its own
// HTTP client and work directory).
const defaultAgentsPerProcess = 40

// agentHost is a child process of the bench running simulated agents
// (benchAgents), until its standard input closes.
type agentHost struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startAgentHost starts agents for names in a child process of this
// binary (dev bench-agents), logging warnings to logPath.
func startAgentHost(apiURL, enrollToken, dir, logPath string, names []string) (*agentHost, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to run agents: %w", err)
	}
	args := append([]string{"bench-agents", "-api", apiURL, "-enroll-token", enrollToken, "-dir", dir, "-log", logPath}, names...)
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Killed with the bench, whatever way it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start an agent host: %w", err)
	}
	return &agentHost{cmd: cmd, stdin: stdin}, nil
}

// pid is the host's process id, for the CPU meter.
func (h *agentHost) pid() int { return h.cmd.Process.Pid }

// stop closes the host's standard input, which stops its agents, and
// waits for it (killing it after a while).
func (h *agentHost) stop() {
	_ = h.stdin.Close()
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
}

// benchAgents is `dev bench-agents`, run by the bench only: the agents of
// the nodes named, each in <dir>/nodes/<name>, until standard input
// closes or the process is told to stop.
func benchAgents(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench-agents", flag.ContinueOnError)
	api := fs.String("api", "", "the API's URL")
	token := fs.String("enroll-token", "", "an enroll token")
	dir := fs.String("dir", "", "the bench's directory")
	logPath := fs.String("log", "", "where the agents log warnings")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *api == "" || *dir == "" || fs.NArg() == 0 {
		return errors.New("bench-agents needs -api, -dir and node names")
	}
	// The host process is the agents' as the agent binary would be.
	daemon.SetDefaultGC()
	logFile, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		// The bench closes our standard input to stop us.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	runAgents(ctx, *api, *token, *dir, slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn})), fs.Args(), true)
	return nil
}

// runAgents runs the agents of the nodes named until ctx ends. With
// ownTransport, each has its own HTTP client, as separate processes would;
// without, they share http.DefaultTransport.
func runAgents(ctx context.Context, apiURL, enrollToken, dir string, log *slog.Logger, names []string, ownTransport bool) {
	var agents sync.WaitGroup
	for _, name := range names {
		cfg := daemon.Config{APIURL: apiURL, Name: name, EnrollToken: enrollToken,
			WorkDir: filepath.Join(dir, "nodes", name), Logger: log.With("node", name)}
		if ownTransport {
			cfg.HTTPClient = daemon.NewHTTPClient()
		}
		agents.Go(func() { _ = daemon.Run(ctx, cfg) })
	}
	agents.Wait()
}
