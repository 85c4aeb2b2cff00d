package web

import (
	"io"
	"mime"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey"
)

// deployableRoutes: Audrey deployables (seed 003), imported as the seed's XML
// or the same structure in YAML.
func (s *Server) deployableRoutes(g *echo.Group) {
	g.POST("/deployables", s.importDeployable)
	g.GET("/deployables", s.listDeployables)
	g.GET("/deployables/:id", s.getDeployable)
	g.DELETE("/deployables/:id", s.deleteDeployable)
}

// importDeployable: POST /api/v1/deployables[?deployment=<name or id>].
// Content-Type application/xml or text/xml: the seed's <template>,
// <assembly> and <deployable> documents (one after another, or in a wrapper
// element); application/yaml: {templates, assemblies, deployable}. Answers
// 201 with the deployable, its instances (UUID, node, status) with their
// own credentials (shown once), the ordering edges and the service map.
func (s *Server) importDeployable(c echo.Context) error {
	format, err := documentFormat(c)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: err.Error()}
	}
	ctx := c.Request().Context()
	imp, err := s.audrey.ImportDeployable(ctx, body, format, c.QueryParam("deployment"))
	if err != nil {
		return err
	}
	view, err := s.audrey.ViewDeployable(ctx, imp.Deployable, imp.Instances, imp.Tokens)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, view)
}

func documentFormat(c echo.Context) (string, error) {
	ct := c.Request().Header.Get(echo.HeaderContentType)
	mt, _, _ := mime.ParseMediaType(ct)
	switch mt {
	case "application/xml", "text/xml":
		return "xml", nil
	case "application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml":
		return "yaml", nil
	}
	return "", &models.InputError{Status: http.StatusUnsupportedMediaType, Field: "Content-Type",
		Reason: "send the deployable as application/xml (or text/xml) or application/yaml, not " + ct}
}

func (s *Server) listDeployables(c echo.Context) error {
	ds, err := s.audrey.Deployables(c.Request().Context())
	if err != nil {
		return err
	}
	return pageSlice(c, ds, func(d audrey.Deployable) int64 { return d.ID })
}

// getDeployable: GET /api/v1/deployables/:id (id, uuid or name).
func (s *Server) getDeployable(c echo.Context) error {
	ctx := c.Request().Context()
	d, insts, err := s.audrey.Deployable(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	view, err := s.audrey.ViewDeployable(ctx, d, insts, nil)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, view)
}
