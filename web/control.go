package web

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
)

// stopTransaction is POST /transactions/:uuid/stop: it cancels the
// transaction's workflow, exactly as `temporal workflow cancel` does. The
// workflow stops dispatching, lets running tasks finish, marks what never
// started cancelled and ends the transaction "stopped".
func (s *Server) stopTransaction(c echo.Context) error {
	id, err := uuidParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	txn, err := s.fuel.Transaction(ctx, id)
	if err != nil {
		return err
	}
	txn, ended, err := s.reconcileTransaction(ctx, txn)
	if err != nil {
		return err
	}
	if ended {
		return &models.ConflictError{Reason: fmt.Sprintf("transaction %s had already ended: %s", id, txn.Error)}
	}
	if txn.Status != models.TxPending && txn.Status != models.TxRunning {
		return &models.ConflictError{Reason: fmt.Sprintf("transaction %s is %s: there is nothing to stop", id, txn.Status)}
	}
	if err := s.cfg.Temporal.CancelWorkflow(ctx, txn.WorkflowID, ""); err != nil {
		return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "could not cancel the workflow: "+err.Error())
	}
	s.log.Info("transaction stop requested", "transaction", id, "workflow_id", txn.WorkflowID)
	return c.JSON(http.StatusAccepted, map[string]any{"task_uuid": id, "workflow_id": txn.WorkflowID, "status": "stopping"})
}

// retryTransaction is POST /transactions/:uuid/retry: it runs a failed or
// stopped transaction's workflow again under the same ID. Planning finds the
// graphs already planned and reopens what did not succeed, so the retry
// resumes from the failed and never-run tasks, not from the start.
func (s *Server) retryTransaction(c echo.Context) error {
	id, err := uuidParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	// A transaction whose workflow ended behind anneal's back is ended
	// first, so that it can be retried.
	current, err := s.fuel.Transaction(ctx, id)
	if err != nil {
		return err
	}
	if _, _, err := s.reconcileTransaction(ctx, current); err != nil {
		return err
	}
	txn, err := s.fuel.ReopenTransaction(ctx, id, func(txn *fuel.Transaction) error {
		// The transaction row says it ended a moment before its workflow
		// closes: wait for the previous run to close first.
		closing, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = s.cfg.Temporal.GetWorkflow(closing, txn.WorkflowID, "").Get(closing, nil)
		return s.startWorkflow(ctx, txn, fmt.Sprintf("retry of transaction %s", txn.ID), map[string]any{"retry": true})
	})
	if err != nil {
		return err
	}
	s.log.Info("transaction retried", "transaction", id, "workflow_id", txn.WorkflowID)
	return s.transactionAccepted(c, txn, nil)
}
