package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

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

// pruneFiles removes the regular files in dir last modified before cutoff,
// but for those named in keep (a file that is appended to, not replaced,
// can be old and still hold what must be kept).
func pruneFiles(dir string, cutoff time.Time, keep ...string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || !info.ModTime().Before(cutoff) || slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", e.Name(), err)
		}
	}
	return nil
}

// pruneTree is pruneFiles on dir and on each of its subdirectories, which
// are removed once empty.
func pruneTree(dir string, cutoff time.Time) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		if err := pruneFiles(sub, cutoff); err != nil {
			return err
		}
		// Fails, harmlessly, while the directory still holds a file.
		_ = os.Remove(sub)
	}
	return pruneFiles(dir, cutoff)
}

// LockFile is the file, in the work directory, an agent holds locked
// while it runs: one agent per work directory.
const LockFile = "agent.lock"

// lockWorkDir takes dir's lock for an agent's life, or says which agent
// holds it. Two agents on one work directory would append to one run
// journal, each reading the other's lines as its own, and could both run
// what one of them was offered. The kernel drops the lock with its
// process, however that ends; release drops it when Run returns.
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
			return nil, fmt.Errorf("work directory %s is in use by another agent (pid %s): one agent per work directory",
				dir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock the work directory: %w", err)
	}
	// The holder's pid, for the message above; the lock is what counts.
	terr := f.Truncate(0)
	_, werr := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	if err := errors.Join(terr, werr); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the work directory: %w", err)
	}
	return func() { f.Close() }, nil
}
