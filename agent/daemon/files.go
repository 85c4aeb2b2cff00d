package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// openFile is os.OpenFile for the regular files a run touches (its log,
// its scratch and answer files), on the agent's path of every run.
// os.OpenFile offers each file it opens to the runtime's poller: on Linux
// two fcntl calls to make it non-blocking, an epoll_ctl that a regular
// file refuses, and two fcntl calls to undo the first, five system calls
// of about a hundred that a short run costs the agent. os.NewFile takes
// the descriptor as it is (one fcntl). Reads and writes block, as they do
// for a regular file anyway. Close-on-exec, as os.OpenFile's.
func openFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	for {
		fd, err := unix.Open(path, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), path), nil
		case errors.Is(err, unix.EINTR):
			continue
		default:
			return nil, &fs.PathError{Op: "open", Path: path, Err: err}
		}
	}
}

// writeReplacing writes data to path whole: to a temporary file (named by
// pattern, as os.CreateTemp takes it) in path's directory, renamed over
// path, so that no reader sees it half-written. Durable syncs the file
// before the rename (the directory is the caller's to sync).
func writeReplacing(path, pattern string, data []byte, durable bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	_, werr := tmp.Write(data)
	var serr error
	if durable {
		serr = tmp.Sync()
	}
	if err := errors.Join(werr, serr, tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// pruneFiles removes the regular files in dir last modified before
// cutoff, but for those keep says to keep (nil: none), for instance a
// file that is appended to, not replaced, which can be old and still hold
// what must be kept. A file it cannot remove does not stop it: the errors
// come back together.
func pruneFiles(dir string, cutoff time.Time, keep func(name string) bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || !info.ModTime().Before(cutoff) || (keep != nil && keep(e.Name())) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pruneLogs removes the runs' log files (LogsDir/<transaction>/*.log) last
// modified before cutoff, and the directories they leave empty; other
// files there (a command may write into its work directory) stay.
func pruneLogs(workDir string, cutoff time.Time) error {
	dir := filepath.Join(workDir, LogsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	notLog := func(name string) bool { return !strings.HasSuffix(name, ".log") }
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		errs = append(errs, pruneFiles(sub, cutoff, notLog))
		// Fails, harmlessly, while the directory still holds a file.
		_ = os.Remove(sub)
	}
	return errors.Join(errs...)
}

// LockFile is the file, in the work directory, an agent holds locked
// while it runs: one agent per work directory.
const LockFile = "agent.lock"

// lockWorkDir takes dir's lock for an agent's life, or says which agent
// holds it. Two agents on one work directory would append to one run
// journal, each reading the other's lines as its own, and could both run
// what one of them was offered; only the lock's holder compacts the
// journal. The kernel drops the lock with its process, however that ends;
// release drops it when Run returns. The lock is a flock, which a work
// directory on a network file system may not honour across hosts: it
// belongs on a local one.
func lockWorkDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the work directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("work directory %s is in use by another agent (pid %s): one agent per work directory", dir, pid)
		}
		return nil, fmt.Errorf("lock %s (the work directory must be on a local file system): %w", path, err)
	}
	// The holder's pid, for the message above; the lock is what counts.
	// Written before the rest is cut off, so that the file never reads
	// empty while the lock is held.
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	_, werr := f.WriteAt(pid, 0)
	if err := errors.Join(werr, f.Truncate(int64(len(pid)))); err != nil {
		f.Close()
		return nil, fmt.Errorf("write the agent's pid to %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
