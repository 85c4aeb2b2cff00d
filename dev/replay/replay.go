// Package replay replays the workflow executions of a running anneal
// installation against the workflow code of this checkout, the way
// samples-go's multi-history replayer does: list the executions through the
// visibility API, fetch each one's history, replay it on a
// worker.WorkflowReplayer. An execution whose replay fails is one that a
// worker running this code would break (a non-determinism error, an unknown
// workflow type, a panic), so an upgrade must not roll out until none does.
package replay

import (
	"context"
	"errors"
	"fmt"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows/codec"
	"log/slog"
	"sort"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows"
)

// DefaultSince is how far back closed executions are replayed by default.
const DefaultSince = 7 * 24 * time.Hour

// Options says what to replay.
type Options struct {
	// Client is connected to the installation's Temporal namespace.
	Client client.Client
	// Namespace is the client's namespace (the visibility API needs it).
	Namespace string
	// TaskQueue limits the replay to the executions of one installation
	// (anneal's task queue, "anneal" by default); "" replays every
	// execution in the namespace.
	TaskQueue string
	// Since: open executions are always replayed, closed ones when they
	// closed within Since. 0 means DefaultSince.
	Since time.Duration
	// Register registers the workflows to replay against; nil means
	// workflows.Register, the code of this checkout.
	Register func(worker.WorkflowRegistry)
	// Log receives progress and the replayer's warnings; nil discards.
	Log *slog.Logger
	// Keys decode the installation's encrypted payloads (secrets/codec);
	// nil reads plain payloads only. Plain payloads pass through either way.
	Keys *secrets.Keyring
}

// Broken is an execution that does not replay on the current code.
type Broken struct {
	WorkflowID string
	RunID      string
	Type       string
	// Open tells whether the execution is still running (an upgrade would
	// wedge it) rather than closed (a reset or a query would fail).
	Open bool
	Err  error
}

// Result is the outcome of a replay.
type Result struct {
	// Replayed counts the executions replayed, broken ones included.
	Replayed int
	// Open counts the replayed executions that were still running.
	Open int
	// ByType counts the replayed executions per workflow type.
	ByType map[string]int
	// Broken lists the executions that would break, in listing order.
	Broken []Broken
}

// Query returns the visibility query selecting what Run replays at now.
func Query(taskQueue string, since time.Duration, now time.Time) string {
	if since <= 0 {
		since = DefaultSince
	}
	q := fmt.Sprintf(`(ExecutionStatus = "Running" OR CloseTime >= "%s")`, now.Add(-since).UTC().Format(time.RFC3339))
	if taskQueue != "" {
		q = fmt.Sprintf(`TaskQueue = %q AND %s`, taskQueue, q)
	}
	return q
}

// Run lists the executions Options selects and replays each one. It
// returns an error only when it cannot list or fetch; executions that do not
// replay are in Result.Broken.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Client == nil {
		return nil, errors.New("replay: no Temporal client")
	}
	if opts.Namespace == "" {
		opts.Namespace = client.DefaultNamespace
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	register := opts.Register
	if register == nil {
		register = workflows.Register
	}
	replayer, err := worker.NewWorkflowReplayerWithOptions(worker.WorkflowReplayerOptions{
		DataConverter: codec.DataConverter(opts.Keys), FailureConverter: codec.FailureConverter(opts.Keys),
	})
	if err != nil {
		return nil, fmt.Errorf("replay: new replayer: %w", err)
	}
	register(replayer)
	// The replayer logs a non-determinism at error level on top of
	// returning it: keep that out of the report, which names it once.
	replayLog := sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))

	query := Query(opts.TaskQueue, opts.Since, time.Now())
	log.Info("listing executions", "namespace", opts.Namespace, "query", query)
	res := &Result{ByType: map[string]int{}}
	var token []byte
	for {
		page, err := opts.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: opts.Namespace, Query: query, NextPageToken: token, PageSize: 200,
		})
		if err != nil {
			return res, fmt.Errorf("replay: list executions (%s): %w", query, err)
		}
		for _, info := range page.GetExecutions() {
			exec := info.GetExecution()
			typ := info.GetType().GetName()
			open := info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
			hist, err := fetchHistory(ctx, opts.Client, exec.GetWorkflowId(), exec.GetRunId())
			if err != nil {
				return res, err
			}
			res.Replayed++
			res.ByType[typ]++
			if open {
				res.Open++
			}
			err = replayer.ReplayWorkflowHistoryWithOptions(replayLog, hist, worker.ReplayWorkflowHistoryOptions{
				OriginalExecution: workflow.Execution{ID: exec.GetWorkflowId(), RunID: exec.GetRunId()},
			})
			if err != nil {
				res.Broken = append(res.Broken, Broken{WorkflowID: exec.GetWorkflowId(), RunID: exec.GetRunId(), Type: typ, Open: open, Err: err})
				log.Warn("would break", "workflow_id", exec.GetWorkflowId(), "run_id", exec.GetRunId(), "type", typ, "error", err)
			}
			if res.Replayed%100 == 0 {
				log.Info("replaying", "done", res.Replayed, "broken", len(res.Broken))
			}
		}
		token = page.GetNextPageToken()
		if len(token) == 0 {
			return res, nil
		}
	}
}

// fetchHistory reads an execution's whole history, page by page.
func fetchHistory(ctx context.Context, c client.Client, workflowID, runID string) (*historypb.History, error) {
	it := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	hist := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("replay: fetch the history of %s (run %s): %w", workflowID, runID, err)
		}
		hist.Events = append(hist.Events, ev)
	}
	return hist, nil
}

// Summary renders a result for people: counts per type, then one line per
// broken execution.
func (r *Result) Summary() string {
	var b strings.Builder
	types := make([]string, 0, len(r.ByType))
	for t := range r.ByType {
		types = append(types, t)
	}
	sort.Strings(types)
	var parts []string
	for _, t := range types {
		parts = append(parts, fmt.Sprintf("%s %d", t, r.ByType[t]))
	}
	fmt.Fprintf(&b, "replayed %d executions (%d open): %s\n", r.Replayed, r.Open, strings.Join(parts, ", "))
	if len(r.Broken) == 0 {
		b.WriteString("none would break on this code\n")
		return b.String()
	}
	fmt.Fprintf(&b, "%d would break on this code:\n", len(r.Broken))
	for _, x := range r.Broken {
		state := "closed"
		if x.Open {
			state = "open"
		}
		fmt.Fprintf(&b, "  %s  workflow_id=%s run_id=%s (%s): %v\n", x.Type, x.WorkflowID, x.RunID, state, x.Err)
	}
	return b.String()
}
