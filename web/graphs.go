package web

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// graphRoutes registers the graph routes of releases, plugins and
// deployments.
func (s *Server) graphRoutes(admin *echo.Group) {
	admin.GET("/deployments/:id/graphs", s.listDeploymentGraphs)
	admin.GET("/deployments/:id/graphs/:type", s.getDeploymentGraph)
}

func (s *Server) listDeploymentGraphs(c echo.Context) error {
	ctx := c.Request().Context()
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	types, err := s.cfg.Store.GraphTypes(ctx, dep)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"types": types})
}

func (s *Server) getDeploymentGraph(c echo.Context) error {
	ctx := c.Request().Context()
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	graph, err := s.cfg.Store.ResolveGraph(ctx, dep, c.Param("type"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, graph)
}
