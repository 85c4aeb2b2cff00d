package devenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process started by StartProc. It runs in its own process
// group, so Stop reaches its children and grandchildren too, and its
// standard output and error are appended to a log file.
type Proc struct {
	name     string
	cmd      *exec.Cmd
	logFile  string
	logStart int64 // size of the log file before this process started

	done chan struct{}
	err  error // set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartProc starts cmd as a process named name (used in messages) in its own
// process group, with its standard output and standard error appended to
// logFile (created, with its directory, if missing). A header line naming the
// command is written to the log first. cmd must not have been started, and its
// Stdout and Stderr must be unset.
func StartProc(name string, cmd *exec.Cmd, logFile string) (*Proc, error) {
	if cmd == nil {
		return nil, fmt.Errorf("start %s: nil command", name)
	}
	if cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, fmt.Errorf("start %s: command already has Stdout or Stderr set", name)
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		return nil, fmt.Errorf("start %s: create log directory: %w", name, err)
	}
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: open log file: %w", name, err)
	}
	defer f.Close() // the child keeps its own copy of the descriptor

	var start int64
	if st, err := f.Stat(); err == nil {
		start = st.Size()
	}
	fmt.Fprintf(f, "=== %s starting %s: %s\n", time.Now().Format(time.RFC3339), name, strings.Join(cmd.Args, " "))

	cmd.Stdout = f
	cmd.Stderr = f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = 0
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, cmd.Path, err)
	}
	p := &Proc{name: name, cmd: cmd, logFile: logFile, logStart: start, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Name returns the name given to StartProc.
func (p *Proc) Name() string { return p.name }

// Pid returns the process id of the started process, which is also the id of
// its process group.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// LogFile returns the path of the log file the process writes to.
func (p *Proc) LogFile() string { return p.logFile }

// Done returns a channel that is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err returns how the process ended (as returned by exec.Cmd.Wait) once Done is
// closed, and nil while it is still running.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Stop ends the process and everything in its process group: it sends SIGTERM
// to the group, waits up to grace for the group to be gone, then sends SIGKILL.
// It returns nil when the process stopped (whatever its exit status), and is
// safe to call more than once and after the process exited by itself.
func (p *Proc) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() { p.stopErr = p.stop(grace) })
	return p.stopErr
}

func (p *Proc) stop(grace time.Duration) error {
	pgid := p.Pid()
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: send SIGTERM to process group %d: %w", p.name, pgid, err)
	}
	if p.waitGroupGone(pgid, grace) {
		return nil
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: send SIGKILL to process group %d: %w", p.name, pgid, err)
	}
	// SIGKILL cannot be ignored; what may linger are zombies whose reaping is
	// up to their new parent, so do not wait for them for long.
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("stop %s: process %d still running 5s after SIGKILL", p.name, pgid)
	}
	p.waitGroupGone(pgid, time.Second)
	return nil
}

// waitGroupGone waits until the leader has exited and no process is left in
// the group, or until d has passed. It reports whether the group is gone.
func (p *Proc) waitGroupGone(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		leaderDone := false
		select {
		case <-p.done:
			leaderDone = true
		default:
		}
		if leaderDone && !groupAlive(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// groupAlive reports whether a process group still has a member that is not a
// zombie waiting to be reaped.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	// kill(2) also succeeds for zombies. On Linux look closer, so that a
	// zombie grandchild whose reaper is slow does not count as alive.
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, grp, ok := procStatGroup(pid)
		if ok && grp == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// procStatGroup reads the state and process group of pid from /proc/<pid>/stat.
func procStatGroup(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may contain spaces and parentheses
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(s[i+1:])
	// fields: state ppid pgrp ...
	if len(fields) < 3 || len(fields[0]) == 0 {
		return 0, 0, false
	}
	g, err := strconv.Atoi(fields[2])
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], g, true
}

// LogTail returns up to maxLines last lines that were written to the log file
// since this process was started (including the header line written by
// StartProc).
func (p *Proc) LogTail(maxLines int) string {
	return fileTail(p.logFile, p.logStart, maxLines)
}

// fileTail returns up to maxLines last lines of path after byte offset from,
// reading at most 64 KiB.
func fileTail(path string, from int64, maxLines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	const maxBytes = 64 << 10
	start := from
	if st.Size()-start > maxBytes {
		start = st.Size() - maxBytes
	}
	if start < 0 {
		start = 0
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}

// PeakRSS returns the peak resident set size ("high water mark", VmHWM in
// /proc/<pid>/status) of process pid, in bytes. It works on Linux only.
func PeakRSS(pid int) (int64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("peak RSS of process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("peak RSS of process %d: unexpected line %q in %s", pid, line, path)
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("peak RSS of process %d: parse %q: %w", pid, line, err)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("peak RSS of process %d: read %s: %w", pid, path, err)
	}
	return 0, fmt.Errorf("peak RSS of process %d: no VmHWM in %s (kernel thread or zombie?)", pid, path)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it, so callers that can should
// retry on "address already in use".
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free TCP port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFree reports whether port can be bound on 127.0.0.1 right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// tcpAnswers reports whether something accepts TCP connections at addr.
func tcpAnswers(addr string, timeout time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// lockFile takes an exclusive flock(2) on path (created if missing), polling
// so that ctx can cancel the wait. onWait is called once if the lock is busy.
// The returned function releases the lock.
func lockFile(ctx context.Context, path string, onWait func()) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	waited := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !waited && onWait != nil {
			onWait()
		}
		waited = true
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Kill sends SIGKILL to the process's whole group, as a crash or `kill -9`
// would, and waits until the process has exited (up to 10s). It is for
// fault injection; Stop is the graceful way. After Kill, Stop does nothing.
func (p *Proc) Kill() error {
	var err error
	p.stopOnce.Do(func() {
		pgid := p.Pid()
		if e := syscall.Kill(-pgid, syscall.SIGKILL); e != nil && !errors.Is(e, syscall.ESRCH) {
			err = fmt.Errorf("kill %s: send SIGKILL to process group %d: %w", p.name, pgid, e)
			return
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			err = fmt.Errorf("kill %s: process %d still running 10s after SIGKILL", p.name, pgid)
		}
		p.waitGroupGone(pgid, time.Second)
	})
	if err == nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("kill %s: already being stopped", p.name)
		}
	}
	return err
}
