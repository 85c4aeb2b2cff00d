package web

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models/fuel"
)

// scenarioRoutes registers the scenario routes: named, ordered acts (graph
// type + nodes, explicit or selected by a CEL expression) run as one
// transaction.
func (s *Server) scenarioRoutes(admin *echo.Group) {
	admin.GET("/scenarios", s.listScenarios)
	admin.POST("/scenarios", s.createScenario)
	admin.GET("/scenarios/:name", s.getScenario)
	admin.DELETE("/scenarios/:name", s.deleteScenario)
	admin.POST("/scenarios/:name/execute", s.executeScenarioHandler)
}

// listScenarios is GET /scenarios: every scenario with its acts, as the
// seed's response ([{"id", "name", "scenario": [...]}, ...]).
func (s *Server) listScenarios(c echo.Context) error {
	list, err := s.fuel.Scenarios(c.Request().Context())
	if err != nil {
		return err
	}
	return pageSlice(c, list, func(sc fuel.Scenario) int64 { return sc.ID })
}

// createScenario is POST /scenarios {"name", "description", "scenario":
// [{"graph_type", "nodes", "max_nodes_in_flight", "failure_threshold"}]}.
// A bad node expression is refused with its line and column.
func (s *Server) createScenario(c echo.Context) error {
	var req fuel.ScenarioInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	sc, err := s.fuel.CreateScenario(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, sc)
}

func (s *Server) getScenario(c echo.Context) error {
	sc, err := s.fuel.Scenario(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, sc)
}

// deleteScenario is DELETE /scenarios/:name; built-in scenarios are a 409.
func (s *Server) deleteScenario(c echo.Context) error {
	if err := s.fuel.DeleteScenario(c.Request().Context(), c.Param("name")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type executeScenarioRequest struct {
	Deployment       idOrName `json:"deployment"`
	DryRun           bool     `json:"dry_run"`
	Force            bool     `json:"force"`
	MaxNodesInFlight int      `json:"max_nodes_in_flight"`
	FailureThreshold *int     `json:"failure_threshold"`
}

// executeScenarioHandler is POST /scenarios/:name/execute {"deployment",
// "dry_run", "force"} → 202 {"task_uuid", ..., "acts": [what each act
// selected]}.
func (s *Server) executeScenarioHandler(c echo.Context) error {
	var req executeScenarioRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	txn, sp, err := s.executeScenario(c.Request().Context(), c.Param("name"), fuel.ScenarioExecuteInput{
		Deployment: string(req.Deployment), DryRun: req.DryRun, Force: req.Force,
		MaxNodesInFlight: req.MaxNodesInFlight, FailureThreshold: req.FailureThreshold,
	})
	if err != nil {
		return err
	}
	return s.transactionAccepted(c, txn, s.executeExtras(c.Request().Context(), txn, string(req.Deployment),
		map[string]any{"scenario": sp.Scenario.Name, "acts": sp.Acts}))
}

// executeScenario evaluates a scenario's acts over the deployment's nodes
// and starts them as one transaction (one graph per act that selects a
// node). Committing a snapshot should start "deploy-changes" through it.
func (s *Server) executeScenario(ctx context.Context, name string, in fuel.ScenarioExecuteInput) (*fuel.Transaction, *fuel.ScenarioPlan, error) {
	sp, err := s.fuel.PrepareScenario(ctx, name, in)
	if err != nil {
		return nil, nil, err
	}
	txn, err := s.startTransaction(ctx, sp.Input, "scenario "+sp.Scenario.Name, map[string]any{"scenario": sp.Scenario.Name})
	if err != nil {
		return nil, nil, sp.MapError(err)
	}
	return txn, sp, nil
}
