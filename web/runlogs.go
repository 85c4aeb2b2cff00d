package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// logRoutes registers the full task logs: the agents ship them in chunks,
// operators read or follow them.
func (s *Server) logRoutes(admin, mine *echo.Group) {
	mine.POST("/runs/:id/log", s.agentRunLog)
	admin.GET("/transactions/:uuid/runs/:id/log", s.getRunLog)
	admin.GET("/noderoles/:id/log", s.getNodeRoleLog)
}

// logFollowPoll is how often a followed log looks for new bytes.
const logFollowPoll = 250 * time.Millisecond

// agentRunLog stores a chunk of a run's log: the body is the log's bytes
// from ?offset= on, for ?attempt=. A chunk the server has seen is skipped
// (idempotent by offset); one starting past what the server has is a 409
// whose details carry the offset to send from.
func (s *Server) agentRunLog(c echo.Context) error {
	runID, err := runIDParam(c)
	if err != nil {
		return err
	}
	attempt, err := intQuery(c, "attempt", true)
	if err != nil {
		return err
	}
	offset, err := intQuery(c, "offset", true)
	if err != nil {
		return err
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	st, err := s.cfg.Store.AppendRunLog(c.Request().Context(), principal(c).NodeID, runID, int(attempt), offset, body)
	if err != nil {
		return logOffsetConflict(err, "offset")
	}
	return c.JSON(http.StatusOK, protocol.RunLogState{Offset: st.Size, Stored: st.Stored, Truncated: st.Truncated})
}

// logOffsetConflict makes a chunk that starts past what the server has of
// a log (an earlier chunk was lost) a 409 naming field and, in its
// details, the offset to send from; other errors are returned as they are.
func logOffsetConflict(err error, field string) error {
	var oe *models.LogOffsetError
	if errors.As(err, &oe) {
		return &models.InputError{Status: http.StatusConflict, Field: field, Reason: oe.Error(),
			Details: map[string]any{"offset": oe.Expected}}
	}
	return err
}

// intQuery reads a non-negative integer query parameter.
func intQuery(c echo.Context, name string, required bool) (int64, error) {
	v := c.QueryParam(name)
	if v == "" {
		if required {
			return 0, &models.InputError{Status: http.StatusBadRequest, Field: name, Reason: "required"}
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, &models.InputError{Status: http.StatusBadRequest, Field: name, Reason: fmt.Sprintf("%q is not a whole number 0 or more", v)}
	}
	return n, nil
}

// getRunLog answers a transaction's run's log (see writeRunLog).
func (s *Server) getRunLog(c echo.Context) error {
	txID, err := uuidParam(c)
	if err != nil {
		return err
	}
	runID, err := runIDParam(c)
	if err != nil {
		return err
	}
	run, err := s.cfg.Store.TransactionRun(c.Request().Context(), txID, runID)
	if err != nil {
		return err
	}
	return s.writeRunLog(c, run)
}

// getNodeRoleLog answers the log of a noderole's latest run.
func (s *Server) getNodeRoleLog(c echo.Context) error {
	id, err := numericID(c, "noderole")
	if err != nil {
		return err
	}
	if _, err := s.crowbar.NodeRole(c.Request().Context(), id); err != nil {
		return err
	}
	run, err := s.cfg.Store.LatestNodeRoleRun(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return s.writeRunLog(c, run)
}

// writeRunLog answers the log of one attempt of run (?attempt=, default its
// current one) as text/plain: the bytes the agent shipped, then, if the
// log outgrew models.MaxRunLogBytes, a line saying it was cut. With
// ?follow=1 the answer streams new bytes as they arrive until the attempt
// is over (the run ended or moved to a later attempt) or the client goes.
func (s *Server) writeRunLog(c echo.Context, run *models.TaskRun) error {
	ctx := c.Request().Context()
	// A run not dispatched yet will run as attempt 1.
	attempt := int64(max(run.Attempt, 1))
	if c.QueryParam("attempt") != "" {
		a, err := intQuery(c, "attempt", false)
		if err != nil {
			return err
		}
		if a < 1 || a > int64(max(run.Attempt, 1)) {
			return &models.InputError{Status: http.StatusBadRequest, Field: "attempt",
				Reason: fmt.Sprintf("run %d has attempts 1 to %d", run.ID, max(run.Attempt, 1))}
		}
		attempt = a
	}
	follow := false
	switch f := c.QueryParam("follow"); f {
	case "", "0", "false":
	case "1", "true":
		follow = true
	default:
		return &models.InputError{Status: http.StatusBadRequest, Field: "follow", Reason: fmt.Sprintf("%q is not 1, true, 0 or false", f)}
	}
	data, st, err := s.cfg.Store.RunLog(ctx, run.ID, int(attempt), 0)
	if err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/plain; charset=utf-8")
	h.Set("X-Anneal-Run", strconv.FormatInt(run.ID, 10))
	h.Set("X-Anneal-Attempt", strconv.FormatInt(attempt, 10))
	if !follow {
		h.Set("X-Anneal-Log-Size", strconv.FormatInt(st.Size, 10))
		h.Set("X-Anneal-Log-Truncated", strconv.FormatBool(st.Truncated))
		return c.Blob(http.StatusOK, "text/plain; charset=utf-8", append(data, truncationNote(st)...))
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	c.Response().WriteHeader(http.StatusOK)
	pos := int64(len(data))
	if err := writeFlush(c, data); err != nil {
		return nil // the client went away
	}
	for {
		// The agent ships the rest of an attempt's log before reporting
		// its result, so the bytes read after seeing the attempt over are
		// the last.
		over, err := s.attemptOver(ctx, run.ID, attempt)
		if err != nil {
			s.log.Warn("following a run's log: cannot read the run", "run", run.ID, "error", err)
			return nil
		}
		data, st, err := s.cfg.Store.RunLog(ctx, run.ID, int(attempt), pos)
		if err != nil {
			s.log.Warn("following a run's log: cannot read it", "run", run.ID, "error", err)
			return nil
		}
		pos += int64(len(data))
		if err := writeFlush(c, data); err != nil {
			return nil
		}
		if over {
			_ = writeFlush(c, []byte(truncationNote(st)))
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logFollowPoll):
		}
	}
}

// attemptOver reports whether a run's attempt will write no more: the run
// ended, or a later attempt began.
func (s *Server) attemptOver(ctx context.Context, runID, attempt int64) (bool, error) {
	run, err := s.cfg.Store.Run(ctx, runID)
	if err != nil {
		return false, err
	}
	return contract.RunFinal(run.State) || int64(run.Attempt) > attempt, nil
}

func writeFlush(c echo.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	if _, err := c.Response().Write(data); err != nil {
		return err
	}
	c.Response().Flush()
	return nil
}

// truncationNote is the line ending a log the server cut at its cap.
func truncationNote(st models.RunLogState) string {
	if !st.Truncated {
		return ""
	}
	return fmt.Sprintf("\n# anneal: log truncated: the server keeps the first %d bytes of a run's log, this one has %d; "+
		"the whole log is on the node under <workdir>/logs/\n", models.MaxRunLogBytes, st.Size)
}
