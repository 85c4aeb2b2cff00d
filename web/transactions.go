package web

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// startTransaction validates an execute request, records the transaction
// and starts its workflow, all or nothing (the workflow start happens inside
// the database transaction that records it). Both POST /graphs/execute and
// POST /scenarios/:name/execute go through it. memo adds entries to the
// workflow's memo; label, when set, prefixes the workflow's summary (e.g.
// "scenario deploy-changes").
func (s *Server) startTransaction(ctx context.Context, in fuel.ExecuteInput, label string, memo map[string]any) (*fuel.Transaction, error) {
	txn, err := s.fuel.CreateTransaction(ctx, in, func(txn *fuel.Transaction) error {
		types := make([]string, len(txn.Graphs))
		for i, g := range txn.Graphs {
			types[i] = g.Type
		}
		m := map[string]any{"deployment": in.Deployment, "graphs": types, "dry_run": txn.DryRun}
		maps.Copy(m, memo)
		summary := fmt.Sprintf("%s on deployment %s", strings.Join(types, " → "), in.Deployment)
		if label != "" {
			summary = label + ": " + summary
		}
		return s.startWorkflow(ctx, txn, summary, m)
	})
	if err != nil {
		return nil, err
	}
	attrs := []any{"transaction", txn.ID, "workflow_id", txn.WorkflowID, "deployment", in.Deployment}
	if label != "" {
		attrs = append(attrs, "started_by", label)
	}
	s.log.Info("transaction started", attrs...)
	return txn, nil
}

// transactionSearchAttributes are what a transaction's workflow carries for
// `temporal workflow list --query` and the Web UI: its deployment, graph
// types (comma-separated when several), uuid and status. Its GraphRun and
// NodeRun children copy them (workflows.childSearchAttributes).
func (s *Server) transactionSearchAttributes(ctx context.Context, txn *fuel.Transaction) temporal.SearchAttributes {
	deployment := ""
	if dep, err := s.cfg.Store.Deployment(ctx, strconv.FormatInt(txn.DeploymentID, 10)); err == nil {
		deployment = dep.Name
	} else {
		s.log.Warn("transaction workflow started without its deployment search attribute", "transaction", txn.ID, "error", err)
	}
	types := make([]string, 0, len(txn.Graphs))
	for _, g := range txn.Graphs {
		types = append(types, g.Type)
	}
	return contract.SearchAttributesOf(deployment, strings.Join(types, ","), "", txn.ID.String(), models.TxRunning)
}

// startWorkflow starts a transaction's workflow under its readable ID. It
// fails, rather than attaching to it, if a run with that ID is still open.
func (s *Server) startWorkflow(ctx context.Context, txn *fuel.Transaction, summary string, memo map[string]any) error {
	opts := client.StartWorkflowOptions{
		ID:                    txn.WorkflowID,
		TaskQueue:             s.cfg.TaskQueue,
		Memo:                  memo,
		StaticSummary:         summary,
		TypedSearchAttributes: s.transactionSearchAttributes(ctx, txn),
	}
	input := contract.TransactionInput{
		TransactionID: txn.ID.String(), Graphs: len(txn.Graphs), HeartbeatTimeoutSec: s.cfg.HeartbeatTimeoutSec,
	}
	if err := contract.StartTransaction(ctx, s.cfg.Temporal, opts, input); err != nil {
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if errors.As(err, &started) {
			return &models.ConflictError{Reason: fmt.Sprintf("workflow %s is still running; wait for it to end", txn.WorkflowID)}
		}
		return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "could not start the transaction workflow; nothing was recorded: "+err.Error())
	}
	return nil
}
