package web

import "github.com/labstack/echo/v4"

// tagRoutes registers the tag routes: tags of releases and deployments, and
// their assignment to nodes.
func (s *Server) tagRoutes(admin *echo.Group) {}
