package web

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// A workflow Temporal ended behind anneal's back (`temporal workflow
// terminate`, a timeout, a history limit) never records its end, so its
// row would stay unfinished and hold its nodes for ever. The reconciler
// compares unfinished rows with their workflows and ends the rows of
// workflows that are gone, saying what happened and how to retry; stop and
// retry do the same for their transaction before they answer.

// defaultReconcileGrace is how old an unfinished row must be before the
// periodic reconciler looks at it: younger ones are still starting.
const defaultReconcileGrace = time.Minute

func (s *Server) reconcileGrace() time.Duration {
	if s.cfg.ReconcileGrace > 0 {
		return s.cfg.ReconcileGrace
	}
	return defaultReconcileGrace
}

// workflowGone says whether the latest run of a workflow has closed (or
// does not exist), and how, as a lower-case word: "terminated",
// "timed_out", "failed", "canceled", "completed", "not found".
func (s *Server) workflowGone(ctx context.Context, id string) (bool, string, error) {
	desc, err := s.cfg.Temporal.DescribeWorkflowExecution(ctx, id, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return true, "not found", nil
	case err != nil:
		return false, "", fmt.Errorf("look up workflow %s: %w", id, err)
	}
	status := desc.GetWorkflowExecutionInfo().GetStatus()
	if status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return false, "", nil
	}
	return true, strings.ToLower(strings.TrimPrefix(status.String(), "WORKFLOW_EXECUTION_STATUS_")), nil
}

// reconcileTransaction ends txn's row if its workflow is gone while the row
// is unfinished, and returns the row as it is then; changed says whether
// it had to.
func (s *Server) reconcileTransaction(ctx context.Context, txn *fuel.Transaction) (*fuel.Transaction, bool, error) {
	if txn.Status != models.TxPending && txn.Status != models.TxRunning {
		return txn, false, nil
	}
	gone, how, err := s.workflowGone(ctx, txn.WorkflowID)
	if err != nil || !gone {
		return txn, false, err
	}
	status := models.TxError
	reason := fmt.Sprintf("its workflow %s is %s in Temporal (ended outside anneal: terminated, timed out or failed): "+
		"its running runs were failed and the rest cancelled; fix the cause, then retry with POST /api/v1/transactions/%s/retry",
		txn.WorkflowID, how, txn.ID)
	if how == "canceled" {
		status = models.TxStopped
		reason = fmt.Sprintf("its workflow %s was cancelled in Temporal before it recorded its end: its running runs were failed "+
			"and the rest cancelled; retry with POST /api/v1/transactions/%s/retry", txn.WorkflowID, txn.ID)
	}
	ended, changed, err := s.fuel.EndAbandonedTransaction(ctx, txn.ID, status, reason)
	if err != nil || !changed {
		return ended, false, err
	}
	s.log.Warn("transaction ended behind anneal's back", "transaction", txn.ID, "workflow_id", txn.WorkflowID, "workflow", how)
	s.kickAnnealer(ctx, "transaction "+txn.ID.String()+" ended outside anneal") // its nodes are free
	return ended, true, nil
}

// Reconcile is one pass of the reconciler: every transaction and software
// deployment left unfinished by a workflow that is gone ends in error with
// a reason that says what happened and how to retry. (Noderoles in
// transition whose run is gone are the annealer's: see RecoverTransitions.)
func (s *Server) Reconcile(ctx context.Context) error {
	txns, err := s.fuel.UnfinishedTransactions(ctx, s.reconcileGrace())
	if err != nil {
		return err
	}
	for i := range txns {
		if _, _, err := s.reconcileTransaction(ctx, &txns[i]); err != nil {
			return err
		}
	}
	rounds, err := s.heat.UnfinishedSoftwareRounds(ctx, s.reconcileGrace())
	if err != nil {
		return err
	}
	for _, d := range rounds {
		gone, how, err := s.workflowGone(ctx, d.WorkflowID)
		if err != nil {
			return err
		}
		if !gone {
			continue
		}
		reason := fmt.Sprintf("its workflow %s is %s in Temporal (ended outside anneal) before round %d finished; "+
			"run it again with PUT /api/v1/software_deployments/%d", d.WorkflowID, how, d.Round, d.ID)
		changed, err := s.heat.FinishSoftwareRound(ctx, d.ID, d.Round, contract.SoftwareFailed, reason)
		if err != nil {
			return err
		}
		if changed {
			s.log.Warn("software deployment ended behind anneal's back", "software_deployment", d.ID, "round", d.Round, "workflow", how)
		}
	}
	return nil
}

// RunReconciler runs Reconcile every period until ctx ends; a failed pass
// is logged and tried again at the next.
func (s *Server) RunReconciler(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("reconciliation failed; trying again later", "error", err)
		}
	}
}
