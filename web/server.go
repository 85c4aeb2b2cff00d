// Package web is anneal's REST API (Echo): the operators' routes, the
// agents' routes and, later, the config server. Every route but health
// needs a bearer token; agents see only their own node's work.
package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.temporal.io/sdk/client"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/heat"
)

// Config configures the API server.
type Config struct {
	Store    *models.Store
	Temporal client.Client
	// TaskQueue is where transaction workflows are started.
	TaskQueue string
	// DatabaseURL is used for a dedicated LISTEN connection that wakes the
	// agents' long polls.
	DatabaseURL string
	// HeartbeatTimeoutSec is handed to the transaction workflows (0 means
	// the workflows' default).
	HeartbeatTimeoutSec int
	// AckLease is how long a run handed to an agent waits for the agent's
	// acknowledgement before it is offered again (0: models.DefaultAckLease).
	// It must stay below the heartbeat timeout.
	AckLease time.Duration
	Log      *slog.Logger
}

// Server serves the API.
type Server struct {
	cfg Config
	// The seeds' stores, over cfg.Store (the kernel): each handler file
	// uses the store of its seed.
	fuel    *fuel.Store
	crowbar *crowbar.Store
	heat    *heat.Store
	audrey  *audrey.Store
	echo    *echo.Echo
	hub     *workHub
	auth    authCache
	log     *slog.Logger
}

// New builds the API server and its routes.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	s := &Server{cfg: cfg, echo: e, hub: newWorkHub(cfg.Log), log: cfg.Log,
		fuel: fuel.New(cfg.Store), crowbar: crowbar.New(cfg.Store), heat: heat.New(cfg.Store), audrey: audrey.New(cfg.Store)}
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.Recover())
	e.Use(middleware.BodyLimit("2M"))
	e.Use(s.logRequests)

	e.GET("/healthz", s.health)
	api := e.Group("/api/v1")
	api.GET("/health", s.health)
	api.GET("/openapi.json", s.openAPIHandler())

	agents := api.Group("/agent")
	agents.POST("/register", s.agentRegister, s.require(models.ScopeEnroll, models.ScopeAdmin))
	mine := agents.Group("", s.requireAgent)
	mine.POST("/heartbeat", s.agentHeartbeat)
	mine.GET("/work", s.agentWork)
	mine.POST("/runs/:id/heartbeat", s.agentRunHeartbeat)
	mine.POST("/runs/:id/result", s.agentRunResult)
	mine.POST("/runs/:id/ack", s.agentRunAck)

	admin := api.Group("", s.require(models.ScopeAdmin))
	admin.GET("/nodes", s.listNodes)
	admin.POST("/nodes", s.createNode)
	admin.GET("/nodes/:id", s.getNode)
	admin.PATCH("/nodes/:id", s.updateNode)
	admin.DELETE("/nodes/:id", s.deleteNode)
	admin.GET("/deployments", s.listDeployments)
	admin.POST("/deployments", s.createDeployment)
	admin.GET("/deployments/:id", s.getDeployment)
	admin.PATCH("/deployments/:id", s.updateDeployment)
	s.graphRoutes(admin)
	s.tagRoutes(admin)
	s.snapshotRoutes(admin)
	s.crowbarRoutes(admin)
	s.scenarioRoutes(admin)
	s.softwareRoutes(admin, mine)
	s.deployableRoutes(admin)
	s.configServerRoutes(e)
	admin.POST("/releases", s.importRelease)
	admin.GET("/releases/:id", s.getRelease)
	admin.POST("/graphs/execute", s.execute)
	admin.GET("/transactions/:uuid", s.getTransaction)
	admin.GET("/transactions/:uuid/runs", s.listRuns)
	admin.POST("/transactions/:uuid/stop", s.stopTransaction)
	admin.POST("/transactions/:uuid/retry", s.retryTransaction)
	return s
}

// Handler returns the HTTP handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.echo }

// Run serves on addr until ctx ends, with the agents' wake-up listener.
func (s *Server) Run(ctx context.Context, addr string) error {
	go s.hub.listen(ctx, s.cfg.DatabaseURL)
	srv := &http.Server{Addr: addr, Handler: s.echo, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve API on %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.hub.closeAll()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shut down API: %w", err)
	}
	return nil
}

// StartListener starts only the agents' wake-up listener, for servers run
// through Handler (tests).
func (s *Server) StartListener(ctx context.Context) { go s.hub.listen(ctx, s.cfg.DatabaseURL) }

func (s *Server) health(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

const principalKey = "principal"

func bearer(c echo.Context) string {
	h := c.Request().Header.Get(echo.HeaderAuthorization)
	if token, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(token)
	}
	return ""
}

func (s *Server) authenticate(c echo.Context) (models.Principal, error) {
	token := bearer(c)
	if token == "" {
		return models.Principal{}, apiError(http.StatusUnauthorized, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>' (see .dev/env for ANNEAL_TOKEN)")
	}
	p, err := s.auth.authenticate(c.Request().Context(), token, s.cfg.Store.Authenticate)
	if errors.Is(err, models.ErrForbidden) {
		return p, apiError(http.StatusUnauthorized, "unauthorized", "unknown or revoked token")
	}
	if err != nil {
		return p, err
	}
	c.Set(principalKey, p)
	return p, nil
}

// require admits operator tokens of the given scopes.
func (s *Server) require(scopes ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p, err := s.authenticate(c)
			if err != nil {
				return err
			}
			for _, scope := range scopes {
				if p.Scope == scope {
					return next(c)
				}
			}
			return apiError(http.StatusForbidden, "forbidden", fmt.Sprintf("this route needs a token of scope %s", strings.Join(scopes, " or ")))
		}
	}
}

// requireAgent admits only node agents.
func (s *Server) requireAgent(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := s.authenticate(c)
		if err != nil {
			return err
		}
		if !p.IsAgent() {
			return apiError(http.StatusForbidden, "forbidden", "this route is for node agents, with the credential they got at registration")
		}
		return next(c)
	}
}

func principal(c echo.Context) models.Principal {
	p, _ := c.Get(principalKey).(models.Principal)
	return p
}

func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		status := c.Response().Status
		level := slog.LevelDebug
		if status >= 500 {
			level = slog.LevelError
		} else if status >= 400 {
			level = slog.LevelInfo
		}
		s.log.Log(c.Request().Context(), level, "request", "method", c.Request().Method, "path", c.Path(),
			"uri", c.Request().RequestURI, "status", status, "duration", time.Since(start), "who", principal(c).Name)
		return nil
	}
}

// httpError is an API error with its status.
type httpError struct {
	Status int
	Body   protocol.ErrorDetail
}

func (e *httpError) Error() string { return e.Body.Message }

func apiError(status int, code, message string) error {
	return &httpError{Status: status, Body: protocol.ErrorDetail{Code: code, Message: message}}
}

// handleError answers every error in the {"error": {...}} envelope.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, body := http.StatusInternalServerError, protocol.ErrorDetail{Code: "internal", Message: "internal error; see the server log"}
	var he *httpError
	var ie *models.InputError
	var ce *models.ConflictError
	var ee *echo.HTTPError
	switch {
	case errors.As(err, &he):
		status, body = he.Status, he.Body
	case errors.As(err, &ie):
		status = http.StatusUnprocessableEntity
		if ie.Status != 0 {
			status = ie.Status
		}
		details := map[string]any{"field": ie.Field, "reason": ie.Reason}
		for k, v := range ie.Details {
			details[k] = v
		}
		body = protocol.ErrorDetail{Code: "invalid_input", Message: ie.Error(), Details: details}
	case errors.As(err, &ce):
		status, body = http.StatusConflict, protocol.ErrorDetail{Code: "conflict", Message: ce.Reason}
	case errors.Is(err, models.ErrNotFound):
		status, body = http.StatusNotFound, protocol.ErrorDetail{Code: "not_found", Message: err.Error()}
	case errors.Is(err, models.ErrForbidden):
		status, body = http.StatusForbidden, protocol.ErrorDetail{Code: "forbidden", Message: err.Error()}
	case isNULRefused(err):
		status, body = http.StatusUnprocessableEntity, protocol.ErrorDetail{Code: "invalid_input",
			Message: "text and JSON values cannot contain NUL (\\u0000) characters; nothing was written",
			Details: map[string]any{"field": "body", "reason": "contains a NUL character"}}
	case isReferenceGone(err):
		status, body = http.StatusConflict, protocol.ErrorDetail{Code: "conflict",
			Message: "something this request refers to was removed by another request meanwhile; nothing was written, look again and retry"}
	case errors.As(err, &ee):
		status = ee.Code
		body = protocol.ErrorDetail{Code: strings.ReplaceAll(strings.ToLower(http.StatusText(ee.Code)), " ", "_"), Message: fmt.Sprint(ee.Message)}
	default:
		s.log.Error("request failed", "method", c.Request().Method, "uri", c.Request().RequestURI, "error", err)
	}
	if err := c.JSON(status, protocol.ErrorBody{Error: body}); err != nil {
		s.log.Error("write error response", "error", err)
	}
}

// isNULRefused reports whether Postgres refused a value for holding a NUL
// character (text and jsonb cannot store one): bad input, not a fault. The
// statement failed, so its transaction wrote nothing.
func isNULRefused(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "22P05" || pg.Code == "22021")
}

// isReferenceGone reports a foreign-key violation: requests check what
// they refer to, so one means a concurrent request removed it (a role
// dropped by a release import while being bound).
func isReferenceGone(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23503"
}

// bindStrict decodes a JSON body, refusing unknown fields and naming the
// field of a type mismatch.
func bindStrict(c echo.Context, v any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syntax):
			return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err)}
		case errors.Is(err, io.ErrUnexpectedEOF):
			return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "malformed JSON: the body ends in the middle of a value"}
		case errors.As(err, &typ):
			return &models.InputError{Status: http.StatusBadRequest, Field: typ.Field, Reason: fmt.Sprintf("must be %s, not %s", typ.Type, typ.Value)}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return &models.InputError{Status: http.StatusBadRequest, Field: field, Reason: "unknown field"}
		case err.Error() == "EOF":
			return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "empty body; send a JSON object"}
		default:
			return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: err.Error()}
		}
	}
	if dec.More() {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "trailing data after the JSON object"}
	}
	return nil
}

// authTTL bounds how long a verified token is trusted without asking the
// database again: agents call several times per task, and a revoked token
// stops working within this delay.
const authTTL = 10 * time.Second

// authCache remembers recently verified tokens by their hash.
type authCache struct {
	mu      sync.Mutex
	entries map[string]authEntry
}

type authEntry struct {
	p       models.Principal
	expires time.Time
}

func (a *authCache) authenticate(ctx context.Context, token string, verify func(context.Context, string) (models.Principal, error)) (models.Principal, error) {
	key := models.HashSecret(token)
	now := time.Now()
	a.mu.Lock()
	e, ok := a.entries[key]
	a.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.p, nil
	}
	p, err := verify(ctx, token)
	if err != nil {
		return p, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entries == nil || len(a.entries) > 10000 {
		a.entries = map[string]authEntry{} // crude bound; tokens are few
	}
	a.entries[key] = authEntry{p: p, expires: now.Add(authTTL)}
	return p, nil
}
