package web

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	commonpb "go.temporal.io/api/common/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/codec"
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
// server protocol (protobuf JSON Payloads in and out) over the server's
// keys. Errors use the API's envelope.
func (s *Server) codec(c echo.Context) error {
	if s.cfg.Store.Keys == nil {
		return apiError(http.StatusServiceUnavailable, "no_secret_key", models.ErrNoSecretKey.Error())
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return apiError(http.StatusBadRequest, "bad_request", "cannot read the body: "+err.Error())
	}
	var in commonpb.Payloads
	if err := protojson.Unmarshal(body, &in); err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "payloads", Reason: "not Temporal payloads in protobuf JSON: " + err.Error()}
	}
	cd := &codec.Codec{Keys: s.cfg.Store.Keys}
	var out []*commonpb.Payload
	if strings.HasSuffix(c.Path(), "/encode") {
		out, err = cd.Encode(in.Payloads)
	} else {
		out, err = cd.Decode(in.Payloads)
	}
	if err != nil {
		return &models.InputError{Status: http.StatusBadRequest, Field: "payloads", Reason: err.Error()}
	}
	raw, err := protojson.Marshal(&commonpb.Payloads{Payloads: out})
	if err != nil {
		return fmt.Errorf("encode payloads: %w", err)
	}
	return c.JSONBlob(http.StatusOK, raw)
}
