package web

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models/fuel"
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
		{"/releases", fuel.OwnerRelease},
		{"/plugins", fuel.OwnerPlugin},
		{"/deployments", fuel.OwnerDeployment},
	} {
		one := level.prefix + "/:id/graphs/:type"
		if level.kind != fuel.OwnerDeployment {
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
	plugins, err := s.fuel.Plugins(c.Request().Context())
	if err != nil {
		return err
	}
	return pageSlice(c, plugins, func(p fuel.Plugin) int64 { return p.ID })
}

func (s *Server) createPlugin(c echo.Context) error {
	var req fuel.PluginInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	p, err := s.fuel.CreatePlugin(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, p)
}

func (s *Server) getPlugin(c echo.Context) error {
	p, err := s.fuel.Plugin(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// listDeploymentPlugins lists the plugins a deployment enables, in the order
// their graphs merge.
func (s *Server) listDeploymentPlugins(c echo.Context) error {
	plugins, err := s.fuel.DeploymentPlugins(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return pageSlice(c, plugins, func(p fuel.Plugin) int64 { return p.ID })
}

func (s *Server) enablePlugin(c echo.Context) error {
	if err := s.fuel.EnablePlugin(c.Request().Context(), c.Param("id"), c.Param("plugin")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) disablePlugin(c echo.Context) error {
	if err := s.fuel.DisablePlugin(c.Request().Context(), c.Param("id"), c.Param("plugin")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func owner(kind string, c echo.Context) fuel.GraphOwner {
	return fuel.GraphOwner{Kind: kind, Ref: c.Param("id")}
}

// listOwnGraphs lists a release's or plugin's own graphs.
func (s *Server) listOwnGraphs(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		own, err := s.fuel.OwnGraphs(c.Request().Context(), owner(kind, c))
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
	own, err := s.fuel.OwnGraphs(ctx, fuel.GraphOwner{Kind: fuel.OwnerDeployment, Ref: c.Param("id")})
	if err != nil {
		return err
	}
	types, err := s.fuel.GraphTypes(ctx, dep)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"own": own, "available": types})
}

// getOwnGraph returns the owner's own graph of a type, not merged.
func (s *Server) getOwnGraph(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		g, err := s.fuel.OwnGraph(c.Request().Context(), owner(kind, c), c.Param("type"))
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
		var req fuel.GraphInput
		if err := bindStrict(c, &req); err != nil {
			return err
		}
		ctx, o, typ := c.Request().Context(), owner(kind, c), c.Param("type")
		var (
			g       *fuel.Graph
			created bool
			err     error
		)
		switch method {
		case http.MethodPost:
			g, err = s.fuel.CreateGraph(ctx, o, typ, req)
			created = true
		case http.MethodPut:
			g, created, err = s.fuel.ReplaceGraph(ctx, o, typ, req)
		default:
			g, err = s.fuel.PatchGraph(ctx, o, typ, req)
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
		if err := s.fuel.DeleteGraph(c.Request().Context(), owner(kind, c), c.Param("type")); err != nil {
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
	graph, err := s.fuel.ExecutableGraph(ctx, dep, c.Param("type"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, graph)
}

// getGraphDOT renders the merged graph planned on the deployment's nodes in
// Graphviz DOT; a cycle is a 422 with its path, as for execute.
// ?nodes=1,2 and ?tasks=a,b filter it as an execute's graphs[].nodes and
// graphs[].tasks do (node ids; edges only between the runs kept).
func (s *Server) getGraphDOT(c echo.Context) error {
	ctx := c.Request().Context()
	opts, err := fuel.ParsePlanFilters(listQuery(c, "nodes"), listQuery(c, "tasks"))
	if err != nil {
		return err
	}
	dep, err := s.cfg.Store.Deployment(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	p, err := s.fuel.PlanPreview(ctx, dep, c.Param("type"), opts)
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "text/vnd.graphviz; charset=utf-8", []byte(plan.DOT(p, dep.Name+"/"+c.Param("type"))))
}

// listQuery reads a list query parameter, comma-separated and/or repeated
// (?tasks=a,b or ?tasks=a&tasks=b); empty entries are dropped.
func listQuery(c echo.Context, name string) []string {
	var out []string
	for _, v := range c.QueryParams()[name] {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}
