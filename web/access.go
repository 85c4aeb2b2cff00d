package web

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
)

// access is what an operators' route asks of a token's scope.
type access int

// The three levels of the operators' routes.
const (
	// accessRead: any operator token (viewer, operator, admin).
	accessRead access = iota
	// accessOperate: operator or admin, for running what exists.
	accessOperate
	// accessAdmin: admin only (tokens, imports, everything else that
	// writes).
	accessAdmin
)

// operatorRoutes are the writes an operator token may make: execute,
// stop, retry, bind, commit and tag. Every other write needs admin; every
// read (GET) but the tokens' is open to viewers.
var operatorRoutes = map[string]bool{
	"POST /api/v1/graphs/execute":                    true,
	"POST /api/v1/scenarios/:name/execute":           true,
	"POST /api/v1/transactions/:uuid/stop":           true,
	"POST /api/v1/transactions/:uuid/retry":          true,
	"POST /api/v1/noderoles/:id/retry":               true,
	"POST /api/v1/deployments/:id/snapshots/propose": true,
	"POST /api/v1/deployments/:id/snapshots/commit":  true,
	"POST /api/v1/snapshots/:id/noderoles":           true,
	"DELETE /api/v1/noderoles/:id":                   true,
	"POST /api/v1/snapshots/:id/commit":              true,
	"POST /api/v1/nodes/:id/tags":                    true,
	"DELETE /api/v1/nodes/:id/tags":                  true,
	// Reading payloads in the Temporal Web UI is an operator's job.
	"POST /api/v1/codec/decode": true,
	"POST /api/v1/codec/encode": true,
}

// Every other GET is a read open to viewers, the live event stream
// (GET /api/v1/events) and GET /api/v1/whoami included: the dashboard
// signed in with a viewer token sees everything and acts on nothing. The
// dashboard's own files (GET / and /ui/:file) need no token at all.

// adminReads are the reads only an admin may make.
var adminReads = map[string]bool{
	"GET /api/v1/tokens":        true,
	"GET /api/v1/nodes/:id/ssh": true,
}

// routeAccess is what the route (Echo's path template) needs.
func routeAccess(method, path string) access {
	key := method + " " + path
	switch {
	case adminReads[key]:
		return accessAdmin
	case method == http.MethodGet || method == http.MethodHead:
		return accessRead
	case operatorRoutes[key]:
		return accessOperate
	}
	return accessAdmin
}

// scopeAllows reports whether a token of scope may use a route needing a.
func scopeAllows(scope string, a access) bool {
	switch scope {
	case models.ScopeAdmin:
		return true
	case models.ScopeOperator:
		return a <= accessOperate
	case models.ScopeViewer:
		return a == accessRead
	}
	return false // enroll tokens only register agents
}

// authorize admits operator tokens whose scope allows the route.
func (s *Server) authorize(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := s.authenticate(c)
		if err != nil {
			return err
		}
		if p.IsAgent() {
			return apiError(http.StatusForbidden, "forbidden", "a node agent's credential is for /api/v1/agent/* only; use an operator token here")
		}
		a := routeAccess(c.Request().Method, c.Path())
		if !scopeAllows(p.Scope, a) {
			need := map[access]string{accessRead: "viewer, operator or admin", accessOperate: "operator or admin", accessAdmin: "admin"}[a]
			return apiError(http.StatusForbidden, "forbidden", fmt.Sprintf("%s %s needs a token of scope %s; this one (%q) is of scope %s",
				c.Request().Method, c.Path(), need, p.Name, strings.TrimSpace(p.Scope)))
		}
		return next(c)
	}
}
