package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
)

// nodeSSHRoutes: how the ssh jig reaches a node (admin only, both ways:
// the answer is redacted, but it says how to log in to the node).
//
//	GET /nodes/:id/ssh  → user, port, host, known_hosts with fingerprints, private_key "***"
//	PUT /nodes/:id/ssh  {"user","port","host","private_key","known_hosts"}; a field left out keeps its value
func (s *Server) nodeSSHRoutes(g *echo.Group) {
	g.GET("/nodes/:id/ssh", s.getNodeSSH)
	g.PUT("/nodes/:id/ssh", s.putNodeSSH)
}

func (s *Server) getNodeSSH(c echo.Context) error {
	v, err := s.cfg.Store.NodeSSHSettings(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Server) putNodeSSH(c echo.Context) error {
	var req models.NodeSSHInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	v, err := s.cfg.Store.SetNodeSSH(c.Request().Context(), c.Param("id"), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}
