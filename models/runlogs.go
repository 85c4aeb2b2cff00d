package models

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// MaxRunLogBytes is how much of one run attempt's log the server keeps:
// the first 8 MiB. Beyond it the rest is counted and dropped (the log says
// so at its end); the whole log stays on the node.
const MaxRunLogBytes = 8 << 20

// MaxLogChunkBytes bounds one chunk an agent sends.
const MaxLogChunkBytes = 1 << 20

// RunLogState says how much of a run attempt's log the server has.
type RunLogState struct {
	// Size is the number of bytes of the log received: the offset the next
	// chunk starts at.
	Size int64
	// Stored is the number of bytes kept (at most MaxRunLogBytes).
	Stored int64
	// Truncated is true once bytes beyond the cap were dropped.
	Truncated bool
}

// LogOffsetError refuses a chunk that starts after the end of what the
// server has: the agent must send again from Expected.
type LogOffsetError struct {
	Offset, Expected int64
}

// Error says what was expected.
func (e *LogOffsetError) Error() string {
	return fmt.Sprintf("offset %d is past the end of the stored log; send from offset %d", e.Offset, e.Expected)
}

type runLog struct {
	RunID     int64 `gorm:"primaryKey"`
	Attempt   int   `gorm:"primaryKey"`
	Size      int64
	Stored    int64
	Truncated bool
	UpdatedAt time.Time
}

func (runLog) TableName() string { return "run_logs" }

type runLogChunk struct {
	RunID   int64 `gorm:"primaryKey"`
	Attempt int   `gorm:"primaryKey"`
	Pos     int64 `gorm:"primaryKey"`
	Data    []byte
}

func (runLogChunk) TableName() string { return "run_log_chunks" }

// AppendRunLog stores a chunk of the log of a run of the agent's own node,
// data being the log's bytes from offset on. It is idempotent by offset:
// the part of data the server has already seen is skipped, so a chunk sent
// again is not stored twice. A chunk starting past the end of what the
// server has is a *LogOffsetError, unless the log is truncated already.
// Bytes beyond MaxRunLogBytes are counted but not kept. attempt may be an earlier attempt of the run than its
// current one (its log may arrive late), never a later one.
func (s *Store) AppendRunLog(ctx context.Context, nodeID, runID int64, attempt int, offset int64, data []byte) (RunLogState, error) {
	return appendRunLog(s.DB.WithContext(ctx), nodeID, runID, attempt, offset, data)
}

// appendRunLog is AppendRunLog on db: inside a database transaction, its
// own is a savepoint.
func appendRunLog(db *gorm.DB, nodeID, runID int64, attempt int, offset int64, data []byte) (RunLogState, error) {
	var st RunLogState
	if attempt < 1 {
		return st, &InputError{Status: http.StatusBadRequest, Field: "attempt", Reason: "required: the attempt whose log this is (1 or more)"}
	}
	if offset < 0 {
		return st, &InputError{Status: http.StatusBadRequest, Field: "offset", Reason: "must be 0 or more"}
	}
	if len(data) > MaxLogChunkBytes {
		return st, &InputError{Status: http.StatusRequestEntityTooLarge, Field: "body",
			Reason: fmt.Sprintf("a chunk is at most %d bytes, got %d", MaxLogChunkBytes, len(data))}
	}
	if offset == 0 && len(data) > 0 {
		// The common case, a short run's whole log in one chunk: one
		// statement. Anything else (a log begun already, another node's
		// run, a later attempt) takes the path below, which says why.
		if ok, err := firstLogChunk(db, nodeID, runID, attempt, data); err != nil || ok {
			return RunLogState{Size: int64(len(data)), Stored: int64(len(data))}, err
		}
	}
	run, err := agentRun(db, nodeID, runID)
	if err != nil {
		return st, err
	}
	if attempt > run.Attempt {
		return st, &InputError{Status: http.StatusConflict, Field: "attempt",
			Reason: fmt.Sprintf("run %d is at attempt %d, not %d", runID, run.Attempt, attempt)}
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.OnConflict{DoNothing: true}).
			Create(&runLog{RunID: runID, Attempt: attempt, UpdatedAt: time.Now()}).Error; err != nil {
			return fmt.Errorf("create log of run %d: %w", runID, err)
		}
		var row runLog
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
			Take(&row, "run_id = ? AND attempt = ?", runID, attempt).Error; err != nil {
			return fmt.Errorf("lock log of run %d: %w", runID, err)
		}
		st = RunLogState{Size: row.Size, Stored: row.Stored, Truncated: row.Truncated}
		if offset > row.Size && !row.Truncated {
			return &LogOffsetError{Offset: offset, Expected: row.Size}
		}
		if offset > row.Size {
			// Past the cap nothing is kept: the agent may skip ahead and
			// only say how long the log is.
			st.Size = offset + int64(len(data))
			return tx.Model(&runLog{}).Where("run_id = ? AND attempt = ?", runID, attempt).
				Updates(map[string]any{"size": st.Size, "updated_at": time.Now()}).Error
		}
		skip := row.Size - offset
		if skip >= int64(len(data)) {
			return nil // seen already
		}
		fresh := data[skip:]
		keep := min(int64(len(fresh)), max(MaxRunLogBytes-row.Stored, 0))
		if keep > 0 {
			if err := tx.Create(&runLogChunk{RunID: runID, Attempt: attempt, Pos: row.Stored, Data: fresh[:keep]}).Error; err != nil {
				return fmt.Errorf("store log chunk of run %d: %w", runID, err)
			}
		}
		st.Size += int64(len(fresh))
		st.Stored += keep
		st.Truncated = st.Truncated || keep < int64(len(fresh))
		return tx.Model(&runLog{}).Where("run_id = ? AND attempt = ?", runID, attempt).
			Updates(map[string]any{"size": st.Size, "stored": st.Stored, "truncated": st.Truncated, "updated_at": time.Now()}).Error
	})
	return st, err
}

// RunLog returns the kept bytes of a run attempt's log from byte from on,
// and how much the server has. A log nothing was received for is empty.
func (s *Store) RunLog(ctx context.Context, runID int64, attempt int, from int64) ([]byte, RunLogState, error) {
	var st RunLogState
	var row runLog
	err := s.DB.WithContext(ctx).Take(&row, "run_id = ? AND attempt = ?", runID, attempt).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, st, nil
	}
	if err != nil {
		return nil, st, fmt.Errorf("load log of run %d: %w", runID, err)
	}
	st = RunLogState{Size: row.Size, Stored: row.Stored, Truncated: row.Truncated}
	if from >= row.Stored {
		return nil, st, nil
	}
	var chunks []runLogChunk
	if err := s.DB.WithContext(ctx).
		Where("run_id = ? AND attempt = ? AND pos + length(data) > ?", runID, attempt, from).
		Order("pos").Find(&chunks).Error; err != nil {
		return nil, st, fmt.Errorf("read log of run %d: %w", runID, err)
	}
	out := make([]byte, 0, row.Stored-from)
	for _, c := range chunks {
		d := c.Data
		if c.Pos < from {
			d = d[from-c.Pos:]
		}
		out = append(out, d...)
	}
	return out, st, nil
}

// TransactionRun loads a run of a transaction; a run of another transaction
// is not found.
func (s *Store) TransactionRun(ctx context.Context, txID uuid.UUID, runID int64) (*TaskRun, error) {
	var run TaskRun
	err := s.DB.WithContext(ctx).Take(&run, "id = ? AND transaction_id = ?", runID, txID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("run", fmt.Sprintf("%d of transaction %s", runID, txID))
	}
	if err != nil {
		return nil, fmt.Errorf("load run %d: %w", runID, err)
	}
	return &run, nil
}

// Run loads a run by id.
func (s *Store) Run(ctx context.Context, runID int64) (*TaskRun, error) {
	var run TaskRun
	err := s.DB.WithContext(ctx).Take(&run, runID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("run", runID)
	}
	if err != nil {
		return nil, fmt.Errorf("load run %d: %w", runID, err)
	}
	return &run, nil
}

// LatestNodeRoleRun loads a noderole's latest run; a noderole that never
// ran (or does not exist) is not found.
func (s *Store) LatestNodeRoleRun(ctx context.Context, nodeRoleID int64) (*TaskRun, error) {
	var run TaskRun
	err := s.DB.WithContext(ctx).Where("noderole_id = ?", nodeRoleID).Order("position DESC").Take(&run).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("run of noderole", nodeRoleID)
	}
	if err != nil {
		return nil, fmt.Errorf("load the latest run of noderole %d: %w", nodeRoleID, err)
	}
	return &run, nil
}

// firstLogChunk stores the first chunk of a run attempt's log, and its
// log's row, in one statement, when the run is the node's, the attempt is
// not past the run's, and the log has no row yet; false when it stored
// nothing. The chunk fits under MaxRunLogBytes (MaxLogChunkBytes is
// smaller).
func firstLogChunk(db *gorm.DB, nodeID, runID int64, attempt int, data []byte) (bool, error) {
	var stored []int64
	err := db.Raw(firstChunkSQL+"SELECT run_id FROM chunk",
		map[string]any{"attempt": attempt, "size": len(data), "run": runID, "node": nodeID, "data": data}).Find(&stored).Error
	if err != nil {
		return false, fmt.Errorf("store log of run %d: %w", runID, err)
	}
	return len(stored) == 1, nil
}
