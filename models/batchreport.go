package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// batchReportSQL records a batch of reports (protocol.RunResults) and,
// in the same statement, hands the chain's next runs ahead to the
// reporting agent: the runs it ran one after the other, their logs' first
// chunks, the runs it releases (handed ahead, not started: back to
// pending; their attempt stays raised, as TakeBackHandBack leaves it, so
// that every hand-out of a run is an attempt of its own and a release
// sent late cannot take back a later one), and up to @ahead of the
// chain's next runs, dispatched as a single next run was. It is all or
// nothing: unless every result's run is running at its attempt on the
// node (a batch sent again, a run failed meanwhile), it writes nothing and
// ReportRuns goes the general way. The chain goes on only when nothing
// needs deciding in Go first (@dispatch: no result left outputs; the last succeeded; no run
// of the transaction has left outputs; LCM would not skip the run), and
// each run walked must be pending and still linked: the walk stops at the
// first that is not, which the general path (continueChain) then deals
// with. A run released here is not seen pending by the walk (a statement
// sees the rows as they were before it), so a batch that releases runs
// hands none ahead; ReportRuns goes on with the chain in Go then.
var batchReportSQL = `WITH RECURSIVE v AS (
  SELECT * FROM unnest(@ids::bigint[], @attempts::int[], @states::text[], @exits::int[], @outputs::text[], @errors::text[],
    @stdouts::text[], @stderrs::text[], @started::timestamptz[], @finished::timestamptz[], @attrs::text[], @sizes::int[], @datas::bytea[])
    WITH ORDINALITY AS v(id, attempt, state, exit, outputs, error, stdout, stderr, started, finished, attrs, size, data, o)
), ok AS (
  SELECT count(*) = cardinality(@ids::bigint[]) AS every_running FROM v JOIN task_runs t ON t.id = v.id
  WHERE t.node_id = @node AND t.attempt = v.attempt AND t.state = 'running'
), rel AS (
  UPDATE task_runs r SET state = 'pending', claimed_at = NULL, acked_at = NULL, lease_until = NULL,
    started_at = NULL, updated_at = now()
  FROM unnest(@released::bigint[], @released_attempts::int[]) AS x(id, attempt), ok
  WHERE ok.every_running AND r.id = x.id AND r.node_id = @node AND r.attempt = x.attempt AND r.state = 'running'
  RETURNING r.id
), res AS (
  UPDATE task_runs t SET state = v.state, exit_code = v.exit, outputs = CAST(v.outputs AS jsonb), error = v.error,
    stdout_tail = v.stdout, stderr_tail = v.stderr, finished_at = v.finished, updated_at = @updated, attrs_out = CAST(v.attrs AS jsonb),
    -- a run handed ahead started when the agent says, not when it was
    -- handed out; never before that
    started_at = GREATEST(t.started_at, v.started)
  FROM v, ok
  WHERE ok.every_running AND t.id = v.id AND t.node_id = @node AND t.attempt = v.attempt AND t.state = 'running'
  RETURNING ` + prefixed("t.", resultColumns) + `, v.o
), log AS (
  INSERT INTO run_logs (run_id, attempt, size, stored, truncated, updated_at)
  SELECT v.id, v.attempt, v.size, v.size, false, now() FROM res JOIN v ON v.o = res.o WHERE v.size > 0
  ON CONFLICT DO NOTHING
  RETURNING run_id, attempt
), chunk AS (
  INSERT INTO run_log_chunks (run_id, attempt, pos, data)
  SELECT log.run_id, log.attempt, 0, v.data FROM log JOIN v ON v.id = log.run_id AND v.attempt = log.attempt
  RETURNING run_id
), last AS (
  SELECT res.* FROM res WHERE res.o = cardinality(@ids::bigint[])
), ` + aheadCTEs("JOIN v ON v.o = last.o WHERE @dispatch AND v.state = 'succeeded' AND") + `
SELECT 0 AS n, %[1]s, EXISTS (SELECT 1 FROM chunk WHERE chunk.run_id = res.id) AS log_stored FROM res
UNION ALL
SELECT n, %[2]s, false FROM next d
ORDER BY n`

// aheadCTEs hand up to @ahead of a chain's runs ahead to the agent, after
// the run last (a CTE of one row with the columns of resultColumns): walk
// follows the chain from last, through runs that may be handed ahead
// (aheadableSQL; first adds to the first step's condition, ending in AND),
// and next dispatches them, each as dispatch does, with the
// chain's token and its inputs hash when no run has left outputs (its
// runs see none: the agent starts none after one that left some).
//
// Each run looked up is also asked to be on @node, as a chain's runs all
// are: with that, whatever plan Postgres picks for finding it reads only
// the node's unfinished runs. Without it, statistics taken while no run
// was unfinished (an idle site's last analyze) made the pending test pick
// task_runs_node_unfinished_idx whole, every unfinished run of every node,
// at each step of the walk and again for the update: 26 to 63 ms a call
// on average with a thousand runs pending (0.17 before), and Postgres's
// CPU per run doubled (TestHandAheadReadsOnlyItsNodesRuns).
func aheadCTEs(first string) string {
	return `walk(id, n) AS (
  SELECT d.id, 1 FROM last JOIN task_runs d ON d.id = last.chain_next AND d.chain_head = last.chain_head
  ` + first + ` d.node_id = @node AND NOT ` + outputsLeftSQL("d.transaction_id") + ` AND ` + aheadableSQL + `
  UNION ALL
  SELECT d.id, w.n + 1 FROM walk w JOIN task_runs p ON p.id = w.id
  JOIN task_runs d ON d.id = p.chain_next AND d.chain_head = p.chain_head
  WHERE w.n < @ahead AND d.node_id = @node AND ` + aheadableSQL + `
), next AS (
  UPDATE task_runs d SET state = 'running', attempt = d.attempt + 1, task_token = last.task_token,
    claimed_at = now(), acked_at = now(), lease_until = now() + make_interval(secs => @lease),
    started_at = now(), finished_at = NULL, exit_code = NULL, error = '', updated_at = now(),
    inputs_hash = CASE WHEN d.inputs_base <> '' THEN ` + noOutputsHashSQL + ` ELSE d.inputs_hash END
  FROM walk, last
  -- rechecked on the row as it is now, should a cut (CutChain) have
  -- committed since the walk read it
  WHERE d.id = walk.id AND d.node_id = @node AND d.state = 'pending' AND d.chain_head = last.chain_head
  RETURNING walk.n, d.*
)`
}

// aheadableSQL says whether run d of a chain may be handed ahead: pending,
// its node still there, and not a run LCM would skip (as finalInputsOf
// decides for a run that sees no outputs).
var aheadableSQL = `d.state = 'pending' AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = d.node_id)
    AND NOT (d.lcm AND d.inputs_base <> '' AND EXISTS (
      SELECT 1 FROM (
        SELECT r.state, r.inputs_hash FROM task_runs r JOIN transactions t ON t.id = r.transaction_id
        WHERE ` + lcmLastRunWhere + `
        ORDER BY r.finished_at DESC, r.id DESC LIMIT 1) l
      WHERE l.state IN ('succeeded', 'skipped') AND l.inputs_hash = ` + noOutputsHashSQL + `))`

// prefixed writes each column of a comma-separated list with prefix.
func prefixed(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// batchReportStatement is batchReportSQL ready to run: the results' rows
// carry the columns of resultColumns (the rest NULL), the runs handed
// ahead all of theirs.
var batchReportStatement = sync.OnceValue(func() reportQuery {
	return reportQueryOf(batchReportSQL)
})

// MaxAheadRuns is the most runs of a chain one answer hands ahead. At 8, a
// chain of ten short runs took three reports (its first run alone, the
// eight handed ahead after it, then the last); at 16 it takes two. The
// agent still starts them only within the answer's window (AheadMs), and
// releases those it did not start. A release of more than 8 refused by an
// API older than this (400) leaves the runs to be taken back at their
// chain's end, as a lost release does.
const MaxAheadRuns = 16

// BatchReport says what ReportRuns did: the last result as ReportRun
// says it, and the runs handed ahead after Next.
type BatchReport struct {
	ReportedRun
	// Ahead are the chain's runs after Next, dispatched to the agent with
	// it (fresh), in order.
	Ahead []TaskRun
}

// ReportRuns stores a batch of an agent's reports of its node's runs
// (protocol.RunResults): the results in the order they ran, the runs
// released (handed ahead and not started: pending again; a batch may do
// only that, and then returns a BatchReport with no Run), and, when the
// last result lets its chain go on, its next run and up to ahead-1 more
// handed ahead (BatchReport.Ahead). The common batch (every run still
// running at the attempt reported, each log absent or a first chunk) is
// one statement (batchReportSQL): one round trip and one commit for all
// of it. Any other is one transaction: the releases, each result as
// ReportRun's general path stores it (a refused one refuses the batch:
// nothing is written), and the chain's next run (continueChain).
func (s *Store) ReportRuns(ctx context.Context, nodeID int64, batch protocol.RunResults, lease time.Duration, ahead int) (*BatchReport, error) {
	return s.reportRuns(ctx, nodeID, batch, lease, ahead, "results[%d].")
}

// reportRuns is ReportRuns; a result's refused field is named with
// fieldPrefix (a format taking the result's index; "" for a report of one
// run, whose fields are the report's own).
func (s *Store) reportRuns(ctx context.Context, nodeID int64, batch protocol.RunResults, lease time.Duration, ahead int, fieldPrefix string) (*BatchReport, error) {
	if len(batch.Results) == 0 && len(batch.Released) == 0 {
		return nil, Invalid("results", "must hold at least one result, or released a run")
	}
	if len(batch.Results) > protocol.MaxRunResults {
		return nil, Invalid("results", "holds %d results; at most %d", len(batch.Results), protocol.MaxRunResults)
	}
	if len(batch.Released) > MaxAheadRuns {
		return nil, Invalid("released", "names %d runs; at most %d are handed ahead at once", len(batch.Released), MaxAheadRuns)
	}
	for i, r := range batch.Released {
		if err := checkAttempt(r.Attempt, false); err != nil {
			return nil, Invalid(fmt.Sprintf("released[%d].attempt", i), "must be at least 1")
		}
	}
	db := s.DB.WithContext(ctx)
	if len(batch.Results) == 0 {
		// The ahead window closed while a run went on: its runs not
		// started go back.
		return &BatchReport{}, releaseRuns(db, nodeID, batch.Released)
	}
	runs, err := s.resultsOf(db, nodeID, batch.Results, fieldPrefix)
	if err != nil {
		return nil, err
	}
	fast := true
	for _, r := range batch.Results {
		if r.Log != nil && firstChunkOf(r.RunResult) == nil {
			fast = false
		}
	}
	if fast {
		out, recorded, err := batchReport(db, nodeID, batch, runs, lease, ahead)
		if err != nil {
			return nil, err
		}
		if recorded {
			// Left to Go: a chain whose next run sees outputs, may be
			// skipped by LCM, was just released or ended already, as
			// ReportRun leaves it.
			if last := out.Run; out.Next == nil && chainGoesOn(last) {
				err = db.Transaction(func(tx *gorm.DB) error {
					var err error
					out.Next, out.Fresh, err = continueChain(tx, last, lease)
					return err
				})
			}
			return out, err
		}
	}
	out := &BatchReport{}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := releaseRuns(tx, nodeID, batch.Released); err != nil {
			return err
		}
		for i, r := range batch.Results {
			rec, err := storeResult(tx, runs[i], nodeID, r.RunResult, true)
			if err != nil {
				return err
			}
			out.RecordedResult = *rec
		}
		out.Next, out.Fresh, err = continueChain(tx, out.Run, lease)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// resultsOf is resultOf for each result of a batch, with the node's
// redactor read once for all of them, and only if one holds text; a
// refused field is named with fieldPrefix (see reportRuns).
func (s *Store) resultsOf(db *gorm.DB, nodeID int64, results []protocol.RunReport, fieldPrefix string) ([]*TaskRun, error) {
	var red *secrets.Redactor
	runs := make([]*TaskRun, len(results))
	for i, r := range results {
		if red == nil && hasText(r.RunResult) {
			var err error
			if red, err = s.NodeRedactor(db, nodeID); err != nil {
				return nil, err
			}
		}
		run, err := resultRow(r.RunID, r.RunResult, red)
		if err != nil {
			var ie *InputError
			if errors.As(err, &ie) && fieldPrefix != "" {
				ie.Field = fmt.Sprintf(fieldPrefix, i) + ie.Field
			}
			return nil, err
		}
		runs[i] = run
	}
	return runs, nil
}

// releaseRuns takes runs an agent released (handed ahead, never started)
// back to pending (see batchReportSQL).
func releaseRuns(tx *gorm.DB, nodeID int64, released []protocol.RunAttempt) error {
	if len(released) == 0 {
		return nil
	}
	ids, attempts := make([]int64, len(released)), make([]int64, len(released))
	for i, r := range released {
		ids[i], attempts[i] = r.RunID, int64(r.Attempt)
	}
	if err := tx.Exec(`UPDATE task_runs r SET state = ?, claimed_at = NULL, acked_at = NULL,
  lease_until = NULL, started_at = NULL, updated_at = now()
FROM unnest(?::bigint[], ?::int[]) AS x(id, attempt)
WHERE r.id = x.id AND r.node_id = ? AND r.attempt = x.attempt AND r.state = ?`,
		contract.RunPending, int64Array(ids), int64Array(attempts), nodeID, contract.RunRunning).Error; err != nil {
		return fmt.Errorf("release runs %v: %w", ids, err)
	}
	return nil
}

// batchReport runs batchReportSQL for a batch whose logs are absent or
// first chunks (runs: the rows resultsOf made of its results). recorded
// says whether it wrote the batch (all of it, or nothing).
func batchReport(db *gorm.DB, nodeID int64, batch protocol.RunResults, runs []*TaskRun, lease time.Duration, ahead int) (*BatchReport, bool, error) {
	n := len(runs)
	ids, attempts, exits, sizes := make([]int64, n), make([]int32, n), make([]int32, n), make([]int32, n)
	states, outputs, errs, stdouts, stderrs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	started, finished, attrs, datas := make([]*time.Time, n), make([]time.Time, n), make([]*string, n), make([][]byte, n)
	dispatch := true
	for i, run := range runs {
		res := batch.Results[i].RunResult
		raw, err := json.Marshal(run.Outputs)
		if err != nil {
			return nil, false, fmt.Errorf("encode the outputs of run %d: %w", run.ID, err)
		}
		if run.AttrsOut != nil {
			b, err := json.Marshal(run.AttrsOut)
			if err != nil {
				return nil, false, fmt.Errorf("encode the attributes of run %d: %w", run.ID, err)
			}
			s := string(b)
			attrs[i] = &s
		}
		chunk := firstChunkOf(res)
		ids[i], attempts[i], exits[i], sizes[i] = run.ID, int32(res.Attempt), int32(*run.ExitCode), int32(len(chunk))
		states[i], outputs[i], errs[i], stdouts[i], stderrs[i] = run.State, string(raw), run.Error, run.StdoutTail, run.StderrTail
		finished[i], datas[i] = *run.FinishedAt, chunk
		if !res.StartedAt.IsZero() {
			started[i] = &res.StartedAt
		}
		if len(res.Outputs) > 0 {
			dispatch = false
		}
	}
	rel, relAttempts := make([]int64, len(batch.Released)), make([]int32, len(batch.Released))
	for i, r := range batch.Released {
		rel[i], relAttempts[i] = r.RunID, int32(r.Attempt)
	}
	q := batchReportStatement()
	args, err := positionalArgs(q.params, map[string]any{
		"ids": ids, "attempts": attempts, "states": states, "exits": exits, "outputs": outputs, "errors": errs,
		"stdouts": stdouts, "stderrs": stderrs, "started": started, "finished": finished, "attrs": attrs, "sizes": sizes, "datas": datas,
		"node": nodeID, "released": rel, "released_attempts": relAttempts, "updated": runs[n-1].UpdatedAt,
		"dispatch": dispatch, "ahead": max(ahead, 1), "lease": ackLeaseOr(lease).Seconds(),
	})
	if err != nil {
		return nil, false, fmt.Errorf("record the results of runs %v: %w", ids, err)
	}
	out := &BatchReport{}
	recorded := 0
	logStored := map[int64]bool{}
	err = queryGenericPlan(db, q.sql, args, func(rows rowReader) error {
		for rows.Next() {
			var step int
			var stored bool
			row, err := q.scanRun(rows, []any{&step}, &stored)
			if err != nil {
				return err
			}
			switch {
			case step == 0:
				for _, run := range runs {
					if run.ID == row.ID {
						readBack(run, row)
					}
				}
				recorded++
				logStored[row.ID] = stored
			case step == 1:
				out.Next = &row
				out.Fresh = true
			default:
				out.Ahead = append(out.Ahead, row)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("record the results of runs %v: %w", ids, err)
	}
	if recorded == 0 {
		return nil, false, nil
	}
	if recorded != n {
		return nil, false, fmt.Errorf("record the results of runs %v: %d of %d written", ids, recorded, n) // all or nothing: a bug
	}
	// The runs handed ahead see no outputs: none was left (@dispatch).
	if out.Next != nil {
		out.Next.Context = noOutputsContext()
	}
	for i := range out.Ahead {
		out.Ahead[i].Context = noOutputsContext()
	}
	out.RecordedResult = RecordedResult{Run: runs[n-1], Changed: true}
	// A log whose row was there already (a log request came first):
	// the general path, idempotent by offset, stores its first chunk or
	// says why not, as ReportRun does.
	for i, run := range runs {
		if sizes[i] > 0 && !logStored[run.ID] {
			if _, err := appendRunLog(db, nodeID, run.ID, int(attempts[i]), 0, datas[i]); err != nil {
				return nil, false, err
			}
		}
	}
	return out, true, nil
}

// handAheadSQL hands up to @ahead of a chain's runs ahead after run
// @run, running at @attempt on node @node: what an acknowledgement that
// asks for them (protocol.RunAck.Ahead), or a poll that hands @run out
// (protocol.WorkAheadParam), gets back with it. Only after a short run:
// the last run the node finished in the same graph took less than @short
// seconds, or, when none has finished there yet (the chain starts the
// graph), the last run of the same task on the node did, in an earlier
// transaction (task_runs_lcm_idx finds it). So a chain of long runs, or
// one whose first run was long the last time, does not show runs running
// that wait behind a long one, nor get them failed, not cancelled, should
// its transaction be ended meanwhile.
var handAheadSQL = `WITH RECURSIVE last AS (
  SELECT ` + prefixed("h.", resultColumns) + ` FROM task_runs h
  WHERE h.id = @run AND h.node_id = @node AND h.attempt = @attempt AND h.state = 'running'
    AND COALESCE((
      SELECT p.finished_at - p.started_at < make_interval(secs => @short) FROM task_runs p
      WHERE p.transaction_id = h.transaction_id AND p.graph_index = h.graph_index AND p.node_id = h.node_id
        AND p.finished_at IS NOT NULL AND p.started_at IS NOT NULL
      ORDER BY p.finished_at DESC LIMIT 1), (
      SELECT p.finished_at - p.started_at < make_interval(secs => @short) FROM task_runs p
      WHERE p.node_id = h.node_id AND p.graph_type = h.graph_type AND p.task_name = h.task_name
        AND p.finished_at IS NOT NULL AND p.transaction_id IS NOT NULL AND p.started_at IS NOT NULL
      ORDER BY p.finished_at DESC LIMIT 1), false)
), ` + aheadCTEs("WHERE") + `
SELECT %[2]s FROM next d ORDER BY n`

// handAheadStatement is handAheadSQL ready to run.
var handAheadStatement = sync.OnceValue(func() reportQuery { return reportQueryOf(handAheadSQL) })

// HandAhead hands up to ahead of the chain's runs after run (acknowledged
// by its node's agent, running at attempt) ahead to that agent, in one
// statement, as ReportRuns does after a report: each pending and still
// linked, not skipped by LCM, seeing no outputs. It does only when the
// last run its node finished in the run's graph took less than short (or,
// none finished there yet, the last run of the same task on the node did).
// It returns them in order, none when run is in no chain, ends it, follows
// no short run, or the runs after it are not to be handed out yet.
func (s *Store) HandAhead(ctx context.Context, nodeID, runID int64, attempt int, lease, short time.Duration, ahead int) ([]TaskRun, error) {
	q := handAheadStatement()
	args, err := positionalArgs(q.params, map[string]any{"run": runID, "node": nodeID, "attempt": attempt,
		"ahead": max(ahead, 1), "lease": ackLeaseOr(lease).Seconds(), "short": short.Seconds()})
	if err != nil {
		return nil, fmt.Errorf("hand ahead the runs after run %d: %w", runID, err)
	}
	var out []TaskRun
	err = queryGenericPlan(s.DB.WithContext(ctx), q.sql, args, func(rows rowReader) error {
		for rows.Next() {
			row, err := q.scanRun(rows, nil)
			if err != nil {
				return err
			}
			row.Context = noOutputsContext()
			out = append(out, row)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hand ahead the runs after run %d: %w", runID, err)
	}
	return out, nil
}
