package daemon

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// LogShipper is implemented by a Reporter that can send run logs to the API
// (HTTPTransport does): ShipLog sends the log's bytes from offset on and
// returns the API's state, whose Offset is where the next chunk starts
// (the API skips bytes it has already, and says where to resume when a
// chunk starts past its end).
type LogShipper interface {
	ShipLog(ctx context.Context, runID int64, attempt int, offset int64, data []byte) (protocol.RunLogState, error)
}

// LogPather is implemented by an Executor that writes each run's log to a
// file (ShellExecutor does); those logs are shipped to the API.
type LogPather interface {
	LogPath(item protocol.WorkItem) string
}

// LogChunkBytes is the most the agent sends of a log in one request.
const LogChunkBytes = 256 << 10

// logTail ships one run attempt's log file to the API while the run goes
// on, from where the API says it is, so that a restarted agent (or
// server) resumes without sending a byte twice and without a gap.
type logTail struct {
	ship    LogShipper
	log     *slog.Logger
	path    string
	runID   int64
	attempt int
	offset  int64 // next byte to send; the API's word wins
	// truncated: the API keeps no more, so only the log's length is sent.
	truncated bool
	// stopped: the API will take no more of this log (a final refusal).
	stopped bool
	// withResult: the API takes the end of the log with the run's result
	// (protocol.WorkItem.LogWithResult), so follow leaves it to rest.
	withResult bool
}

// logShipper returns the tail of a run's log, or nil when the executor
// writes no log file or the reporter cannot ship one.
func (a *agent) logShipper(log *slog.Logger, item protocol.WorkItem) *logTail {
	ship, ok := a.rep.(LogShipper)
	if !ok {
		return nil
	}
	lp, ok := a.exec.(LogPather)
	if !ok || item.Type == protocol.TypeReboot {
		return nil
	}
	return &logTail{ship: ship, log: log, path: lp.LogPath(item), runID: item.RunID, attempt: item.Attempt,
		withResult: item.LogWithResult}
}

// follow ships the log every period until done is closed, then ships the
// rest (retrying until the API took it, refused it for good, or ctx ends),
// so that the whole log is on the server before the result is reported,
// unless the result is to carry the rest (withResult: see rest).
func (l *logTail) follow(ctx context.Context, a *agent, every time.Duration, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			if !l.withResult {
				l.drain(ctx, a)
			}
			return
		case <-t.C:
		}
		l.shipNew(ctx)
	}
}

// shipNew sends what the log has gained while the run goes on; a failed send
// waits for the next period.
func (l *logTail) shipNew(ctx context.Context) {
	if err := l.sendAvailable(ctx); err != nil && ctx.Err() == nil {
		l.log.Debug("shipping the run's log failed; trying again", "error", err)
	}
}

// drain ships what is left of the log, retrying with backoff.
func (l *logTail) drain(ctx context.Context, a *agent) {
	if l == nil {
		return
	}
	err := a.retry(ctx, "shipping the run's log", l.sendAvailable)
	switch {
	case err == nil, ctx.Err() != nil:
	case statusOf(err) == http.StatusNotFound && !isAPIError(err, "not_found"):
		l.log.Debug("the API takes no logs (an older server); the log stays on the node (for LogRetention)", "path", l.path)
	default:
		l.log.Warn("the API refused the run's log; it stays on the node (for LogRetention)", "path", l.path, "error", apiMessage(err))
	}
}

// rest returns the end of the log for the run's result to carry, once the
// command has ended and follow has returned, when the API takes it there
// (withResult) and it is short (protocol.MaxLogWithResult): one request
// fewer per run. A longer rest, or one of a log the API keeps no more of,
// is shipped in log requests now (drain), and nil is returned.
func (l *logTail) rest(ctx context.Context, a *agent) *protocol.RunLogTail {
	if l == nil || !l.withResult {
		return nil
	}
	if !l.stopped && !l.truncated {
		data, err := readLogFrom(l.path, l.offset, protocol.MaxLogWithResult+1)
		switch {
		case err == nil && len(data) == 0:
			return nil
		case err == nil && len(data) <= protocol.MaxLogWithResult:
			return &protocol.RunLogTail{Offset: l.offset, Data: data}
		case err != nil:
			l.log.Debug("reading the end of the run's log failed; shipping it on its own", "error", err)
		}
	}
	l.drain(ctx, a)
	return nil
}

// readLogFrom reads up to n bytes of the file at path from offset on; a
// missing file is an empty log.
func readLogFrom(path string, offset int64, n int) ([]byte, error) {
	f, err := openFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// As much as there is, not n bytes allocated each time: a short
	// run's log is a few hundred bytes, and this runs for every run.
	return io.ReadAll(io.NewSectionReader(f, offset, int64(n)))
}

func isAPIError(err error, code string) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Code == code
}

// sendAvailable sends the log from l.offset to its current end, in chunks.
// A missing file is an empty log (the run has not opened it yet).
func (l *logTail) sendAvailable(ctx context.Context) error {
	if l.stopped {
		return nil
	}
	f, err := openFile(l.path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, LogChunkBytes)
	for !l.truncated {
		n, err := f.ReadAt(buf, l.offset)
		if n > 0 {
			from := l.offset
			if serr := l.send(ctx, from, buf[:n]); serr != nil {
				return serr
			}
			if l.stopped {
				return nil
			}
			if l.offset == from {
				return errors.New("the API took none of the chunk")
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	// The API keeps no more: only say how long the log is, if it grew.
	fi, err := f.Stat()
	if err != nil || fi.Size() <= l.offset {
		return err
	}
	return l.send(ctx, fi.Size(), nil)
}

// send ships one chunk and moves to where the API says the next starts.
func (l *logTail) send(ctx context.Context, offset int64, data []byte) error {
	st, err := l.ship.ShipLog(ctx, l.runID, l.attempt, offset, data)
	if err != nil {
		var apiErr *APIError
		if errors.As(err, &apiErr) && !apiErr.Retryable() && apiErr.Status != http.StatusUnauthorized {
			// A final refusal (the run is unknown, another node's, an
			// older API without the route): the log stays on the node.
			l.stopped = true
		}
		return err
	}
	l.offset, l.truncated = st.Offset, st.Truncated
	return nil
}
