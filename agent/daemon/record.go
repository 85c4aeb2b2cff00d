package daemon

// The agent's durable record of what it executed: exactly once on the node,
// at least once on the wire. The API offers a run again until the agent
// acknowledges it, so the same run and attempt may arrive twice (an answer
// lost on the way, a server restarted between claim and response, an agent
// restarted before it acknowledged). Once it has acknowledged a run, just
// before the command starts, the agent writes
// <WorkDir>/records/run-<id>.<attempt>.json marked started (a new file,
// written and synced, and the directory synced), and it appends the result
// there as a new line when the command ends (written and synced): the
// record is the file's last readable line. A run offered again is
// therefore never executed twice: its stored result is reported again,
// or, when a previous agent process died while running it, it is reported
// as failed with that reason. A new attempt (a retry decided by the
// server) has a new number and a record of its own. Software deployment
// rounds keep the same kind of record, software-<id>.<round>.json,
// replaced whole at each phase (a temporary file renamed over it).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// RecordsDir is the directory, under the work directory, of the agent's
// durable records of runs and software deployment rounds.
const RecordsDir = "records"

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

// Records reads and writes the agent's durable records in Dir.
type Records struct {
	Dir string
}

// RunRecordPath returns where the record of a run's attempt is kept.
func (r *Records) RunRecordPath(runID int64, attempt int) string {
	return filepath.Join(r.Dir, fmt.Sprintf("run-%d.%d.json", runID, attempt))
}

// SoftwareRecordPath returns where the record of a deployment round is kept.
func (r *Records) SoftwareRecordPath(id int64, round int) string {
	return filepath.Join(r.Dir, fmt.Sprintf("software-%d.%d.json", id, round))
}

// LoadRun returns the record of a run's attempt, or nil if there is none.
func (r *Records) LoadRun(runID int64, attempt int) (*RunRecord, error) {
	var rec RunRecord
	ok, err := loadRecord(r.RunRecordPath(runID, attempt), &rec)
	if !ok || err != nil {
		return nil, err
	}
	return &rec, nil
}

// SaveRun stores a run record durably: appended to the attempt's record
// file as a new line, written and synced, which saves the temporary file,
// rename and directory sync a replacement costs. A crash while it is
// written leaves a torn last line, and the line before it (the run
// started) stands: the run is reported interrupted, as if the crash had
// come just before. Without a record file yet, it is CreateRun.
func (r *Records) SaveRun(rec *RunRecord) error {
	path := r.RunRecordPath(rec.RunID, rec.Attempt)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return r.CreateRun(rec)
	}
	if err != nil {
		return fmt.Errorf("write record %s: %w", path, err)
	}
	rec.PID, rec.UpdatedAt = os.Getpid(), time.Now().UTC()
	data, err := json.Marshal(rec)
	if err != nil {
		f.Close()
		return fmt.Errorf("encode record: %w", err)
	}
	// A line of its own even after a record an older agent wrote whole,
	// without a newline at its end.
	line := append(append([]byte{'\n'}, data...), '\n')
	_, werr := f.Write(line)
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("write record %s: %w", path, err)
	}
	return nil
}

// CreateRun stores the first record of a run's attempt durably: written in
// place (a new file, synced, and the directory synced), without the
// temporary file renamed over a record that a replacement needs. A crash
// while it is written leaves a torn record, which reads as unreadable, so
// the run is reported failed rather than run (see runItem). A record that
// exists already (one an earlier agent wrote) gets it appended, as
// SaveRun does.
func (r *Records) CreateRun(rec *RunRecord) error {
	rec.PID, rec.UpdatedAt = os.Getpid(), time.Now().UTC()
	path := r.RunRecordPath(rec.RunID, rec.Attempt)
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode record: %w", err)
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return fmt.Errorf("records directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return r.SaveRun(rec)
	}
	if err != nil {
		return fmt.Errorf("write record %s: %w", path, err)
	}
	_, werr := f.Write(append(data, '\n'))
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("write record %s: %w", path, err)
	}
	return r.syncDir()
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
// finished: a previous agent process died while running them.
func (r *Records) Unfinished() ([]*RunRecord, error) {
	paths, err := filepath.Glob(filepath.Join(r.Dir, "run-*.json"))
	if err != nil {
		return nil, fmt.Errorf("list run records: %w", err)
	}
	var out []*RunRecord
	for _, p := range paths {
		var rec RunRecord
		if ok, err := loadRecord(p, &rec); err != nil || !ok {
			continue // an unreadable record is dealt with if its run comes again
		}
		if rec.Phase == PhaseStarted {
			out = append(out, &rec)
		}
	}
	return out, nil
}

// Prune removes records last written before cutoff.
func (r *Records) Prune(cutoff time.Time) error {
	if err := pruneFiles(r.Dir, cutoff); err != nil {
		return fmt.Errorf("prune old records: %w", err)
	}
	return nil
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
	return r.syncDir()
}

// syncDir syncs the records directory, so that a file created or renamed
// in it survives a crash.
func (r *Records) syncDir() error {
	d, err := os.Open(r.Dir)
	if err != nil {
		return fmt.Errorf("sync records directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync records directory: %w", err)
	}
	return nil
}
