package models

import (
	"fmt"
	"strings"
	"sync"

	"gorm.io/gorm/schema"
)

// noOutputsHashSQL is InputsHash(d.inputs_base, nil) in SQL: the hash of
// the base, a NUL byte and "[]" (no outputs, as JSON).
const noOutputsHashSQL = `encode(sha256(convert_to(d.inputs_base, 'UTF8') || '\x00'::bytea || convert_to('[]', 'UTF8')), 'hex')`

// lcmLastRunWhere narrows lastRunsWhere to the runs LCM compares the next
// run d with, as finalInputsOf does.
var lcmLastRunWhere = fmt.Sprintf(lastRunsWhere, "(SELECT deployment_id FROM transactions WHERE id = d.transaction_id)", "d.graph_type",
	"r.node_id = d.node_id AND r.task_name = d.task_name AND r.id <> d.id")

// reportQuery is a statement that answers task runs (batchReportSQL,
// handAheadSQL, the poll's claimOrNextOfferSQL) ready to run: positional
// (positionalSQL), with its parameters' names in order and the task_runs
// columns of its answer's rows (for the report's, between part and
// log_stored).
type reportQuery struct {
	sql     string
	params  []string
	columns []string
}

// reportQueryOf makes a report statement's text (batchReportSQL,
// handAheadSQL) ready to run: its %[1]s becomes the reported runs'
// columns, read from res, %[2]s the dispatched runs', read from d.
func reportQueryOf(text string) reportQuery {
	columns := taskRunColumnNames()
	read := map[string]bool{}
	for _, c := range strings.Split(resultColumns, ",") {
		read[strings.TrimSpace(c)] = true
	}
	var reported, next []string
	for _, c := range columns {
		if read[c] {
			reported = append(reported, "res."+c)
		} else {
			reported = append(reported, "NULL AS "+c)
		}
		next = append(next, "d."+c)
	}
	q, params := positionalSQL(fmt.Sprintf(text, strings.Join(reported, ", "), strings.Join(next, ", ")))
	return reportQuery{sql: q, params: params, columns: columns}
}

// scanRun reads the current row of q's answer: a task run (q.columns)
// between the columns of head and those of tail.
func (q reportQuery) scanRun(rows rowReader, head []any, tail ...any) (TaskRun, error) {
	var run TaskRun
	dests, err := run.taskRunDests(q.columns)
	if err != nil {
		return run, err
	}
	return run, rows.Scan(append(append(head, dests...), tail...)...)
}

// taskRunColumnNames are the task_runs columns TaskRun has fields for, in
// the model's order; each has a scan destination (TaskRun.columnDest).
var taskRunColumnNames = sync.OnceValue(func() []string {
	s, err := schema.Parse(&TaskRun{}, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		panic(fmt.Sprintf("parse the task run model: %v", err)) // a programming error
	}
	if _, err := (&TaskRun{}).taskRunDests(s.DBNames); err != nil {
		panic(err) // a programming error: a column added without columnDest
	}
	return s.DBNames
})

// noOutputsContext is the context of a run that sees no outputs: one
// dispatched when no run of its transaction has left any.
func noOutputsContext() *RunContext { return &RunContext{Outputs: []RunOutputs{}, Peers: []string{}} }
