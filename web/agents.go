package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// agentRegister is the phone home: it creates the node and returns the
// agent's own credential.
func (s *Server) agentRegister(c echo.Context) error {
	var req protocol.RegisterRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	node, token, enrolled, err := s.cfg.Store.EnrollNodeThen(c.Request().Context(), models.NodeInput{
		Name: req.Name, Admin: req.Admin, BootID: req.BootID, Address: req.Address,
	}, true, s.startBootstrap(c.Request().Context()))
	if err != nil {
		return err
	}
	if enrolled {
		// A node created through the API (or for a deployable's
		// instance) now has its agent: it is alive, and its noderoles
		// may run.
		s.log.Info("node enrolled by its agent", "node", node.Name, "node_id", node.ID)
		s.kickAnnealer(c.Request().Context(), "node "+node.Name+" is alive")
	} else {
		s.log.Info("node registered", "node", node.Name, "node_id", node.ID, "admin", node.Admin)
	}
	return c.JSON(http.StatusCreated, protocol.RegisterResponse{NodeID: node.ID, Name: node.Name, Token: token})
}

func (s *Server) agentHeartbeat(c echo.Context) error {
	var req protocol.HeartbeatRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	nodeID := principal(c).NodeID
	name, revived, err := s.heartbeats.record(c.Request().Context(), models.NodeTouch{NodeID: nodeID, BootID: req.BootID, Address: req.Address})
	if err != nil {
		return err
	}
	if revived {
		s.log.Info("node is alive again", "node", name)
		s.kickAnnealer(c.Request().Context(), "node "+name+" is alive")
	}
	return c.JSON(http.StatusOK, protocol.HeartbeatResponse{NodeID: nodeID, Name: name, EverySec: s.nodeHeartbeatEverySec()})
}

// minNodeSilence is the shortest silence after which a node counts as not
// alive, whatever the heartbeat timeout (tests set it to a few seconds).
const minNodeSilence = 30 * time.Second

// NodeSilence is how long an agent may go without a node heartbeat before
// its node counts as not alive: the heartbeat timeout (60 s by default),
// and at least minNodeSilence. Agents heartbeat every third of it
// (nodeHeartbeatEverySec).
func NodeSilence(heartbeatTimeoutSec int) time.Duration {
	return max(minNodeSilence, contract.HeartbeatTimeout(heartbeatTimeoutSec))
}

// nodeHeartbeatEverySec is the node heartbeat period the API asks agents
// for: a third of NodeSilence (20 s by default), so that two heartbeats
// may be lost before a node counts as not alive. Each is a write: a
// thousand nodes at 10 s were a hundred a second, a large part of what an
// idle site cost.
func (s *Server) nodeHeartbeatEverySec() int {
	return max(1, int(NodeSilence(s.cfg.HeartbeatTimeoutSec)/3/time.Second))
}

// Long-poll bounds for GET /agent/work.
const (
	defaultPollWait = 25 * time.Second
	maxPollWait     = 60 * time.Second
)

// pollWait reads ?wait= of a long poll (default 25s, at most 60s).
func pollWait(c echo.Context) (time.Duration, error) {
	wait := defaultPollWait
	if w := c.QueryParam("wait"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d < 0 {
			return 0, &models.InputError{Status: http.StatusBadRequest, Field: "wait", Reason: fmt.Sprintf("%q is not a duration like 25s", w)}
		}
		wait = min(d, maxPollWait)
	}
	return wait, nil
}

// longPoll calls ready until it reports true, for up to wait: again each
// time Postgres announces a change of this kind for the node (the hub's
// NOTIFY). It returns whether ready answered before the wait ran out.
func (s *Server) longPoll(ctx context.Context, kind string, nodeID int64, wait time.Duration, ready func(context.Context) (bool, error)) (bool, error) {
	return s.longPollUntil(ctx, kind, nodeID, wait, func(ctx context.Context) (bool, time.Time, error) {
		ok, err := ready(ctx)
		return ok, time.Time{}, err
	})
}

// longPollUntil is longPoll whose ready also says when to look again even
// without a notification (zero: no such time), e.g. when a lease runs out.
// Nothing else makes it look again: every dispatch notifies, and so does
// every change of a node's software deployments (migration 0029), and a
// lost listener wakes every waiter.
func (s *Server) longPollUntil(ctx context.Context, kind string, nodeID int64, wait time.Duration, ready func(context.Context) (bool, time.Time, error)) (bool, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		woken, cancel := s.hub.wait(kind, nodeID)
		ok, wakeAt, err := ready(ctx)
		if err != nil || ok || wait == 0 {
			cancel()
			return ok, err
		}
		var at <-chan time.Time // nil: no time to look again at
		var timer *time.Timer
		if !wakeAt.IsZero() {
			// A little after the time, so that the database sees it passed.
			timer = time.NewTimer(max(time.Until(wakeAt)+10*time.Millisecond, 10*time.Millisecond))
			at = timer.C
		}
		expired := false
		select {
		case <-woken:
		case <-at:
		case <-deadline.C:
			expired = true
		case <-ctx.Done():
		}
		cancel()
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if expired {
			return false, nil
		}
	}
}

// agentWork hands the agent the runs dispatched to its node, waiting up to
// ?wait= for some to arrive; a NOTIFY from the dispatching activity wakes it.
// A run it hands out is offered again after the ack lease unless the agent
// acknowledges it (agentRunAck, or its first run heartbeat or result).
//
// An agent that polls with protocol.WorkAheadParam is spared the ack: the
// runs are claimed as acknowledged (confirmed by their first run heartbeat
// or result, offered again after the lease until then), and the answer
// does what the ack would: it heartbeats each run's activity and hands the
// first run's chain's next runs ahead.
func (s *Server) agentWork(c echo.Context) error {
	nodeID := principal(c).NodeID
	wait, err := pollWait(c)
	if err != nil {
		return err
	}
	asAcked, err := pollAhead(c)
	if err != nil {
		return err
	}
	var runs []models.TaskRun
	_, err = s.longPollUntil(c.Request().Context(), models.WakeWork, nodeID, wait, func(ctx context.Context) (bool, time.Time, error) {
		// A run handed out but not acknowledged is offered again when its
		// lease runs out (next); no notification announces that.
		var next time.Time
		var err error
		runs, next, err = s.cfg.Store.ClaimWorkOrNextOffer(ctx, nodeID, s.ackLease(), asAcked)
		return len(runs) > 0, next, err
	})
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	resp, err := s.workResponse(ctx, runs)
	if err != nil {
		return err
	}
	if asAcked {
		if err := s.acceptedWithPoll(ctx, nodeID, runs, &resp); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, resp)
}

// pollAhead reads ?ahead= of a poll (protocol.WorkAheadParam).
func pollAhead(c echo.Context) (bool, error) {
	v := c.QueryParam(protocol.WorkAheadParam)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &models.InputError{Status: http.StatusBadRequest, Field: protocol.WorkAheadParam, Reason: fmt.Sprintf("%q is not a boolean like 1", v)}
	}
	return b, nil
}

// acceptedWithPoll does for the runs a poll claimed as acknowledged what
// agentRunAck does for a run: it heartbeats the activity of each that has
// its own (naming its task), and hands the chain's next runs ahead with
// the answer's first run. A run whose activity is gone goes out marked
// not acknowledged, so that the agent's ack hears it and does not start
// it.
func (s *Server) acceptedWithPoll(ctx context.Context, nodeID int64, runs []models.TaskRun, resp *protocol.WorkResponse) error {
	byID := make(map[int64]*models.TaskRun, len(runs))
	for i := range runs {
		byID[runs[i].ID] = &runs[i]
	}
	for i := range resp.Runs {
		item := &resp.Runs[i]
		run := byID[item.RunID]
		if run == nil || !item.Acknowledged || !ownActivity(run) {
			continue
		}
		cancel, err := s.activityHeartbeat(ctx, run)
		if err != nil {
			// The claim is stored; the run heartbeats will follow.
			s.log.Warn("run handed out but its activity heartbeat failed", "run", run.ID, "error", err)
		}
		item.Acknowledged = !cancel
	}
	if len(resp.Runs) == 0 || !resp.Runs[0].Acknowledged {
		return nil
	}
	first := byID[resp.Runs[0].RunID]
	var err error
	resp.Ahead, resp.AheadMs, err = s.handAhead(ctx, nodeID, first, first.Attempt)
	return err
}

// handAhead hands the runs of run's chain after it (run acknowledged at
// attempt by nodeID's agent) ahead to that agent, when run heads a chain
// that goes on (models.Store.HandAhead): their work items, and the window
// they may start in (milliseconds; 0 when none goes).
func (s *Server) handAhead(ctx context.Context, nodeID int64, run *models.TaskRun, attempt int) ([]protocol.WorkItem, int, error) {
	if run.ChainHead == nil || run.ChainNext == nil {
		return nil, 0, nil
	}
	ahead, err := s.cfg.Store.HandAhead(ctx, nodeID, run.ID, attempt, s.ackLease(), aheadAfter, models.MaxAheadRuns)
	if err != nil {
		return nil, 0, err
	}
	items, err := s.aheadItems(ctx, ahead)
	if err != nil || len(items) == 0 {
		return items, 0, err
	}
	return items, int(aheadWindow / time.Millisecond), nil
}

// ownActivity says whether a run has its own activity to heartbeat: it
// is in no chain or heads it. A chain's later runs are heartbeated with
// its activity by heartbeatChain, as often as it needs (each heartbeat is
// a write on the Temporal server; the agent's run heartbeats cover a long
// run).
func ownActivity(run *models.TaskRun) bool {
	return run.ChainHead == nil || *run.ChainHead == run.ID
}

// workResponse hands out claimed runs with the outputs of the runs they
// depend on in their environment, and the secrets they reference
// decrypted: here, for this node's runs only, and nowhere else. A run
// whose secrets cannot be had (deleted since the execute, no key) fails,
// naming them, rather than running without.
func (s *Server) workResponse(ctx context.Context, runs []models.TaskRun) (protocol.WorkResponse, error) {
	out := protocol.WorkResponse{Runs: make([]protocol.WorkItem, 0, len(runs))}
	for _, r := range runs {
		item, err := s.workItem(ctx, r)
		if err != nil {
			var se *runSecretsError
			if errors.As(err, &se) {
				s.failUndeliverable(ctx, &r, se.Error())
				continue
			}
			return out, err
		}
		out.Runs = append(out.Runs, item)
	}
	return out, nil
}

// runSecretsError means a run's secrets could not be resolved.
type runSecretsError struct{ reason string }

func (e *runSecretsError) Error() string { return e.reason }

// failUndeliverable fails a claimed run that cannot be handed out, and
// completes its activity so that the workflow moves on.
func (s *Server) failUndeliverable(ctx context.Context, r *models.TaskRun, reason string) {
	log := s.log.With("run", r.ID, "node", r.NodeName, "task", r.TaskName)
	if err := s.cfg.Store.FailRun(ctx, r.ID, reason, nil); err != nil {
		log.Warn("could not fail an undeliverable run", "error", err)
		return
	}
	msg := fmt.Sprintf("task %s failed on %s: %s", r.TaskName, r.NodeName, reason)
	if err := s.completeActivity(ctx, r, false, -1, msg); err != nil {
		log.Warn("could not complete an undeliverable run's activity", "error", err)
	}
	log.Warn("run not handed out", "reason", reason)
}

// wantsPeers says whether a run is given $ANNEAL_PEERS: the runs of the
// verification graph and any command that names it. The list holds every
// other node of the deployment, too much to read and send with every run of
// a thousand-node deployment.
func wantsPeers(r *models.TaskRun) bool {
	return r.GraphType == fuel.GraphVerification || strings.Contains(r.Spec.Cmd, "ANNEAL_PEERS")
}

// workItem is one claimed run as its agent receives it.
func (s *Server) workItem(ctx context.Context, r models.TaskRun) (protocol.WorkItem, error) {
	peers := wantsPeers(&r)
	rc := r.Context // read by the dispatch that claimed it, if that was just now
	if rc == nil || peers {
		var err error
		if rc, err = s.cfg.Store.RunContextWith(ctx, &r, peers); err != nil {
			return protocol.WorkItem{}, err
		}
	}
	env := outputEnv(rc.Outputs, r.NodeName)
	if env == nil {
		env = map[string]string{}
	}
	if peers {
		// The verification graph checks that each peer answers there.
		env["ANNEAL_PEERS"] = strings.Join(rc.Peers, " ")
	}
	item := protocol.WorkItem{
		RunID: r.ID, Attempt: r.Attempt, TransactionID: r.TransactionID.String(), Graph: r.GraphType,
		// Special tasks the agent runs were turned into shell at
		// planning, but for reboot.
		Task: r.TaskName, Type: agentType(r.TaskType), Command: r.Spec.Cmd, TimeoutSec: r.Spec.TimeoutSec,
		Env: env, LogWithResult: true, Acknowledged: r.AckedAt != nil,
	}
	// Secrets: the task's environment variables, and the references in
	// a noderole's attributes.
	names := models.SecretRefsIn(any(r.AttrsIn))
	for _, name := range r.Spec.Secrets {
		names = append(names, name)
	}
	vals, err := s.cfg.Store.NodeSecrets(ctx, r.NodeID, names)
	var unavailable *models.SecretsUnavailableError
	switch {
	case errors.As(err, &unavailable):
		return item, &runSecretsError{reason: "its secrets could not be resolved: " + err.Error()}
	case err != nil:
		return item, err // the database: the run stays handed out, offered again
	}
	for env, name := range r.Spec.Secrets {
		item.Env[env] = vals[name]
	}
	for _, v := range vals {
		item.Redact = append(item.Redact, v)
	}
	sort.Strings(item.Redact)
	// One model for both styles: a noderole's run and a graph task both
	// see their merged data as $ANNEAL_ATTRS (a graph task's is its node's,
	// fixed when it was planned: models.NodeInputs), secrets resolved.
	if r.AttrsIn != nil || r.NodeRoleID != nil {
		raw, err := json.Marshal(models.ResolveSecretRefs(any(r.AttrsIn), vals))
		if err != nil {
			return item, fmt.Errorf("encode attributes of run %d: %w", r.ID, err)
		}
		item.Attrs = raw
	}
	if r.NodeRoleID != nil {
		// The annealer's run of a noderole: no transaction, no outputs.
		item.TransactionID, item.NodeRoleID = "", *r.NodeRoleID
		env["ANNEAL_NODEROLE"] = strconv.FormatInt(*r.NodeRoleID, 10)
	}
	return item, nil
}

// maxContextBytes bounds ANNEAL_CONTEXT, which travels in the environment.
const maxContextBytes = 64 << 10

// outputEnv makes the outputs of a transaction's finished runs visible to a
// task: ANNEAL_OUT_<TASK>_<KEY> for the runs of its own node, and
// ANNEAL_CONTEXT, a JSON object {"task@node": {"key": "value"}} of all.
func outputEnv(outputs []models.RunOutputs, node string) map[string]string {
	if len(outputs) == 0 {
		return nil
	}
	env := map[string]string{}
	all := map[string]map[string]string{}
	for _, o := range outputs {
		all[o.TaskName+"@"+o.NodeName] = o.Outputs
		if o.NodeName != node {
			continue
		}
		for k, v := range o.Outputs {
			env["ANNEAL_OUT_"+envName(o.TaskName)+"_"+envName(k)] = v
		}
	}
	if raw, err := json.Marshal(all); err == nil && len(raw) <= maxContextBytes {
		env["ANNEAL_CONTEXT"] = string(raw)
	} else {
		env["ANNEAL_CONTEXT_TRUNCATED"] = "1"
	}
	return env
}

// envName turns a task or output name into an environment variable part.
func envName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, s)
}

func runIDParam(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil {
		return 0, &models.InputError{Status: http.StatusBadRequest, Field: "id", Reason: fmt.Sprintf("%q is not a run id", c.Param("id"))}
	}
	return id, nil
}

// ackLease is how long a run handed to an agent waits for its
// acknowledgement before it is offered again.
func (s *Server) ackLease() time.Duration {
	if s.cfg.AckLease > 0 {
		return s.cfg.AckLease
	}
	return models.DefaultAckLease
}

// agentRunAck is the agent taking delivery of a run: it is about to record
// the run started and execute it, so the run is not offered again.
// It also counts as the run's first heartbeat. A repeated ack is harmless;
// another attempt, or a run that is no longer running, is a 409 and the
// agent must not execute it.
func (s *Server) agentRunAck(c echo.Context) error {
	runID, err := runIDParam(c)
	if err != nil {
		return err
	}
	var req protocol.RunAck
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	if req.Attempt == 0 {
		return &models.InputError{Status: http.StatusBadRequest, Field: "attempt", Reason: "required: the attempt handed out with the run"}
	}
	ctx := c.Request().Context()
	run, err := s.cfg.Store.AckRun(ctx, principal(c).NodeID, runID, req.Attempt)
	if err != nil {
		return err
	}
	if run.State != contract.RunRunning {
		return apiError(http.StatusConflict, "run_not_running", fmt.Sprintf("run %d is %s, not running: do not execute it", runID, run.State))
	}
	var answer protocol.RunAckResponse
	if ownActivity(run) {
		if answer.Cancel, err = s.activityHeartbeat(ctx, run); err != nil {
			// The acknowledgement is stored; the run heartbeats will follow.
			s.log.Warn("run acknowledged but its activity heartbeat failed", "run", runID, "error", err)
		}
	}
	if req.Ahead && !answer.Cancel {
		// The chain's next runs go ahead with the acknowledgement: no
		// report of this run alone to get them.
		if answer.Runs, answer.AheadMs, err = s.handAhead(ctx, principal(c).NodeID, run, req.Attempt); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, answer)
}

// activityHeartbeat records a heartbeat of a run's activity, its details
// naming the task running now (a chain's activity runs several). cancel
// is true when the activity no longer exists (the workflow stopped
// awaiting it).
func (s *Server) activityHeartbeat(ctx context.Context, run *models.TaskRun) (cancel bool, err error) {
	err = s.cfg.Temporal.RecordActivityHeartbeat(ctx, run.TaskToken, runningDetails(run))
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return true, nil
	case err != nil && !temporal.IsCanceledError(err):
		// Cancellation is requested when the transaction stops; a running
		// task is allowed to finish, so only other errors count.
		return false, err
	}
	return false, nil
}

// agentRunHeartbeat keeps a run's activity alive while the agent works on
// it, and acknowledges the run if the agent had not. A run no longer
// awaited tells the agent to give up; a heartbeat naming another attempt
// than the run's current one is a 409 (the agent abandons that run).
func (s *Server) agentRunHeartbeat(c echo.Context) error {
	runID, err := runIDParam(c)
	if err != nil {
		return err
	}
	// The body is optional: older agents send {} or nothing.
	var req protocol.RunHeartbeatRequest
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "cannot read the body: " + err.Error()}
	}
	if len(bytes.TrimSpace(body)) > 0 {
		c.Request().Body = io.NopCloser(bytes.NewReader(body))
		if err := bindStrict(c, &req); err != nil {
			return err
		}
	}
	ctx := c.Request().Context()
	run, err := s.cfg.Store.AckRun(ctx, principal(c).NodeID, runID, req.Attempt)
	if err != nil {
		return err
	}
	if run.State != contract.RunRunning {
		return c.JSON(http.StatusOK, protocol.RunHeartbeatResponse{Cancel: true})
	}
	cancel, err := s.activityHeartbeat(ctx, run)
	if err != nil {
		return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "could not record the heartbeat: "+err.Error())
	}
	return c.JSON(http.StatusOK, protocol.RunHeartbeatResponse{Cancel: cancel})
}

// agentRunResult stores an agent's report and completes the run's activity.
func (s *Server) agentRunResult(c echo.Context) error {
	runID, err := runIDParam(c)
	if err != nil {
		return err
	}
	var res protocol.RunResult
	if err := bindRunResult(c, &res); err != nil {
		return err
	}
	if err := checkResultLog(res, ""); err != nil {
		return err
	}
	rec, err := s.cfg.Store.ReportRun(c.Request().Context(), principal(c).NodeID, runID, res, s.ackLease())
	if err != nil {
		// A gap in the log (409 log.offset): the agent ships the log in
		// log requests, from the offset named, then reports again
		// without it.
		return logOffsetConflict(err, "log.offset")
	}
	return s.answerReport(c, &models.BatchReport{ReportedRun: *rec}, res)
}

// aheadWindow is how long after an answer a run handed ahead may still
// start (protocol.RunResultResponse.AheadMs): the most a stop waits for
// runs to start after it.
const aheadWindow = 500 * time.Millisecond

// aheadAfter is the longest a reported run (or, at an ack, the node's last
// run in the graph) may have taken for its chain's next runs to be handed
// ahead: a chain of longer runs goes on one run per report, as its runs
// would seldom start within aheadWindow, and each run handed ahead and
// released is two writes for nothing.
const aheadAfter = 100 * time.Millisecond

// agentRunResults stores a batch of an agent's reports (protocol.
// RunResults: a chain's runs it ran one after the other, and the runs
// handed ahead it released) and answers as agentRunResult does for the
// last, handing the chain's next runs ahead when the last run was short.
func (s *Server) agentRunResults(c echo.Context) error {
	var batch protocol.RunResults
	body, err := readBody(c)
	if err != nil {
		return err
	}
	if err := decodeStrict(body, &batch, true, true); err != nil {
		return err
	}
	seen := map[int64]bool{}
	for i, r := range batch.Results {
		if r.RunID <= 0 {
			return &models.InputError{Status: http.StatusBadRequest, Field: fmt.Sprintf("results[%d].run_id", i), Reason: "must be a run's id"}
		}
		if seen[r.RunID] {
			return &models.InputError{Status: http.StatusBadRequest, Field: fmt.Sprintf("results[%d].run_id", i), Reason: fmt.Sprintf("run %d is reported twice", r.RunID)}
		}
		seen[r.RunID] = true
		if err := checkResultLog(r.RunResult, fmt.Sprintf("results[%d].", i)); err != nil {
			return err
		}
	}
	for i, r := range batch.Released {
		if seen[r.RunID] {
			return &models.InputError{Status: http.StatusBadRequest, Field: fmt.Sprintf("released[%d].run_id", i), Reason: fmt.Sprintf("run %d is reported and released", r.RunID)}
		}
	}
	ahead := 1
	if n := len(batch.Results); n > 0 {
		if last := batch.Results[n-1]; last.FinishedAt.Sub(last.StartedAt) < aheadAfter {
			ahead = models.MaxAheadRuns
		}
	}
	rec, err := s.cfg.Store.ReportRuns(c.Request().Context(), principal(c).NodeID, batch, s.ackLease(), ahead)
	if err != nil {
		return logOffsetConflict(err, "log.offset")
	}
	if len(batch.Results) == 0 {
		return c.JSON(http.StatusOK, protocol.RunResultResponse{}) // runs released, nothing else
	}
	return s.answerReport(c, rec, batch.Results[len(batch.Results)-1].RunResult)
}

// answerReport answers a report whose last result (res) the store took
// (rec): with the chain's next run and those handed ahead when it goes on,
// else completing the activity the run was dispatched under.
func (s *Server) answerReport(c echo.Context, rec *models.BatchReport, res protocol.RunResult) error {
	ctx := c.Request().Context()
	run := rec.Run
	// Made only for a line that is written: a run of a chain that goes on
	// is logged at debug level (the run's state is in the API and its
	// events; at a thousand nodes that was hundreds of lines a second).
	log := func() *slog.Logger {
		return s.log.With("transaction", run.TransactionID, "node", run.NodeName, "task", run.TaskName, "run", run.ID, "attempt", run.Attempt)
	}
	next, fresh, err := s.heartbeatChain(ctx, run, rec.Next, rec.Fresh)
	if next == nil || !fresh {
		// The chain ends here after all (its activity cancelled or
		// gone): the runs handed ahead go back with the next one.
		if terr := s.takeBack(ctx, rec.Ahead); terr != nil {
			return terr
		}
		rec.Ahead = nil
	}
	var notFound *serviceerror.NotFound
	switch {
	case err != nil && !errors.As(err, &notFound):
		return err
	case next != nil:
		if s.log.Enabled(ctx, slog.LevelDebug) {
			log().Debug("run reported; its chain goes on", "state", run.State, "exit_code", res.ExitCode, "changed", rec.Changed, "next_run", next.ID, "next_task", next.TaskName, "ahead", len(rec.Ahead))
		}
		answer := protocol.RunResultResponse{RunID: run.ID, State: run.State, NextRunID: next.ID}
		if fresh {
			// The next run goes back with the answer, taken by this
			// agent: no wake-up and poll of its own, and no ack.
			work, err := s.workResponse(ctx, []models.TaskRun{*next})
			if err != nil {
				return err
			}
			answer.Runs = work.Runs
			if len(answer.Runs) == 1 && len(rec.Ahead) > 0 {
				ahead, err := s.aheadItems(ctx, rec.Ahead)
				if err != nil {
					return err
				}
				answer.Runs = append(answer.Runs, ahead...)
				answer.AheadMs = int(aheadWindow / time.Millisecond)
			} else if err := s.takeBack(ctx, rec.Ahead); err != nil {
				return err // the next run was not handed out: nor are those after it
			}
		} else if item, err := s.workItem(ctx, *next); err == nil {
			// Handed back again: the first answer may have been lost.
			answer.Runs = []protocol.WorkItem{item}
		} else {
			// The agent may have it from the first answer: it is not
			// failed here, and a poll offers it again if not.
			log().Warn("the chain's next run not handed back again", "next_run", next.ID, "error", err)
		}
		return c.JSON(http.StatusOK, answer)
	}
	msg := fmt.Sprintf("task %s failed on %s with exit code %d", run.TaskName, run.NodeName, res.ExitCode)
	if run.Error != "" {
		// The stored error, redacted of the deployment's secrets.
		msg = fmt.Sprintf("task %s failed on %s: %s", run.TaskName, run.NodeName, run.Error)
	}
	if err == nil {
		err = s.completeActivity(ctx, run, run.State == contract.RunSucceeded, res.ExitCode, msg)
	}
	switch {
	case errors.As(err, &notFound) && rec.Changed && run.ChainHead != nil:
		// A chain's activity ended without this report: the workflow ends
		// the chain in Postgres (EndLostChain) and reads its runs' states
		// there, so the stored result stands; had the workflow been first,
		// the run would have failed and this report been refused above.
		log().Warn("result stored after its chain's activity ended; the workflow reads it from the database")
	case errors.As(err, &notFound) && rec.Changed:
		// The activity timed out before the report came: the workflow has
		// already moved on, so the run counts as failed.
		reason := "the agent's result arrived after the run had stopped being awaited (heartbeat or start-to-close timeout)"
		if ferr := s.cfg.Store.RejectLateResult(ctx, run.ID, run.Attempt, reason); ferr != nil {
			return ferr
		}
		log().Warn("late result refused", "reason", reason)
		return apiError(http.StatusConflict, "run_not_awaited", reason)
	case errors.As(err, &notFound):
		// A repeated report whose first delivery completed the activity.
	case err != nil:
		return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "result stored but the workflow could not be told; send it again: "+err.Error())
	}
	log().Info("run reported", "state", run.State, "exit_code", res.ExitCode, "changed", rec.Changed)
	return c.JSON(http.StatusOK, protocol.RunResultResponse{RunID: run.ID, State: run.State})
}

// aheadItems are the work items of runs handed ahead, in order. A run
// whose secrets cannot be had ends the list there: it and the runs after
// it are taken back (the runs after a run must not start without it),
// to be handed out one by one later, where such a run fails alone.
func (s *Server) aheadItems(ctx context.Context, runs []models.TaskRun) ([]protocol.WorkItem, error) {
	items := make([]protocol.WorkItem, 0, len(runs))
	for i, r := range runs {
		item, err := s.workItem(ctx, r)
		var se *runSecretsError
		switch {
		case errors.As(err, &se):
			return items, s.takeBack(ctx, runs[i:])
		case err != nil:
			return nil, err
		}
		items = append(items, item)
	}
	return items, nil
}

// takeBack returns runs handed ahead whose answer does not go out to
// pending (models.Store.TakeBackHandBacks).
func (s *Server) takeBack(ctx context.Context, runs []models.TaskRun) error {
	_, err := s.cfg.Store.TakeBackHandBacks(ctx, runs)
	return err
}

// checkResultLog checks the end of a run's log that its report carries
// (protocol.RunResult.Log, asked for by WorkItem.LogWithResult): a bad
// chunk is a 400 naming its field. The store keeps it before the result
// (models.Store.ReportRun), so that a reader following the log has all of
// it once the run has ended.
func checkResultLog(res protocol.RunResult, field string) error {
	if res.Log == nil {
		return nil
	}
	var fe *protocol.FieldError
	if err := res.Log.Validate(); errors.As(err, &fe) {
		return &models.InputError{Status: http.StatusBadRequest, Field: field + fe.Field, Reason: fe.Reason}
	}
	return nil
}

// heartbeatChain goes on with the chain of a run whose report dispatched
// the chain's next run (next, fresh: as models.Store.ReportRun returned
// them): when a heartbeat is due (chainBeats: one every third of the
// heartbeat timeout), it heartbeats the chain's activity naming it, so that
// the Web UI shows a task of the chain that runs now and the answer says
// whether the chain is still awaited. A chain whose activity was cancelled
// (the transaction is stopping; the workflow normally cuts the chain
// first) ends here: the dispatch is taken back unless an agent has
// already taken the run, which then finishes and ends the chain when it
// is reported. One whose activity is gone (a *serviceerror.NotFound) takes
// the dispatch back too: this result came too late. It returns the run
// the chain goes on with, to go back in the answer (fresh: dispatched
// now; see models.Store.ReportRun), or nil when the activity is to be
// completed now.
func (s *Server) heartbeatChain(ctx context.Context, run, next *models.TaskRun, fresh bool) (*models.TaskRun, bool, error) {
	if next == nil || !s.beats.due(*run.ChainHead, time.Now()) {
		return next, fresh, nil
	}
	err := s.cfg.Temporal.RecordActivityHeartbeat(ctx, run.TaskToken, runningDetails(next))
	var notFound *serviceerror.NotFound
	gone := errors.As(err, &notFound)
	switch {
	case gone || temporal.IsCanceledError(err):
		taken := false
		if fresh {
			var terr error
			if taken, terr = s.cfg.Store.TakeBackHandBack(ctx, next); terr != nil {
				return nil, false, terr
			}
		}
		switch {
		case gone:
			return nil, false, err // a late result
		case !taken:
			// An agent has it (handed back or offered again since, or
			// confirmed): it finishes, then the chain ends.
			return next, false, nil
		}
		return nil, false, nil
	case err != nil:
		// Temporal is out of reach: the run is dispatched all the same,
		// and its agent's heartbeats keep the activity alive.
		s.log.Warn("chain continued but its activity heartbeat failed", "run", next.ID, "error", err)
	}
	return next, fresh, nil
}

// runningDetails are the heartbeat details of a run's activity while the
// run executes: the Web UI shows them, naming the task of a chain that
// runs now.
func runningDetails(run *models.TaskRun) string {
	return fmt.Sprintf("running %s (run %d, attempt %d)", run.TaskName, run.ID, run.Attempt)
}

// completeActivity completes the activity a run was dispatched under: its
// chain's (RunChainOnNode) with the states of the chain's runs, or its own
// (RunTaskOnNode) with its outcome.
func (s *Server) completeActivity(ctx context.Context, run *models.TaskRun, succeeded bool, exitCode int, msg string) error {
	if run.ChainHead == nil {
		return contract.CompleteRunOnNode(ctx, s.cfg.Temporal, run.TaskToken, succeeded, exitCode, msg)
	}
	s.beats.forget(*run.ChainHead)
	states, err := s.cfg.Store.EndChain(ctx, *run.ChainHead)
	if err != nil {
		return err
	}
	return contract.CompleteChainOnNode(ctx, s.cfg.Temporal, run.TaskToken, states)
}

// bindRunResult reads an agent's report strictly (a bad timestamp is a 400
// naming its field); NUL characters in its output are let through, as the
// store strips them, and ranges are checked by the store.
func bindRunResult(c echo.Context, res *protocol.RunResult) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	return decodeStrict(body, res, true, true)
}

// workHub wakes long polls of one node when Postgres announces work for it:
// the runs dispatched to it or its software deployments, apart, so that a
// dispatch does not also wake the node's software poll.
type workHub struct {
	log *slog.Logger
	// events, when set, receives the live event stream's notifications,
	// read on the same LISTEN connection.
	events *eventHub
	// credentials, when set, is told of each credential that stopped
	// working (its hash) and, with "", that some may have been missed.
	credentials func(hash string)
	mu          sync.Mutex
	waiters     map[wakeKey]map[chan struct{}]struct{}
}

// wakeKey is what a long poll waits for: a kind (models.WakeWork or
// models.WakeSoftware) of change on a node.
type wakeKey struct {
	kind   string
	nodeID int64
}

func newWorkHub(log *slog.Logger) *workHub {
	return &workHub{log: log, waiters: map[wakeKey]map[chan struct{}]struct{}{}}
}

// wait registers interest in the node's next wake-up of this kind.
func (h *workHub) wait(kind string, nodeID int64) (<-chan struct{}, func()) {
	key := wakeKey{kind, nodeID}
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[key] == nil {
		h.waiters[key] = map[chan struct{}]struct{}{}
	}
	h.waiters[key][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.waiters[key], ch)
		if len(h.waiters[key]) == 0 {
			delete(h.waiters, key)
		}
		h.mu.Unlock()
	}
}

func (h *workHub) wake(kind string, nodeID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[wakeKey{kind, nodeID}] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// notified wakes the waiters a notification's payload names: "w:<id>" or
// "s:<id>", or a bare "<id>" (sent by earlier versions, during a rolling
// upgrade) for both kinds.
func (h *workHub) notified(payload string) error {
	kind, id, found := strings.Cut(payload, ":")
	if !found {
		kind, id = "", payload
	}
	nodeID, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return fmt.Errorf("node id %q: %w", id, err)
	}
	switch kind {
	case models.WakeWork, models.WakeSoftware:
		h.wake(kind, nodeID)
	case "":
		h.wake(models.WakeWork, nodeID)
		h.wake(models.WakeSoftware, nodeID)
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	return nil
}

// closeAll wakes every waiter (on shutdown, or when notifications may have
// been missed) so they look at the database again.
func (h *workHub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.waiters {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// listen keeps a LISTEN connection open until ctx ends, reconnecting with
// backoff; after a reconnect every waiter re-checks.
func (h *workHub) listen(ctx context.Context, url string) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		err := h.listenOnce(ctx, url, func() { backoff = 200 * time.Millisecond })
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("work listener lost its database connection; reconnecting", "error", err, "in", backoff)
		h.closeAll()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func (h *workHub) listenOnce(ctx context.Context, url string, connected func()) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+models.WorkChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if h.events != nil {
		if _, err := conn.Exec(ctx, "LISTEN "+models.EventsChannel); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		// Changes made while no connection listened were not announced.
		h.events.resync("the server (re)connected to the database")
	}
	if h.credentials != nil {
		if _, err := conn.Exec(ctx, "LISTEN "+models.CredentialsChannel); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		// Nor were the credentials revoked meanwhile.
		h.credentials("")
	}
	connected()
	h.closeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if n.Channel == models.EventsChannel {
			if h.events != nil {
				h.events.publish(n.Payload)
			}
			continue
		}
		if n.Channel == models.CredentialsChannel {
			if h.credentials != nil && n.Payload != "" {
				h.credentials(n.Payload)
			}
			continue
		}
		if err := h.notified(n.Payload); err != nil {
			h.log.Warn("ignoring malformed work notification", "payload", n.Payload, "error", err)
		}
	}
}

func agentType(taskType string) string {
	if taskType == fuel.TaskReboot {
		return protocol.TypeReboot
	}
	return "shell"
}
