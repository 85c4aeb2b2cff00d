package daemon

// The agent's durable record of what it executed: exactly once on the node,
// at least once on the wire. The API offers a run again until the agent
// acknowledges it, so the same run and attempt may arrive twice (an answer
// lost on the way, a server restarted between claim and response, an agent
// restarted before it acknowledged). Once it has acknowledged a run, just
// before the command starts, the agent appends the run's record marked
// started to its journal, <WorkDir>/records/runs.journal, and when the
// command ends it appends the record again with the result. Each append is
// one line of JSON; an attempt's record is its last line in the journal.
// The started line is fdatasynced before the command starts. The finished
// line is synced only if the agent has to wait for the API before it takes
// the result (else by the next synced line, or the kernel's writeback): a
// host crash before then leaves the started line, as a crash while it was
// written would. A run offered again is therefore never executed twice:
// its stored result is reported again, or, when a previous agent process
// died while running it, it is reported as failed with that reason. A new
// attempt (a retry decided by the server) has a new number and a record of
// its own.
//
// One journal rather than a file per attempt: creating a file per run cost
// an inode (on ext4 without a journal, a scan of the recently freed ones
// each time), a sync of the file and one of the directory, and appending
// the result another sync; the journal costs one fdatasync per run when
// the API takes its result at once (the started line's), and no new file.
// In memory the agent keeps where each attempt's last line is (with its
// phase and time), not the records: results carry output tails, and a busy
// node keeps a week of them.
//
// A result is written marked ReportPending; once the API has taken it, the
// record is appended again without the mark (MarkReported, unsynced, one
// write for a whole batch of results). An agent killed in between (a
// chain's results kept for one batch while its runs handed ahead go on)
// leaves the mark: the next process reports those results at its start,
// with the runs left started, in the journal's order, which is the order
// they ran in. Records of agents before the mark lack it and count as
// reported; agents before it ignore it (lines are decoded leniently).
//
// A crash while a line is appended leaves it torn at the journal's end. The
// next process reading the journal cuts it off before it appends, and the
// attempt's line before it stands. The command starts only once its started
// line is synced, so a torn started line means the command never started
// (as with no record, running it is safe), and a torn finished line leaves
// the started one: the run is reported interrupted, as if the crash had
// come just before. No torn or unreadable line stops the agent.
//
// The journal stays small: Prune, at the agent's start, and the append of
// a result that takes the journal past Records.CompactSize (or past twice
// its size after the last compaction, if that is more) rewrite it with
// only the last line of each attempt that is recent (RecordRetention),
// still started or still to be reported. Only the agent holding the work
// directory's lock (lockWorkDir) compacts it.
//
// Agents before the journal kept a file per attempt, run-<id>.<attempt>.json
// (RunRecordPath), whose last whole line was the record; such a file is
// still read when the journal knows nothing of that attempt, so an agent
// upgraded in place honours them, and Prune removes it once it is old.
// Software deployment rounds keep a record each, software-<id>.<round>.json,
// replaced whole at each phase (a temporary file renamed over it): they are
// rare, and stay out of the journal.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// RecordsDir is the directory, under the work directory, of the agent's
// durable records of runs and software deployment rounds.
const RecordsDir = "records"

// JournalFile is the name of the run journal in the records directory.
const JournalFile = "runs.journal"

// DefaultCompactSize is the journal size past which it is compacted, when
// Records.CompactSize is not set.
const DefaultCompactSize = 16 << 20

// RecordRetention is how long finished records are kept: far longer than
// any run stays offered.
const RecordRetention = 7 * 24 * time.Hour

// Phases of a run record.
const (
	// PhaseReceived: the run was received and its command has not
	// started, so running it later is safe. Earlier agents wrote it
	// before acknowledging a run; it is still read, and means what no
	// record means.
	PhaseReceived = "received"
	// PhaseStarted: written just before the command starts.
	PhaseStarted = "started"
	// PhaseFinished: the result is stored.
	PhaseFinished = "finished"
)

// RunRecord is what the agent keeps on disk about one attempt of a run.
type RunRecord struct {
	RunID         int64  `json:"run_id"`
	Attempt       int    `json:"attempt"`
	Task          string `json:"task,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
	NodeRoleID    int64  `json:"noderole_id,omitempty"`
	Type          string `json:"type,omitempty"`
	Phase         string `json:"phase"`
	// PID is the agent process that wrote the record last.
	PID       int       `json:"pid"`
	UpdatedAt time.Time `json:"updated_at"`
	// Result is set once the phase is finished.
	Result *protocol.RunResult `json:"result,omitempty"`
	// ReportPending is true on a finished record whose result the API
	// has not taken yet; MarkReported appends the record again with it
	// false. Records written before it existed lack it: reported.
	ReportPending bool `json:"report_pending,omitempty"`
}

// SoftwareRecord is what the agent keeps on disk about one round of a
// software deployment: started before the hook runs, then its signal.
type SoftwareRecord struct {
	ID        int64                    `json:"id"`
	Round     int                      `json:"round"`
	Phase     string                   `json:"phase"`
	PID       int                      `json:"pid"`
	UpdatedAt time.Time                `json:"updated_at"`
	Signal    *protocol.SoftwareSignal `json:"signal,omitempty"`
}

// Records reads and writes the agent's durable records in Dir. The run
// journal is opened on first use; a Records is safe for concurrent use.
type Records struct {
	Dir string
	// CompactSize is the journal size past which the append of a result
	// compacts it (see Prune), or past twice its size after the last
	// compaction if that is more, so that a journal of recent records
	// alone is not rewritten at every append; default DefaultCompactSize.
	CompactSize int64
	// Logger logs a compaction that failed after an append (the append
	// itself stands); default slog.Default().
	Logger *slog.Logger

	mu sync.Mutex
	j  *journal // nil until first used, and after an error that leaves the open file in doubt
}

// journal is the open run journal and what the agent knows of it.
type journal struct {
	f    *os.File    // read and appended to (O_APPEND)
	info os.FileInfo // to notice the journal replaced under another Records
	// index holds where each attempt's last line is.
	index map[runKey]journalEntry
	// end is the offset just past the last whole line read; lines is how
	// many whole lines there are before it, superseded, unreadable or not.
	end   int64
	lines int
	// compactAt is the size past which the next append compacts it.
	compactAt int64
	// legacyFiles says that record files of agents before the journal
	// were there when it was opened (none are written since: the work
	// directory's lock keeps such agents out), so LoadRun looks for one.
	legacyFiles bool
	// unsynced says that lines were appended since the last fdatasync.
	unsynced bool
}

// fdatasync is unix.Fdatasync; tests count the journal's syncs through it.
var fdatasync = unix.Fdatasync

// journalEntry is where an attempt's last line is in the journal, and what
// compaction and Unreported need to know of it without reading it.
type journalEntry struct {
	off     int64
	n       int // the line's length, without its newline
	phase   string
	updated time.Time
	pending bool // the record's ReportPending
}

// RunRecordPath returns where agents before the journal kept the record of
// a run's attempt, a file of its own that is still read (see LoadRun).
func (r *Records) RunRecordPath(runID int64, attempt int) string {
	return filepath.Join(r.Dir, fmt.Sprintf("run-%d.%d.json", runID, attempt))
}

// SoftwareRecordPath returns where the record of a deployment round is kept.
func (r *Records) SoftwareRecordPath(id int64, round int) string {
	return filepath.Join(r.Dir, fmt.Sprintf("software-%d.%d.json", id, round))
}

// LoadRun returns the record of a run's attempt, or nil if there is none:
// its last line in the journal, else the record file an older agent wrote
// (see RunRecordPath). An error means the record exists but cannot be
// read, or whether it exists is unknown.
func (r *Records) LoadRun(runID int64, attempt int) (*RunRecord, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, err := r.current()
	if err != nil {
		return nil, err
	}
	if e, ok := j.index[runKey{runID, attempt}]; ok {
		return j.record(e)
	}
	if !j.legacyFiles {
		return nil, nil
	}
	var rec RunRecord
	ok, err := loadRecord(r.RunRecordPath(runID, attempt), &rec)
	if !ok || err != nil {
		return nil, err
	}
	return &rec, nil
}

// SaveRun stores a run record durably: one line appended to the journal
// and fdatasynced before it returns. A crash while it is written leaves a
// torn line that the next reading of the journal drops, so the attempt's
// line before it stands (see the file's comment).
func (r *Records) SaveRun(rec *RunRecord) error { return r.saveRun(rec, true) }

// SaveRunUnsynced is SaveRun without the fdatasync: the line is in the
// page cache, where the agent's process dying cannot lose it, but a crash
// of the host can, until Sync or the next durable append (which syncs the
// whole journal) makes it durable. For a result the API is about to take:
// once the API has it, the agent's copy only answers an offer of the same
// attempt again, which the API no longer makes, and a host crash that
// loses the line leaves the started one, reported interrupted and refused
// as late. What is still unreported gets a Sync before the agent waits
// for the API (agent.retry), and at Close.
func (r *Records) SaveRunUnsynced(rec *RunRecord) error { return r.saveRun(rec, false) }

// MarkReported appends the records of results the API has taken again with
// ReportPending false, so that the next agent process does not report them
// again: all in one write, unsynced (a host crash that loses the lines
// makes the next process send the results again, which the API answers as
// it did the first time).
func (r *Records) MarkReported(recs ...*RunRecord) error {
	if len(recs) == 0 {
		return nil
	}
	for _, rec := range recs {
		rec.ReportPending = false
	}
	return r.saveRuns(recs, false)
}

// Sync makes the journal's unsynced lines (SaveRunUnsynced) durable; it
// does nothing when there are none.
func (r *Records) Sync() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.j == nil {
		return nil
	}
	if err := r.j.sync(); err != nil {
		return fmt.Errorf("%s: %w", r.journalPath(), err)
	}
	return nil
}

func (r *Records) saveRun(rec *RunRecord, durable bool) error {
	return r.saveRuns([]*RunRecord{rec}, durable)
}

// saveRuns appends recs to the journal, one line each, in one write.
func (r *Records) saveRuns(recs []*RunRecord, durable bool) error {
	pid, now := os.Getpid(), time.Now().UTC()
	var data []byte
	lens := make([]int, len(recs))
	for i, rec := range recs {
		rec.PID, rec.UpdatedAt = pid, now
		line, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode record: %w", err)
		}
		lens[i] = len(line)
		if data == nil {
			data = line // a single record is not copied
		} else {
			data = append(data, line...)
		}
		data = append(data, '\n')
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	j, err := r.current()
	if err != nil {
		return err
	}
	last := recs[len(recs)-1]
	if err := j.append(data, recs, lens, durable); err != nil {
		// A line may be half written: the journal is read again, and
		// the torn line cut off, before the next append.
		r.closeJournal()
		return fmt.Errorf("write record of run %d attempt %d to %s: %w", last.RunID, last.Attempt, r.journalPath(), err)
	}
	// Compacted after a result, not between a run's acknowledgement and
	// the start of its command.
	if last.Phase != PhaseStarted && j.end > j.compactAt {
		if err := r.compact(j, time.Now().Add(-RecordRetention)); err != nil {
			// Tried again once the journal has doubled, not at every
			// append (a full disk would make each one a rewrite).
			j.compactAt = 2 * j.end
			r.logger().Warn("cannot compact the run journal; it goes on growing", "journal", r.journalPath(), "error", err)
		}
	}
	return nil
}

// CreateRun stores the first record of a run's attempt durably. In the
// journal that is an append as any other (see SaveRun): the attempt's
// record is its last line, whatever an older agent wrote before it.
func (r *Records) CreateRun(rec *RunRecord) error {
	return r.SaveRun(rec)
}

// LoadSoftware returns the record of a deployment round, or nil.
func (r *Records) LoadSoftware(id int64, round int) (*SoftwareRecord, error) {
	var rec SoftwareRecord
	ok, err := loadRecord(r.SoftwareRecordPath(id, round), &rec)
	if !ok || err != nil {
		return nil, err
	}
	return &rec, nil
}

// SaveSoftware stores a deployment round's record durably.
func (r *Records) SaveSoftware(rec *SoftwareRecord) error {
	rec.PID, rec.UpdatedAt = os.Getpid(), time.Now().UTC()
	return r.save(r.SoftwareRecordPath(rec.ID, rec.Round), rec)
}

// Unfinished lists the run records whose command started and never
// finished: a previous agent process died while running them. Older
// agents' record files count too, unless the journal has a later record
// of the same attempt.
func (r *Records) Unfinished() ([]*RunRecord, error) { return r.unreported(false) }

// Unreported lists the run records whose result the API may not have, in
// the order they were written (the order the runs ran in): those
// Unfinished lists, and the finished ones still marked ReportPending (a
// process died before the API took their results).
func (r *Records) Unreported() ([]*RunRecord, error) { return r.unreported(true) }

func (r *Records) unreported(pending bool) ([]*RunRecord, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, err := r.current()
	if err != nil {
		return nil, err
	}
	// Older agents' record files first: the journal came after them.
	var out []*RunRecord
	paths, err := filepath.Glob(filepath.Join(r.Dir, "run-*.json"))
	if err != nil {
		return nil, fmt.Errorf("list run records: %w", err)
	}
	for _, p := range paths {
		var rec RunRecord
		if ok, err := loadRecord(p, &rec); err != nil || !ok {
			continue // an unreadable record is dealt with if its run comes again
		}
		if _, inJournal := j.index[runKey{rec.RunID, rec.Attempt}]; rec.Phase == PhaseStarted && !inJournal {
			out = append(out, &rec)
		}
	}
	for _, e := range j.entries() {
		if e.phase != PhaseStarted && !(pending && e.pending && e.phase == PhaseFinished) {
			continue
		}
		rec, err := j.record(e)
		if err != nil {
			// One bad record does not keep the others from being
			// reported; its run, offered again, is dealt with then.
			r.logger().Warn("an unreported run's record in the journal is unreadable", "journal", r.journalPath(), "error", err)
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// Prune drops the records last written before cutoff: the journal is
// compacted (see compact), and older agents' record files and software
// round records are removed.
func (r *Records) Prune(cutoff time.Time) error {
	r.mu.Lock()
	j, err := r.current()
	if err == nil {
		err = r.compact(j, cutoff)
	}
	r.mu.Unlock()
	if err := errors.Join(err, pruneFiles(r.Dir, cutoff, func(name string) bool { return name == JournalFile })); err != nil {
		return fmt.Errorf("prune old records: %w", err)
	}
	return nil
}

// Close closes the journal. A Records used after Close opens it again.
func (r *Records) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.j == nil {
		return nil
	}
	err := errors.Join(r.j.sync(), r.j.f.Close())
	r.j = nil
	if err != nil {
		return fmt.Errorf("close %s: %w", r.journalPath(), err)
	}
	return nil
}

func (r *Records) journalPath() string { return filepath.Join(r.Dir, JournalFile) }

func (r *Records) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// open returns the journal, opened and read on first use: created if
// there is none (mode 0600, in a directory of mode 0700), a torn last line
// cut off. The directory and its parent are synced at each opening, so
// that the journal's name, new or renamed by a compaction, survives a
// crash before anything is appended to it. The caller holds mu.
func (r *Records) open() (*journal, error) {
	if r.j != nil {
		return r.j, nil
	}
	path := r.journalPath()
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("records directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	j := &journal{f: f, index: map[runKey]journalEntry{}}
	torn, err := j.read()
	if err == nil && torn > 0 {
		// Cut off before anything is appended after it, so that the
		// next line is a line of its own, and the torn one is never
		// read as part of it.
		err = f.Truncate(j.end)
	}
	if err == nil {
		j.info, err = f.Stat()
	}
	if err == nil {
		var legacy []string
		legacy, err = filepath.Glob(filepath.Join(r.Dir, "run-*.json"))
		j.legacyFiles = len(legacy) > 0
	}
	if err == nil {
		err = errors.Join(syncDir(r.Dir), syncDir(filepath.Dir(r.Dir)))
	}
	// Not before it has doubled: a journal opened again after a write
	// failed keeps the back-off of a compaction that failed (a full disk),
	// and Prune compacts it at the agent's start anyway.
	j.compactAt = max(r.compactSize(), 2*j.end)
	// A process killed after an unsynced append left that line in the page
	// cache only: the next Sync makes what was read durable too.
	j.unsynced = j.end > 0
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	r.j = j
	return j, nil
}

// current is open, caught up with the journal on disk: the lines another
// Records on the same directory appended are read, and a journal it
// replaced (a compaction), removed or shortened is opened again. An agent
// is its journal's only writer, but a test or a tool may append a record
// while it runs (it must not compact: only the work directory's lock
// holder does): this costs a stat per use, little next to an fdatasync.
// The caller holds mu.
func (r *Records) current() (*journal, error) {
	j, err := r.open()
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(r.journalPath())
	switch {
	case errors.Is(err, fs.ErrNotExist) || (err == nil && (!os.SameFile(st, j.info) || st.Size() < j.end)):
		r.closeJournal()
		return r.open()
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", r.journalPath(), err)
	case st.Size() > j.end:
		if _, err := j.read(); err != nil {
			r.closeJournal()
			return nil, fmt.Errorf("read %s: %w", r.journalPath(), err)
		}
	}
	return j, nil
}

// closeJournal forgets the open journal; the next use opens it again. The
// caller holds mu.
func (r *Records) closeJournal() {
	if r.j != nil {
		_ = r.j.sync() // best effort: what was written stays written
		r.j.f.Close()
		r.j = nil
	}
}

func (r *Records) compactSize() int64 {
	if r.CompactSize > 0 {
		return r.CompactSize
	}
	return DefaultCompactSize
}

// compact rewrites the journal with the last line of each attempt written
// at or after cutoff, or still started whatever its age (a run that a dead
// agent left, to report interrupted, or one running now), or still to be
// reported (ReportPending: the next start reports it): superseded
// lines, unreadable ones and old records go. The new journal is written
// whole and synced, renamed over the old one, and opened anew (which syncs
// the directory) before anything is appended to it. A journal with
// nothing to drop is left as it is. The caller holds mu.
func (r *Records) compact(j *journal, cutoff time.Time) error {
	var keep []journalEntry
	for _, e := range j.entries() {
		if e.phase == PhaseStarted || e.pending || !e.updated.Before(cutoff) {
			keep = append(keep, e)
		}
	}
	if len(keep) == j.lines {
		j.compactAt = max(r.compactSize(), 2*j.end)
		return nil
	}
	var data []byte
	for _, e := range keep {
		line, err := j.line(e)
		if err != nil {
			return err
		}
		data = append(append(data, line...), '\n')
	}
	path := r.journalPath()
	if err := writeReplacing(path, "."+JournalFile+".*.tmp", data, true); err != nil {
		return fmt.Errorf("compact %s: %w", path, err)
	}
	// The open file is the journal replaced: whatever happens next, the
	// next use opens the new one, where its lines are durable.
	j.unsynced = false
	r.closeJournal()
	nj, err := r.open()
	if err != nil {
		return fmt.Errorf("compact %s: %w", path, err)
	}
	nj.compactAt = max(r.compactSize(), 2*nj.end)
	return nil
}

// read reads the journal's whole lines from j.end on into the index, and
// returns how many bytes follow the last one: a line torn by a crash, or
// (under another Records) one being appended.
func (j *journal) read() (tail int64, err error) {
	br := bufio.NewReaderSize(io.NewSectionReader(j.f, j.end, math.MaxInt64-j.end), 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return int64(len(line)), nil
		}
		if err != nil {
			return 0, err
		}
		j.add(j.end, line[:len(line)-1])
		j.end += int64(len(line))
		j.lines++
	}
}

// add indexes the line at off as its attempt's last. A line that is not a
// record (garbled) is skipped; compaction drops it.
func (j *journal) add(off int64, line []byte) {
	var h struct {
		RunID         int64     `json:"run_id"`
		Attempt       int       `json:"attempt"`
		Phase         string    `json:"phase"`
		UpdatedAt     time.Time `json:"updated_at"`
		ReportPending bool      `json:"report_pending"`
	}
	if json.Unmarshal(line, &h) != nil {
		return
	}
	j.index[runKey{h.RunID, h.Attempt}] = journalEntry{off: off, n: len(line), phase: h.Phase, updated: h.UpdatedAt, pending: h.ReportPending}
}

// sync makes the lines appended unsynced durable; it does nothing when
// there are none.
func (j *journal) sync() error {
	if !j.unsynced {
		return nil
	}
	if err := fdatasync(int(j.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	j.unsynced = false
	return nil
}

// append writes data, recs encoded as lines (lens[i] the length of rec
// i's, without its newline), at the journal's end in one write and, if
// durable, syncs the journal. Where the lines went is what the file
// offset says after the write (on Linux, the end of what an O_APPEND write
// wrote): should another Records have appended since the journal was last
// read, its lines are read too.
func (j *journal) append(data []byte, recs []*RunRecord, lens []int, durable bool) error {
	if _, err := j.f.Write(data); err != nil {
		return err
	}
	end, err := j.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if durable {
		if err := fdatasync(int(j.f.Fd())); err != nil {
			return fmt.Errorf("fdatasync: %w", err)
		}
	}
	j.unsynced = !durable
	if off := end - int64(len(data)); off != j.end {
		_, err := j.read()
		return err
	}
	// Indexed from recs: decoding the lines again would scan their
	// output tails for five fields.
	for i, rec := range recs {
		j.index[runKey{rec.RunID, rec.Attempt}] = journalEntry{off: j.end, n: lens[i], phase: rec.Phase,
			updated: rec.UpdatedAt, pending: rec.ReportPending}
		j.end += int64(lens[i]) + 1
		j.lines++
	}
	return nil
}

// line reads an entry's line.
func (j *journal) line(e journalEntry) ([]byte, error) {
	line := make([]byte, e.n)
	if _, err := j.f.ReadAt(line, e.off); err != nil {
		return nil, fmt.Errorf("read %s at %d: %w", j.f.Name(), e.off, err)
	}
	return line, nil
}

// record reads and decodes an entry's line.
func (j *journal) record(e journalEntry) (*RunRecord, error) {
	line, err := j.line(e)
	if err != nil {
		return nil, err
	}
	var rec RunRecord
	if err := json.Unmarshal(line, &rec); err != nil {
		return nil, fmt.Errorf("record in %s at %d is unreadable: %w", j.f.Name(), e.off, err)
	}
	return &rec, nil
}

// entries returns the index's entries in the journal's order.
func (j *journal) entries() []journalEntry {
	out := make([]journalEntry, 0, len(j.index))
	for _, e := range j.index {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b journalEntry) int { return cmp.Compare(a.off, b.off) })
	return out
}

// loadRecord reads a record into v: the file's last line that is a whole
// JSON value (a file written whole is one line). Only a file without any
// is unreadable: a torn first record, or an empty file.
func loadRecord(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read record %s: %w", path, err)
	}
	lines := bytes.Split(data, []byte{'\n'})
	for i := len(lines) - 1; i >= 0; i-- {
		line := bytes.TrimSpace(lines[i])
		if len(line) == 0 || !json.Valid(line) {
			continue // torn by a crash while it was written
		}
		if err := json.Unmarshal(line, v); err != nil {
			return false, fmt.Errorf("record %s is unreadable: %w", path, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("record %s is unreadable: no whole record in its %d bytes", path, len(data))
}

// save writes v to path so that a crash leaves either the old record or
// the new one, never a torn one: a temporary file, fsync, rename, and fsync
// of the directory so the rename itself survives.
func (r *Records) save(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode record: %w", err)
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return fmt.Errorf("records directory: %w", err)
	}
	if err := writeReplacing(path, "."+strings.TrimSuffix(filepath.Base(path), ".json")+".*.tmp", data, true); err != nil {
		return fmt.Errorf("write record %s: %w", path, err)
	}
	return syncDir(r.Dir)
}

// syncDir syncs a directory, so that a file created or renamed in it
// survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
