package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
)

// snapshotRoutes registers the Crowbar model's routes: a deployment's
// snapshots, proposing and committing, binding roles to nodes and the
// noderoles.
func (s *Server) snapshotRoutes(admin *echo.Group) {
	admin.GET("/deployments/:id/snapshots", s.listSnapshots)
	admin.POST("/deployments/:id/snapshots/propose", s.proposeSnapshot)
	admin.POST("/deployments/:id/snapshots/commit", s.commitProposed)
	admin.GET("/snapshots/:id", s.getSnapshot)
	admin.POST("/snapshots/:id/commit", s.commitSnapshot)
	admin.POST("/snapshots/:id/noderoles", s.bindRole)
	admin.GET("/noderoles/:id", s.getNodeRole)
	admin.PATCH("/noderoles/:id", s.updateNodeRole)
	admin.DELETE("/noderoles/:id", s.removeNodeRole)
	admin.GET("/snapshots/:id/diff", s.diffSnapshot)
	admin.POST("/noderoles/:id/retry", s.retryNodeRole)
}

// numericID reads a numeric :id.
func numericID(c echo.Context, what string) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, &models.InputError{Status: http.StatusBadRequest, Field: "id", Reason: fmt.Sprintf("%q is not a %s id", c.Param("id"), what)}
	}
	return id, nil
}

func (s *Server) listSnapshots(c echo.Context) error {
	snaps, err := s.crowbar.Snapshots(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return pageSlice(c, snaps, func(sn crowbar.Snapshot) int64 { return sn.ID })
}

func (s *Server) proposeSnapshot(c echo.Context) error {
	snap, err := s.crowbar.ProposeSnapshot(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	full, err := s.crowbar.Snapshot(c.Request().Context(), snap.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, full)
}

func (s *Server) getSnapshot(c echo.Context) error {
	id, err := numericID(c, "snapshot")
	if err != nil {
		return err
	}
	snap, err := s.crowbar.Snapshot(c.Request().Context(), id)
	if err != nil {
		return err
	}
	if snap.NodeRoles == nil {
		snap.NodeRoles = []crowbar.NodeRole{}
	}
	return c.JSON(http.StatusOK, snap)
}

// commitProposed commits the deployment's proposed snapshot, whatever its
// id: propose, bind, commit, all by the deployment's name.
func (s *Server) commitProposed(c echo.Context) error {
	snap, err := s.crowbar.ProposedSnapshot(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return s.commit(c, snap.ID)
}

func (s *Server) commitSnapshot(c echo.Context) error {
	id, err := numericID(c, "snapshot")
	if err != nil {
		return err
	}
	return s.commit(c, id)
}

// commit commits a snapshot, wakes the annealer and starts deploy-changes.
func (s *Server) commit(c echo.Context, id int64) error {
	ctx := c.Request().Context()
	committed, err := s.crowbar.CommitSnapshot(ctx, id)
	if err != nil {
		return err
	}
	snap, err := s.crowbar.Snapshot(ctx, id)
	if err != nil {
		return err
	}
	snap.MovedNodes = committed.MovedNodes
	annealer := s.kickAnnealer(ctx, fmt.Sprintf("snapshot %d committed", id))
	if annealer == nil {
		annealer = map[string]any{"woken": true}
	}
	return c.JSON(http.StatusOK, struct {
		*crowbar.Snapshot
		Annealer      map[string]any `json:"annealer"`
		DeployChanges map[string]any `json:"deploy_changes"`
	}{snap, annealer, s.deployChanges(ctx, snap.DeploymentID)})
}

// deployChanges starts the built-in deploy-changes scenario on a deployment
// whose snapshot was just committed: provision its new nodes, then deploy
// the affected ones. The commit stands whatever happens here; the answer
// says what started, that there was nothing to do, or why it could not
// start and how to start it by hand.
func (s *Server) deployChanges(ctx context.Context, deploymentID int64) map[string]any {
	dep := strconv.FormatInt(deploymentID, 10)
	txn, _, err := s.executeScenario(ctx, fuel.DeployChangesScenario, fuel.ScenarioExecuteInput{Deployment: dep})
	var ie *models.InputError
	switch {
	case err == nil:
		return map[string]any{"task_uuid": txn.ID, "workflow_id": txn.WorkflowID}
	case errors.As(err, &ie) && ie.Details["nothing_to_run"] == true:
		return map[string]any{"nothing_to_run": true}
	default:
		s.log.Error("deploy-changes did not start after a commit", "deployment", dep, "error", err)
		return map[string]any{"error": err.Error(),
			"hint": "start it with POST /api/v1/scenarios/" + fuel.DeployChangesScenario + "/execute {\"deployment\": " + dep + "}"}
	}
}

type bindRoleRequest struct {
	Node idOrName `json:"node"`
	Role idOrName `json:"role"`
}

// bindRole is add_to_node_in_snapshot: 201 with a new noderole, 200 with
// the existing binding.
func (s *Server) bindRole(c echo.Context) error {
	id, err := numericID(c, "snapshot")
	if err != nil {
		return err
	}
	var req bindRoleRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	nr, created, err := s.crowbar.BindRole(c.Request().Context(), id, crowbar.BindInput{Node: string(req.Node), Role: string(req.Role)})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, nr)
}

func (s *Server) getNodeRole(c echo.Context) error {
	id, err := numericID(c, "noderole")
	if err != nil {
		return err
	}
	nr, err := s.crowbar.NodeRole(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.nodeRoleView(nr))
}

type updateNodeRoleRequest struct {
	UserData map[string]any `json:"user_data"`
}

func (s *Server) updateNodeRole(c echo.Context) error {
	id, err := numericID(c, "noderole")
	if err != nil {
		return err
	}
	var req updateNodeRoleRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	nr, err := s.crowbar.UpdateNodeRole(c.Request().Context(), id, req.UserData)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, nr)
}

func (s *Server) retryNodeRole(c echo.Context) error {
	id, err := numericID(c, "noderole")
	if err != nil {
		return err
	}
	nr, err := s.crowbar.RetryNodeRole(c.Request().Context(), id)
	if err != nil {
		return err
	}
	s.kickAnnealer(c.Request().Context(), fmt.Sprintf("noderole %d retried", id))
	return c.JSON(http.StatusOK, nr)
}

// removeNodeRole removes a binding from a proposed snapshot; ?cascade=true
// removes the noderoles that need it with it (else they are named in a
// 409). 200 with the removed noderoles.
func (s *Server) removeNodeRole(c echo.Context) error {
	id, err := numericID(c, "noderole")
	if err != nil {
		return err
	}
	cascade, err := boolQuery(c, "cascade")
	if err != nil {
		return err
	}
	removed, err := s.crowbar.RemoveNodeRole(c.Request().Context(), id, cascade)
	if err != nil {
		return err
	}
	s.log.Info("noderole removed from its proposed snapshot", "noderole", id, "snapshot", removed[0].SnapshotID, "with_descendants", len(removed)-1)
	return c.JSON(http.StatusOK, map[string]any{"removed": removed})
}

// diffSnapshot shows what a snapshot changes against its deployment's
// committed snapshot.
func (s *Server) diffSnapshot(c echo.Context) error {
	id, err := numericID(c, "snapshot")
	if err != nil {
		return err
	}
	d, err := s.crowbar.DiffSnapshot(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}
