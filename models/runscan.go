package models

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// The report's statement (batchReportSQL) is on every run's path, and gorm's
// generic handling of it was a tenth of the worker's CPU at 1,000 nodes:
// expanding its named parameters walks the whole statement at each call,
// and its reflective scan of the answer's two rows. What is here does both
// once: the statement is made positional when it is first built, and its
// rows are scanned into a TaskRun column by column.

// positionalSQL turns a statement's @name parameters into $1, $2, …, one
// per occurrence as gorm's named expansion numbers them, and returns the
// names in that order.
func positionalSQL(named string) (string, []string) {
	var b strings.Builder
	var names []string
	for i := 0; i < len(named); i++ {
		c := named[i]
		if c != '@' || i+1 == len(named) || !isNameStart(named[i+1]) {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(named) && isNameByte(named[j]) {
			j++
		}
		names = append(names, named[i+1:j])
		fmt.Fprintf(&b, "$%d", len(names))
		i = j - 1
	}
	return b.String(), names
}

func isNameStart(c byte) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isNameByte(c byte) bool { return isNameStart(c) || ('0' <= c && c <= '9') }

// positionalArgs are the arguments of a positionalSQL statement, from the
// parameters by name; a name without a value is a programming error.
func positionalArgs(names []string, params map[string]any) ([]any, error) {
	args := make([]any, len(names))
	for i, name := range names {
		v, ok := params[name]
		if !ok {
			return nil, fmt.Errorf("no value for the statement's parameter @%s", name)
		}
		args[i] = v
	}
	return args, nil
}

// rawPositional is db.Raw for a statement already positional: gorm's
// callbacks (its logger, tests' statement counts) and connection see it,
// without the walk over its text that Raw makes to expand parameters.
func rawPositional(db *gorm.DB, query string, args []any) *gorm.DB {
	tx := db.Raw("")
	tx.Statement.SQL.WriteString(query)
	tx.Statement.Vars = args
	return tx
}

// columnDest is where a task_runs column of a row goes in r, for
// sql.Rows.Scan: NULL leaves a field's zero value (as gorm does), JSON
// columns are decoded as their serializer:json tag says; nil for a column
// TaskRun has no field for.
func (r *TaskRun) columnDest(column string) any {
	switch column {
	case "id":
		return orZero[int64]{&r.ID}
	case "transaction_id":
		return &r.TransactionID // uuid.UUID scans NULL as the zero id
	case "graph_index":
		return orZero[int]{&r.GraphIndex}
	case "graph_type":
		return orZero[string]{&r.GraphType}
	case "node_id":
		return orZero[int64]{&r.NodeID}
	case "node_name":
		return orZero[string]{&r.NodeName}
	case "task_name":
		return orZero[string]{&r.TaskName}
	case "task_type":
		return orZero[string]{&r.TaskType}
	case "position":
		return orZero[int]{&r.Position}
	case "spec":
		return jsonColumn[RunSpec]{&r.Spec}
	case "state":
		return orZero[string]{&r.State}
	case "attempt":
		return orZero[int]{&r.Attempt}
	case "task_token":
		return orZero[[]byte]{&r.TaskToken}
	case "claimed_at":
		return &r.ClaimedAt
	case "acked_at":
		return &r.AckedAt
	case "started_at":
		return &r.StartedAt
	case "finished_at":
		return &r.FinishedAt
	case "exit_code":
		return &r.ExitCode
	case "stdout_tail":
		return orZero[string]{&r.StdoutTail}
	case "stderr_tail":
		return orZero[string]{&r.StderrTail}
	case "outputs":
		return jsonColumn[map[string]string]{&r.Outputs}
	case "error":
		return orZero[string]{&r.Error}
	case "inputs_hash":
		return orZero[string]{&r.InputsHash}
	case "inputs_base":
		return orZero[string]{&r.InputsBase}
	case "lcm":
		return orZero[bool]{&r.LCM}
	case "noderole_id":
		return &r.NodeRoleID
	case "attrs_in":
		return jsonColumn[map[string]any]{&r.AttrsIn}
	case "attrs_out":
		return jsonColumn[map[string]any]{&r.AttrsOut}
	case "chain_head":
		return &r.ChainHead
	case "chain_next":
		return &r.ChainNext
	case "created_at":
		return orZero[time.Time]{&r.CreatedAt}
	case "updated_at":
		return orZero[time.Time]{&r.UpdatedAt}
	}
	return nil
}

// orZero scans a value that may be NULL into a field that cannot hold
// NULL: its zero value then.
type orZero[T any] struct{ dst *T }

func (o orZero[T]) Scan(src any) error {
	var v sql.Null[T]
	if err := v.Scan(src); err != nil {
		return err
	}
	*o.dst = v.V
	return nil
}

// jsonColumn decodes a JSON column (a field tagged serializer:json) as
// gorm's serializer does: NULL or empty is the zero value.
type jsonColumn[T any] struct{ dst *T }

func (j jsonColumn[T]) Scan(src any) error {
	var v T
	var data []byte
	switch s := src.(type) {
	case nil:
	case []byte:
		data = s
	case string:
		data = []byte(s)
	default:
		return fmt.Errorf("JSON column holds a %T", src)
	}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
	}
	*j.dst = v
	return nil
}

// taskRunDests are the scan destinations of columns in r, which must all
// be TaskRun's.
func (r *TaskRun) taskRunDests(columns []string) ([]any, error) {
	dests := make([]any, len(columns))
	for i, c := range columns {
		if dests[i] = r.columnDest(c); dests[i] == nil {
			return nil, fmt.Errorf("task run column %s has no field to scan into (TaskRun.columnDest)", c)
		}
	}
	return dests, nil
}
