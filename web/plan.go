package web

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models/fuel"
)

// dryRunPlanWait bounds how long the answer to a dry run waits for its
// workflow to plan every graph; past it the answer says where the plan
// will be.
const dryRunPlanWait = 30 * time.Second

// getTransactionPlan is GET /transactions/:uuid/plan: the plan of any
// transaction, from its persisted runs and edges.
func (s *Server) getTransactionPlan(c echo.Context) error {
	id, err := uuidParam(c)
	if err != nil {
		return err
	}
	p, err := s.fuel.TransactionPlan(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// executeExtras is what the answer to an execute adds to the transaction:
// the pre-deployment check's findings ("check": warnings, never a refusal;
// {"ok": false, "error"} when the check itself could not run) and, for a
// dry run, the plan ("plan"), once the workflow has planned every graph.
func (s *Server) executeExtras(ctx context.Context, txn *fuel.Transaction, deployment string, extra map[string]any) map[string]any {
	if extra == nil {
		extra = map[string]any{}
	}
	check, err := s.fuel.CheckDeployment(ctx, deployment)
	if err != nil {
		s.log.Warn("the pre-deployment check could not run", "deployment", deployment, "error", err)
		extra["check"] = map[string]any{"ok": false, "error": "the pre-deployment check could not run: " + err.Error()}
	} else {
		extra["check"] = check
	}
	if !txn.DryRun {
		return extra
	}
	planURL := "/api/v1/transactions/" + txn.ID.String() + "/plan"
	wait, cancel := context.WithTimeout(ctx, dryRunPlanWait)
	defer cancel()
	if err := s.cfg.Temporal.GetWorkflow(wait, txn.WorkflowID, "").Get(wait, nil); err != nil && wait.Err() != nil {
		extra["plan"] = nil
		extra["plan_url"] = planURL
		extra["plan_pending"] = "the dry run is still planning; GET " + planURL
		return extra
	} else if err != nil {
		// The workflow failed (a graph that cannot be planned): the plan
		// shows what was planned, the transaction says why.
		extra["plan_error"] = err.Error()
	}
	p, err := s.fuel.TransactionPlan(ctx, txn.ID)
	if err != nil {
		s.log.Warn("could not load the plan of a dry run", "transaction", txn.ID, "error", err)
		extra["plan"] = nil
		extra["plan_url"] = planURL
		return extra
	}
	extra["plan"] = p
	extra["plan_url"] = planURL
	return extra
}
