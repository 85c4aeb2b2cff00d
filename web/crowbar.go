package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
)

// crowbarRoutes registers the Crowbar model's read side and its
// per-deployment settings: roles, noderoles across snapshots, and the
// deployment roles (the defaults a role's noderoles are seeded from).
func (s *Server) crowbarRoutes(admin *echo.Group) {
	admin.GET("/roles", s.listRoles)
	admin.GET("/roles/:id", s.getRole)
	admin.GET("/noderoles", s.listNodeRoles)
	admin.GET("/deployments/:id/roles", s.listDeploymentRoles)
	admin.GET("/deployments/:id/roles/:role", s.getDeploymentRole)
	admin.PUT("/deployments/:id/roles/:role", s.putDeploymentRole)
}

func (s *Server) listRoles(c echo.Context) error {
	roles, err := s.cfg.Store.Roles(c.Request().Context(), c.QueryParam("release"))
	if err != nil {
		return err
	}
	// In release order, then by name, as the store lists them.
	return pageSlice(c, roles, func(r models.Role) string { return fmt.Sprintf("%020d/%s", r.ReleaseID, r.Name) })
}

func (s *Server) getRole(c echo.Context) error {
	id, err := numericID(c, "role")
	if err != nil {
		return err
	}
	role, err := s.cfg.Store.Role(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, role)
}

// listNodeRoles is GET /noderoles?deployment=&snapshot=&node=&role=&state=.
func (s *Server) listNodeRoles(c echo.Context) error {
	f := crowbar.NodeRoleFilter{Deployment: c.QueryParam("deployment"), Node: c.QueryParam("node"),
		Role: c.QueryParam("role"), State: c.QueryParam("state")}
	if raw := c.QueryParam("snapshot"); raw != "" {
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || id <= 0 {
			return models.Invalid("snapshot", "%q is not a snapshot id", raw)
		}
		f.Snapshot = id
	}
	nrs, err := s.crowbar.NodeRoles(c.Request().Context(), f)
	if err != nil {
		return err
	}
	return pageSlice(c, nrs, func(nr crowbar.NodeRole) int64 { return nr.ID })
}

func (s *Server) listDeploymentRoles(c echo.Context) error {
	drs, err := s.crowbar.DeploymentRoles(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	// By role name, then id, as the store orders them.
	return pageSlice(c, drs, func(dr crowbar.DeploymentRoleView) string { return fmt.Sprintf("%s/%020d", dr.Role, dr.ID) })
}

func (s *Server) getDeploymentRole(c echo.Context) error {
	dr, err := s.crowbar.DeploymentRole(c.Request().Context(), c.Param("id"), c.Param("role"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, dr)
}

// deploymentRoleRequest keeps data raw, so that a value of the wrong JSON
// type is answered as bad input naming "data" (422), like a missing one,
// rather than as a malformed body.
type deploymentRoleRequest struct {
	Data json.RawMessage `json:"data"`
}

// putDeploymentRole creates (201) or replaces (200) a deployment's
// defaults for a role.
func (s *Server) putDeploymentRole(c echo.Context) error {
	var req deploymentRoleRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	data, err := jsonObject("data", req.Data)
	if err != nil {
		return err
	}
	dr, created, err := s.crowbar.SetDeploymentRole(c.Request().Context(), c.Param("id"), c.Param("role"), data)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, dr)
}

// jsonObject decodes a field that must hold a JSON object; absent, null or
// any other JSON value is bad input naming the field.
func jsonObject(field string, raw json.RawMessage) (map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, models.Invalid(field, "is required: a JSON object")
	}
	if raw[0] != '{' {
		return nil, models.Invalid(field, "must be a JSON object, not %s", jsonKind(raw[0]))
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		// bindStrict has checked the syntax already; kept for safety.
		return nil, models.Invalid(field, "is not a JSON object: %v", err)
	}
	return out, nil
}

// jsonKind names the kind of JSON value that starts with b.
func jsonKind(b byte) string {
	switch b {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}
