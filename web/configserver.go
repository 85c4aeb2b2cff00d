package web

import (
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey"
	"github.com/anneal-dev/anneal/models/audrey/aeolus"
)

// configServerRoutes: Audrey's config server, at the root exactly as in the
// seed. Bodies are the seed's XML documents:
//
//	POST /configs/:uuid  <instance-config> → 201 stored, 400 invalid, 404 unknown uuid (an admin token, Conductor's
//	                       role, or the instance's own credential: the agent posts the config it was launched with)
//	GET  /configs/:uuid  → 200 complete <instance-config> with references resolved to values,
//	                       202 partial (resolved so far; unresolved parameters keep their <reference>),
//	                       204 partial but the assembly/service does not allow partial configs, 404
//	GET  /params/:uuid   → 200 <provided-parameters/> (nothing more needed), 202 with the
//	                       <provided-parameter name=".."/> still expected, 404
//	PUT  /reply/:uuid    <provided-parameters> with a <value> per <provided-parameter> → 200, 400, 404
//
// An instance authenticates with the bearer credential it got at import
// (401 without a valid one); an admin token is accepted too (operators
// inspecting, Conductor posting configs). An instance speaking for another
// instance's uuid gets the seed's 404 (that uuid is not known to it) and
// changes nothing.
func (s *Server) configServerRoutes(e *echo.Echo) {
	e.POST("/configs/:uuid", s.postConfig, s.instanceAuth())
	e.GET("/configs/:uuid", s.getConfig, s.instanceAuth())
	e.GET("/params/:uuid", s.getParams, s.instanceAuth())
	e.PUT("/reply/:uuid", s.putReply, s.instanceAuth())
}

const instanceKey = "audrey_instance"

// instanceAuth admits the instance's own credential or an admin token.
// Order: no valid credential 401, unknown uuid 404, another instance's
// uuid 404 too (as the seed answers an unknown uuid).
func (s *Server) instanceAuth() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx := c.Request().Context()
			token := bearer(c)
			if token == "" {
				return apiError(http.StatusUnauthorized, "unauthorized", "missing bearer token: send 'Authorization: Bearer <instance token>' as returned by the deployable import")
			}
			admin := false
			if strings.HasPrefix(token, "ann_") {
				p, err := s.auth.authenticate(ctx, token, s.cfg.Store.Authenticate)
				if err != nil && !errors.Is(err, models.ErrForbidden) {
					return err
				}
				admin = err == nil && p.Scope == models.ScopeAdmin
				if err == nil {
					c.Set(principalKey, p)
				}
			}
			var known bool
			if !admin {
				var err error
				if known, err = s.audrey.InstanceTokenExists(ctx, token); err != nil {
					return err
				}
				if !known {
					return apiError(http.StatusUnauthorized, "unauthorized", "unknown token: the config server wants the instance's own credential (or an admin token)")
				}
			}
			id, err := uuid.Parse(c.Param("uuid"))
			if err != nil {
				return apiError(http.StatusNotFound, "not_found", "no instance "+c.Param("uuid"))
			}
			in, err := s.audrey.Instance(ctx, id)
			if err != nil {
				return err
			}
			if !admin && models.HashSecret(token) != in.TokenHash {
				return apiError(http.StatusNotFound, "not_found", "no instance "+c.Param("uuid")+" for this credential: an instance speaks only for its own uuid")
			}
			c.Set(instanceKey, in)
			return next(c)
		}
	}
}

func instanceOf(c echo.Context) *audrey.DeployableInstance {
	in, _ := c.Get(instanceKey).(*audrey.DeployableInstance)
	return in
}

func xmlBlob(c echo.Context, status int, body []byte) error {
	return c.Blob(status, echo.MIMEApplicationXMLCharsetUTF8, body)
}

func (s *Server) postConfig(c echo.Context) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: err.Error()}
	}
	ic, err := aeolus.ParseInstanceConfig(body)
	if err != nil {
		return audrey.AudreyInputError(err, http.StatusBadRequest)
	}
	in := instanceOf(c)
	if err := s.audrey.ReplaceInstanceConfig(c.Request().Context(), in.UUID, ic); err != nil {
		return err
	}
	return xmlBlob(c, http.StatusCreated, aeolus.InstanceConfigXML(ic))
}

func (s *Server) getConfig(c echo.Context) error {
	res, status, err := s.audrey.FetchConfig(c.Request().Context(), instanceOf(c).UUID)
	if err != nil {
		return err
	}
	if status == http.StatusNoContent {
		return c.NoContent(http.StatusNoContent)
	}
	return xmlBlob(c, status, aeolus.ResolvedConfigXML(res))
}

func (s *Server) getParams(c echo.Context) error {
	pending, err := s.audrey.PendingParams(c.Request().Context(), instanceOf(c).UUID)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if len(pending) > 0 {
		status = http.StatusAccepted
	}
	return xmlBlob(c, status, aeolus.ProvidedParamsXML(pending))
}

func (s *Server) putReply(c echo.Context) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: err.Error()}
	}
	values, order, err := aeolus.ParseReply(body)
	if err != nil {
		return audrey.AudreyInputError(err, http.StatusBadRequest)
	}
	in, err := s.audrey.StoreReply(c.Request().Context(), instanceOf(c).UUID, values, order)
	if err != nil {
		return err
	}
	return xmlBlob(c, http.StatusOK, aeolus.ProvidedParamsXML(aeolus.PendingProvided(&in.Config, aeolus.Replies{in.Config.ID: in.Replies})))
}
