package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// graphRoutes registers the plugin routes and the graph routes of releases,
// plugins and deployments.
func (s *Server) graphRoutes(admin *echo.Group) {
	admin.GET("/plugins", s.listPlugins)
	admin.POST("/plugins", s.createPlugin)
	admin.GET("/plugins/:id", s.getPlugin)
	admin.GET("/deployments/:id/plugins", s.listDeploymentPlugins)
	admin.PUT("/deployments/:id/plugins/:plugin", s.enablePlugin)
	admin.DELETE("/deployments/:id/plugins/:plugin", s.disablePlugin)

	for _, level := range []struct{ prefix, kind string }{
		{"/releases", models.OwnerRelease},
		{"/plugins", models.OwnerPlugin},
		{"/deployments", models.OwnerDeployment},
	} {
		one := level.prefix + "/:id/graphs/:type"
		if level.kind != models.OwnerDeployment {
			admin.GET(level.prefix+"/:id/graphs", s.listOwnGraphs(level.kind))
		}
		admin.GET(one, s.getOwnGraph(level.kind))
		admin.POST(one, s.writeGraph(level.kind, http.MethodPost))
		admin.PUT(one, s.writeGraph(level.kind, http.MethodPut))
		admin.PATCH(one, s.writeGraph(level.kind, http.MethodPatch))
		admin.DELETE(one, s.deleteGraph(level.kind))
	}
	admin.GET("/deployments/:id/graphs", s.listDeploymentGraphs)
	admin.GET("/deployments/:id/graphs/:type/tasks", s.getMergedGraph)
	admin.GET("/deployments/:id/graphs/:type/graph.gv", s.getGraphDOT)
}

func (s *Server) listPlugins(c echo.Context) error {
	plugins, err := s.cfg.Store.Plugins(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, plugins)
}

func (s *Server) createPlugin(c echo.Context) error {
	var req models.PluginInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	p, err := s.cfg.Store.CreatePlugin(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, p)
}

func (s *Server) getPlugin(c echo.Context) error {
	p, err := s.cfg.Store.Plugin(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// listDeploymentPlugins lists the plugins a deployment enables, in the order
// their graphs merge.
func (s *Server) listDeploymentPlugins(c echo.Context) error {
	plugins, err := s.cfg.Store.DeploymentPlugins(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, plugins)
}

func (s *Server) enablePlugin(c echo.Context) error {
	if err := s.cfg.Store.EnablePlugin(c.Request().Context(), c.Param("id"), c.Param("plugin")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) disablePlugin(c echo.Context) error {
	if err := s.cfg.Store.DisablePlugin(c.Request().Context(), c.Param("id"), c.Param("plugin")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func owner(kind string, c echo.Context) models.GraphOwner {
	return models.GraphOwner{Kind: kind, Ref: c.Param("id")}
}

// listOwnGraphs lists a release's or plugin's own graphs.
func (s *Server) listOwnGraphs(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		own, err := s.cfg.Store.OwnGraphs(c.Request().Context(), owner(kind, c))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"own": own})
	}
}

// listDeploymentGraphs lists a deployment's own graphs and every type it can
// execute (its release's, its enabled plugins' and its own).
func (s *Server) listDeploymentGraphs(c echo.Context) error {
	ctx := c.Request().Context()
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	own, err := s.cfg.Store.OwnGraphs(ctx, models.GraphOwner{Kind: models.OwnerDeployment, Ref: c.Param("id")})
	if err != nil {
		return err
	}
	types, err := s.cfg.Store.GraphTypes(ctx, dep)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"own": own, "available": types})
}

// getOwnGraph returns the owner's own graph of a type, not merged.
func (s *Server) getOwnGraph(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		g, err := s.cfg.Store.OwnGraph(c.Request().Context(), owner(kind, c), c.Param("type"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, g.View())
	}
}

// writeGraph is POST (create; 409 if it exists), PUT (replace or create) and
// PATCH (merge; 404 if none) of an owner's graph.
func (s *Server) writeGraph(kind, method string) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req models.GraphInput
		if err := bindStrict(c, &req); err != nil {
			return err
		}
		ctx, o, typ := c.Request().Context(), owner(kind, c), c.Param("type")
		var (
			g       *models.Graph
			created bool
			err     error
		)
		switch method {
		case http.MethodPost:
			g, err = s.cfg.Store.CreateGraph(ctx, o, typ, req)
			created = true
		case http.MethodPut:
			g, created, err = s.cfg.Store.ReplaceGraph(ctx, o, typ, req)
		default:
			g, err = s.cfg.Store.PatchGraph(ctx, o, typ, req)
		}
		if err != nil {
			return err
		}
		if created {
			c.Response().Header().Set(echo.HeaderLocation, c.Request().URL.Path)
			return c.JSON(http.StatusCreated, g.View())
		}
		return c.JSON(http.StatusOK, g.View())
	}
}

func (s *Server) deleteGraph(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := s.cfg.Store.DeleteGraph(c.Request().Context(), owner(kind, c), c.Param("type")); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	}
}

// getMergedGraph returns the graph a deployment executes: release, enabled
// plugins and its own merged (plus the tasks of roles no task selects).
func (s *Server) getMergedGraph(c echo.Context) error {
	ctx := c.Request().Context()
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	graph, err := s.cfg.Store.ExecutableGraph(ctx, dep, c.Param("type"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, graph)
}

// getGraphDOT renders the merged graph planned on the deployment's nodes in
// Graphviz DOT; a cycle is a 422 with its path, as for execute.
func (s *Server) getGraphDOT(c echo.Context) error {
	ctx := c.Request().Context()
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	p, err := s.cfg.Store.PlanPreview(ctx, dep, c.Param("type"))
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "text/vnd.graphviz; charset=utf-8", []byte(plan.DOT(p, dep.Name+"/"+c.Param("type"))))
}
