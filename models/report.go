package models

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// reportSQL records a report's result and, in the same statement, hands
// its chain's next run to the reporting agent: what ReportRun's general
// path does in five round trips (BEGIN, the result, the next run's lock,
// its dispatch, COMMIT), one statement does in one, with one firing of
// the run events' trigger instead of two. It dispatches the next run only
// when nothing needs deciding in Go first:
//   - the reported run succeeded without outputs (@dispatch), it has a
//     next run in its chain, still linked to it and pending, on a node;
//   - no run of the transaction has left outputs (the statement's
//     snapshot does not see the reported run's new row, hence the first
//     condition): the next run sees none, and its inputs hash is its base's
//     with no outputs, computed here as InputsHash computes it;
//   - LCM would not skip it: it is not LCM's, or the last finished run of
//     its task on its node (lastRunsWhere) did not succeed with that hash.
//
// Otherwise the result alone is written, and ReportRun goes on in Go. The
// log's first chunk is stored only with the result (a refused report
// writes nothing). The reported run is updated before the next one, as
// the id order that EndLostChain and CutChain lock a chain's runs in
// wants; CutChain, if first, leaves the next run unlinked, which its
// UPDATE rechecks. Unlike a dispatch, it does not lock the node's row:
// that lock makes a check that the node is free and the dispatch one
// step, and here the node is never free, its run ending and the next one
// starting in the same commit. %[1]s is the reported run's columns for the
// first row of the answer, %[2]s the next run's for the second (see
// reportStatement).
var reportSQL = `WITH res AS (
  UPDATE task_runs SET ` + resultSetSQL + `
  WHERE id = @run AND node_id = @node AND attempt = @attempt AND state = @running
  RETURNING ` + resultColumns + `
), ` + firstChunkCTEs("res WHERE @size > 0") + `, next AS (
  -- dispatch's UPDATE of a run handed back, with its token and hash here
  UPDATE task_runs d SET state = 'running', attempt = d.attempt + 1, task_token = res.task_token,
    claimed_at = now(), acked_at = now(), lease_until = now() + make_interval(secs => @lease),
    started_at = now(), finished_at = NULL, exit_code = NULL, error = '', updated_at = now(),
    inputs_hash = CASE WHEN d.inputs_base <> '' THEN ` + noOutputsHashSQL + ` ELSE d.inputs_hash END
  FROM res
  WHERE @dispatch AND @state = 'succeeded' AND d.id = res.chain_next AND d.chain_head = res.chain_head AND d.state = 'pending'
    AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = d.node_id)
    AND NOT ` + outputsLeftSQL("d.transaction_id") + `
    AND NOT (d.lcm AND d.inputs_base <> '' AND EXISTS (
      SELECT 1 FROM (
        SELECT r.state, r.inputs_hash FROM task_runs r JOIN transactions t ON t.id = r.transaction_id
        WHERE ` + lcmLastRunWhere + `
        ORDER BY r.finished_at DESC, r.id DESC LIMIT 1) l
      WHERE l.state IN ('succeeded', 'skipped') AND l.inputs_hash = ` + noOutputsHashSQL + `))
  RETURNING d.*
)
SELECT 1 AS part, %[1]s, EXISTS (SELECT 1 FROM chunk) AS log_stored FROM res
UNION ALL
SELECT 2 AS part, %[2]s, false FROM next d`

// noOutputsHashSQL is InputsHash(d.inputs_base, nil) in SQL: the hash of
// the base, a NUL byte and "[]" (no outputs, as JSON).
const noOutputsHashSQL = `encode(sha256(convert_to(d.inputs_base, 'UTF8') || '\x00'::bytea || convert_to('[]', 'UTF8')), 'hex')`

// lcmLastRunWhere narrows lastRunsWhere to the runs LCM compares the next
// run d with, as finalInputsOf does.
var lcmLastRunWhere = fmt.Sprintf(lastRunsWhere, "(SELECT deployment_id FROM transactions WHERE id = d.transaction_id)", "d.graph_type",
	"r.node_id = d.node_id AND r.task_name = d.task_name AND r.id <> d.id")

// reportQuery is reportSQL ready to run: positional (positionalSQL),
// with its parameters' names in order and the task_runs columns of its
// answer's rows, between part and log_stored.
type reportQuery struct {
	sql     string
	params  []string
	columns []string
}

// reportStatement is reportSQL with the two column lists of its answer,
// one per row, made once: every column of task_runs, the reported run's
// read back from res where resultColumns has it (NULL elsewhere: what the
// report wrote is known already, and a run's spec and attributes are JSON
// to decode), the next run's whole, as its work item is built from it.
var reportStatement = sync.OnceValue(func() reportQuery { return reportQueryOf(reportSQL) })

// reportQueryOf makes a report statement's text (reportSQL,
// batchReportSQL) ready to run: its %[1]s becomes the reported runs'
// columns, read from res, %[2]s the dispatched runs', read from d.
func reportQueryOf(text string) reportQuery {
	s, err := schema.Parse(&TaskRun{}, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		panic(fmt.Sprintf("parse the task run model: %v", err)) // a programming error
	}
	if _, err := (&TaskRun{}).taskRunDests(s.DBNames); err != nil {
		panic(err) // a programming error: a column added without columnDest
	}
	read := map[string]bool{}
	for _, c := range strings.Split(resultColumns, ",") {
		read[strings.TrimSpace(c)] = true
	}
	var reported, next []string
	for _, c := range s.DBNames {
		if read[c] {
			reported = append(reported, "res."+c)
		} else {
			reported = append(reported, "NULL AS "+c)
		}
		next = append(next, "d."+c)
	}
	q, params := positionalSQL(fmt.Sprintf(text, strings.Join(reported, ", "), strings.Join(next, ", ")))
	return reportQuery{sql: q, params: params, columns: s.DBNames}
}

// noOutputsContext is the context of a run that sees no outputs: one
// dispatched when no run of its transaction has left any.
func noOutputsContext() *RunContext { return &RunContext{Outputs: []RunOutputs{}, Peers: []string{}} }

// reportAndContinue runs reportSQL for run, the result resultOf made of a
// report (chunk: its log's first chunk, or nil; dispatch: it may go on
// with the chain, as it left no outputs). recorded says whether the
// result was written, logStored whether the chunk was; next is the
// chain's next run dispatched to the agent, with its Context (it sees no
// outputs), or nil. Once recorded, run holds the values written and the
// columns of resultColumns, as after updateResult.
func reportAndContinue(db *gorm.DB, run *TaskRun, nodeID int64, attempt int, chunk []byte, dispatch bool, lease time.Duration) (recorded, logStored bool, next *TaskRun, err error) {
	params, err := resultParams(run, nodeID, attempt, chunk)
	if err != nil {
		return false, false, nil, err
	}
	params["dispatch"], params["lease"] = dispatch, ackLeaseOr(lease).Seconds()
	q := reportStatement()
	args, err := positionalArgs(q.params, params)
	if err != nil {
		return false, false, nil, fmt.Errorf("record result of run %d: %w", run.ID, err)
	}
	rows, err := rawPositional(db, q.sql, args).Rows()
	if err != nil {
		return false, false, nil, fmt.Errorf("record result of run %d: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var part int
		var row TaskRun
		var stored bool
		dests, err := row.taskRunDests(q.columns)
		if err != nil {
			return false, false, nil, err
		}
		if err := rows.Scan(append(append([]any{&part}, dests...), &stored)...); err != nil {
			return false, false, nil, fmt.Errorf("read the report of run %d: %w", run.ID, err)
		}
		switch part {
		case 1:
			readBack(run, row)
			recorded, logStored = true, stored
		case 2:
			next = &row
			next.Context = noOutputsContext()
		}
	}
	if err := rows.Err(); err != nil {
		return false, false, nil, fmt.Errorf("read the report of run %d: %w", run.ID, err)
	}
	return recorded, logStored, next, nil
}
