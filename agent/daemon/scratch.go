package daemon

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// scratchDir is where the shell keeps a run's outputs and attributes files.
func scratchDir(workDir string) string { return filepath.Join(workDir, "tmp") }

// scratchSlots numbers the sets of scratch files of the runs executing at
// once (ReuseScratch): a run takes the lowest free one, so the same few
// files are emptied and reused, run after run. A slot whose run left
// processes behind is retired, never handed out again: they may still
// write to its files.
type scratchSlots struct {
	mu   sync.Mutex
	free []int
	next int
	// held are the shared files (holding) as last read whole and found to
	// hold their data, by path: one unchanged since (same inode, size and
	// change time) still holds it, and is not read again.
	held map[string]fileStamp
}

// fileStamp identifies a file's content without reading it: any write,
// or another file renamed into its place, changes it (the change time
// cannot be set back by a program).
type fileStamp struct {
	ino, size int64
	ctime     syscall.Timespec
}

// stampOf is the stamp of the regular file at path, or false.
func stampOf(path string) (fileStamp, bool) {
	info, err := os.Lstat(path)
	if err != nil || !info.Mode().IsRegular() {
		return fileStamp{}, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{}, false
	}
	return fileStamp{ino: int64(st.Ino), size: info.Size(), ctime: st.Ctim}, true
}

// heldUnchanged says whether path is still the file stamped when it was
// last known to hold its data.
func (s *scratchSlots) heldUnchanged(path string) bool {
	now, ok := stampOf(path)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[path] == now
}

// holds records that path, as stamped, held its data.
func (s *scratchSlots) holds(path string, stamp fileStamp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil || len(s.held) > 1000 {
		s.held = map[string]fileStamp{} // a node's runs share a few
	}
	s.held[path] = stamp
}

func (s *scratchSlots) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return slot
	}
	s.next++
	return s.next - 1
}

func (s *scratchSlots) put(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, slot)
}

// runScratch makes a run's scratch files: its slot's, emptied, when the
// executor reuses them (creating files, and removing them, is most of what
// an agent spends per run besides the command), else new ones, removed
// when the run ends.
type runScratch struct {
	dir     string
	item    protocol.WorkItem
	slots   *scratchSlots // nil: new files
	slot    int
	retired bool
	used    []string // slot files
	created []string // files of this run alone, removed at its end
}

func (e *ShellExecutor) scratch(dir string, item protocol.WorkItem) *runScratch {
	s := &runScratch{dir: dir, item: item}
	if e.ReuseScratch {
		s.slots, s.slot = &e.slots, e.slots.take()
	}
	return s
}

// empty returns the path of an empty scratch file named after name. A
// slot's name carries the agent's process id, so that processes a killed
// agent left behind never write into a later agent's files.
func (s *runScratch) empty(name, suffix string) (string, error) {
	if s.slots != nil {
		path := filepath.Join(s.dir, fmt.Sprintf("%s-%d-%d%s", name, os.Getpid(), s.slot, suffix))
		s.used = append(s.used, path)
		return path, emptyFile(path)
	}
	f, err := s.own(name, suffix)
	if err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// own creates a scratch file of this run alone, removed when it ends.
func (s *runScratch) own(name, suffix string) (*os.File, error) {
	f, err := os.CreateTemp(s.dir, fmt.Sprintf("%s-%d-%d-*%s", name, s.item.RunID, s.item.Attempt, suffix))
	if err != nil {
		return nil, err
	}
	s.created = append(s.created, f.Name())
	return f, nil
}

// holding returns the path of a scratch file holding data. Without
// secrets, and when the executor reuses scratch files, it is a file shared
// by the runs sent the same data (named by its hash; a node's runs mostly
// are): the existing one when it still holds data (a command may have
// changed it), else one written whole under a temporary name and renamed
// into place, so that no reader sees it half-written. Data with secrets
// goes to a file of this run alone, removed when it ends.
func (s *runScratch) holding(name, suffix string, data []byte, secret bool) (string, error) {
	if s.slots == nil || secret {
		f, err := s.own(name, suffix)
		if err != nil {
			return "", err
		}
		_, werr := f.Write(data)
		return f.Name(), errors.Join(werr, f.Close())
	}
	sum := sha256.Sum256(data)
	path := filepath.Join(s.dir, name+"-"+hex.EncodeToString(sum[:16])+suffix)
	if s.slots.heldUnchanged(path) {
		return path, nil
	}
	// Stamped before it is read: a change after that changes the stamp,
	// and the next run reads the file again. Not while its change time is
	// recent: a kernel whose change times are only as fine as its clock
	// tick would give a change in the same tick the same stamp (git's
	// "racily clean" index entries).
	stamp, stamped := stampOf(path)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		if stamped && time.Since(time.Unix(stamp.ctime.Unix())) > time.Second {
			s.slots.holds(path, stamp)
		}
		return path, nil
	}
	if err := writeReplacing(path, name+"-*.tmp", data, false); err != nil {
		return "", err
	}
	return path, nil
}

// retire keeps the run's slot from being handed out again, and removes
// its files: processes the run left running may still write to them.
func (s *runScratch) retire() {
	s.retired = true
	for _, p := range s.used {
		_ = os.Remove(p)
	}
}

func (s *runScratch) release() {
	for _, p := range s.created {
		_ = os.Remove(p)
	}
	if s.slots != nil && !s.retired {
		s.slots.put(s.slot)
	}
}

// createInDir calls create, a creation of a file in dir; when dir is
// missing (the first run, or it was pruned), it makes dir with perm and
// calls create again. A run creates its files without looking for their
// directories first: a stat and a mkdir fewer per run.
func createInDir[T any](dir string, perm os.FileMode, create func() (T, error)) (T, error) {
	v, err := create()
	if !errors.Is(err, fs.ErrNotExist) {
		return v, err
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return v, fmt.Errorf("create directory: %w", err)
	}
	return create()
}

// emptyFile empties the regular file at path, creating it if it is not
// there (the first use of a slot, or a command removed it). Whatever else
// a command left at path (a symbolic link, a directory, a file linked to
// another name) is removed, never followed nor emptied in place. A file
// already empty is left as it is: most commands write no outputs, and a
// look (lstat) costs a fifth of emptying it again (an open that
// truncates, a stat, a close).
func emptyFile(path string) error {
	if info, err := os.Lstat(path); err == nil && info.Mode().IsRegular() && ownLink(info) {
		if info.Size() == 0 {
			return nil
		}
		f, err := openFile(path, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
		if err == nil {
			if info, serr := f.Stat(); serr == nil && info.Mode().IsRegular() {
				return f.Close()
			}
			_ = f.Close() // replaced meanwhile by a FIFO or a device: replaced below
		}
	}
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	f, err := openFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}
