package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
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
