package web

import (
	"embed"
	"net/http"
	"path"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
)

// dashboardFiles are the dashboard's page, script and style sheet, built
// into the binary: a static page that signs in with a token and reads the
// JSON API and the live event stream (no server-side sessions, no build
// step).
//
//go:embed dashboard/*
var dashboardFiles embed.FS

// dashboardCSP keeps the page to its own files; it talks only to this API.
const dashboardCSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; " +
	"script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// dashboardRoutes serves the dashboard at / and its files under /ui/. No
// token is needed to load them: the page asks for one and every API call
// it makes is authorised as any other.
func (s *Server) dashboardRoutes(e *echo.Echo) {
	e.GET("/", func(c echo.Context) error { return serveDashboardFile(c, "index.html") })
	e.GET("/ui/:file", func(c echo.Context) error { return serveDashboardFile(c, c.Param("file")) })
}

var dashboardTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

func serveDashboardFile(c echo.Context, name string) error {
	ctype, ok := dashboardTypes[path.Ext(name)]
	if !ok || strings.ContainsAny(name, "/\\") {
		return apiError(http.StatusNotFound, "not_found", "no dashboard file "+models.Clip(name))
	}
	body, err := dashboardFiles.ReadFile("dashboard/" + name)
	if err != nil {
		return apiError(http.StatusNotFound, "not_found", "no dashboard file "+models.Clip(name))
	}
	h := c.Response().Header()
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, ctype, body)
}

// whoamiView is GET /whoami: the caller's token and where the Temporal Web
// UI is, for the dashboard to show what the token may do.
type whoamiView struct {
	Name  string            `json:"name"`
	Scope string            `json:"scope"`
	Links map[string]string `json:"links"`
}

func (s *Server) whoami(c echo.Context) error {
	p := principal(c)
	links := map[string]string{}
	if ui := s.temporalUILink("x"); ui != "" {
		links["temporal_ui"] = strings.TrimSuffix(ui, "/x")
	}
	return c.JSON(http.StatusOK, whoamiView{Name: p.Name, Scope: p.Scope, Links: links})
}
