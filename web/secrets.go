package web

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/secrets/codec"
)

// secretRoutes are a deployment's named secrets (values in, names out)
// and the Temporal codec server.
func (s *Server) secretRoutes(api, admin *echo.Group) {
	admin.GET("/deployments/:id/secrets", s.listSecrets)
	admin.PUT("/deployments/:id/secrets/:name", s.putSecret)
	admin.DELETE("/deployments/:id/secrets/:name", s.deleteSecret)

	// The codec server of the Temporal Web UI (and of `temporal --codec-
	// endpoint`): the browser calls it across origins, so its preflight is
	// answered before authentication; the calls themselves need an
	// operator or admin token.
	cors := middleware.CORSWithConfig(middleware.CORSConfig{
		AllowOrigins:     s.codecOrigins(),
		AllowMethods:     []string{http.MethodPost, http.MethodOptions},
		AllowHeaders:     []string{echo.HeaderAuthorization, echo.HeaderContentType, "X-Namespace"},
		AllowCredentials: true,
	})
	c := api.Group("/codec", cors, s.authorize)
	c.POST("/encode", s.codec)
	c.POST("/decode", s.codec)
}

// codecOrigins are the origins allowed to call the codec server: the
// configured ones, else the Temporal Web UI's.
func (s *Server) codecOrigins() []string {
	if len(s.cfg.CodecOrigins) > 0 {
		return s.cfg.CodecOrigins
	}
	if u, err := url.Parse(s.cfg.TemporalUI); err == nil && u.Scheme != "" && u.Host != "" {
		return []string{u.Scheme + "://" + u.Host}
	}
	return []string{"http://127.0.0.1:8233", "http://localhost:8233"}
}

// putSecret: PUT /deployments/:id/secrets/:name {"value"} → 201 or 200,
// the secret without its value.
func (s *Server) putSecret(c echo.Context) error {
	var req struct {
		Value *string `json:"value"`
	}
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	if req.Value == nil {
		return models.Invalid("value", "is required (the secret's value, a string)")
	}
	sec, created, err := s.cfg.Store.SetSecret(c.Request().Context(), c.Param("id"), c.Param("name"), *req.Value)
	if err != nil {
		return err
	}
	s.log.Info("secret set", "deployment", c.Param("id"), "secret", sec.Name, "key_id", sec.KeyID, "created", created)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, sec)
}

// listSecrets: GET /deployments/:id/secrets → the names, never the values.
func (s *Server) listSecrets(c echo.Context) error {
	list, err := s.cfg.Store.Secrets(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return pageSlice(c, list, func(sec models.Secret) string { return sec.Name })
}

// deleteSecret: DELETE /deployments/:id/secrets/:name → 204.
func (s *Server) deleteSecret(c echo.Context) error {
	if err := s.cfg.Store.DeleteSecret(c.Request().Context(), c.Param("id"), c.Param("name")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// codec serves POST /codec/encode and /codec/decode: the Temporal codec
// server protocol over the server's keys.
func (s *Server) codec(c echo.Context) error {
	if s.cfg.Store.Keys == nil {
		return apiError(http.StatusServiceUnavailable, "no_secret_key", models.ErrNoSecretKey.Error())
	}
	req := c.Request()
	if !strings.HasPrefix(req.Header.Get(echo.HeaderContentType), echo.MIMEApplicationJSON) && req.Header.Get(echo.HeaderContentType) != "" {
		return apiError(http.StatusUnsupportedMediaType, "unsupported_media_type", "the codec takes application/json (Temporal Payloads)")
	}
	codec.Handler(s.cfg.Store.Keys).ServeHTTP(c.Response(), req)
	return nil
}
