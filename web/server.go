// Package web is anneal's REST API (Echo): the operators' routes, the
// agents' routes and, later, the config server. Every route but health
// needs a bearer token; agents see only their own node's work.
package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sort"
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
	// ReconcileGrace is how old an unfinished transaction or software
	// deployment must be before Reconcile checks its workflow (0: a
	// minute): younger ones may still be starting.
	ReconcileGrace time.Duration
	// TemporalUI is the base address of the Temporal Web UI (e.g.
	// http://127.0.0.1:8233); when set, answers about a workflow link to
	// it (links.temporal_ui).
	TemporalUI string
	// Namespace is the Temporal namespace the workflows run in, for those
	// links (default "default").
	Namespace string
	// CodecOrigins are the browser origins allowed to call the codec
	// server (CORS); default the TemporalUI's origin.
	CodecOrigins []string
	Log          *slog.Logger
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
	// routes are the registered routes as "METHOD /template", for the
	// 405 answer (methodNotAllowed).
	routes map[string]bool
	hub    *workHub
	// events fans the database's change notifications out to the live
	// event stream (events.go).
	events *eventHub
	// eventLease keeps the database announcing changes while the event
	// stream has clients (events.go).
	eventLease *eventLease
	auth       authCache
	// heartbeats records the agents' node heartbeats in batches.
	heartbeats *heartbeatBatch
	// beats spaces the heartbeats of chains (chainbeats.go).
	beats *chainBeats
	log   *slog.Logger
}

// New builds the API server and its routes.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	s := &Server{cfg: cfg, echo: e, hub: newWorkHub(cfg.Log), events: newEventHub(cfg.Log), eventLease: newEventLease(), log: cfg.Log, beats: newChainBeats(cfg.HeartbeatTimeoutSec),
		fuel: fuel.New(cfg.Store), crowbar: crowbar.New(cfg.Store), heat: heat.New(cfg.Store), audrey: audrey.New(cfg.Store)}
	s.hub.events = s.events
	s.hub.credentials = s.auth.revoked
	s.heartbeats = &heartbeatBatch{window: heartbeatWindow, touch: cfg.Store.TouchNodes}
	e.HTTPErrorHandler = s.handleError
	e.Pre(s.methodNotAllowed)
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
	mine.POST("/runs/results", s.agentRunResults)
	mine.POST("/runs/:id/ack", s.agentRunAck)

	// Operators' routes: what each token scope may do is decided per route
	// (access.go).
	admin := api.Group("", s.authorize)
	admin.GET("/tokens", s.listTokens)
	admin.POST("/tokens", s.createToken)
	admin.DELETE("/tokens/:id", s.revokeToken)
	admin.GET("/nodes", s.listNodes)
	admin.POST("/nodes", s.createNode)
	admin.GET("/nodes/:id", s.getNode)
	admin.PATCH("/nodes/:id", s.updateNode)
	admin.DELETE("/nodes/:id", s.deleteNode)
	s.nodeSSHRoutes(admin)
	admin.GET("/deployments", s.listDeployments)
	admin.POST("/deployments", s.createDeployment)
	admin.GET("/deployments/:id", s.getDeployment)
	admin.DELETE("/deployments/:id", s.deleteDeployment)
	admin.PATCH("/deployments/:id", s.updateDeployment)
	s.graphRoutes(admin)
	s.tagRoutes(admin)
	s.snapshotRoutes(admin)
	s.crowbarRoutes(admin)
	s.scenarioRoutes(admin)
	s.softwareRoutes(admin, mine)
	s.deployableRoutes(admin)
	s.logRoutes(admin, mine)
	s.configServerRoutes(e)
	s.secretRoutes(api, admin)
	admin.GET("/releases", s.listReleases)
	admin.POST("/releases", s.importRelease)
	admin.GET("/releases/:id", s.getRelease)
	admin.DELETE("/releases/:id", s.deleteRelease)
	admin.POST("/graphs/execute", s.execute)
	admin.GET("/transactions", s.listTransactions)
	admin.GET("/transactions/:uuid", s.getTransaction)
	admin.GET("/transactions/:uuid/runs", s.listRuns)
	admin.GET("/transactions/:uuid/plan", s.getTransactionPlan)
	admin.POST("/transactions/:uuid/stop", s.stopTransaction)
	admin.POST("/transactions/:uuid/retry", s.retryTransaction)
	admin.GET("/events", s.streamEvents)
	admin.GET("/whoami", s.whoami)
	s.dashboardRoutes(e)
	s.routes = map[string]bool{}
	for _, r := range e.Routes() {
		if r.Method != echo.RouteNotFound {
			s.routes[r.Method+" "+r.Path] = true
		}
	}
	return s
}

// allowMethods are the methods a 405 answer may name in Allow.
var allowMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// methodNotAllowed answers 405 with Allow when the path is a route but not
// for the request's method. Echo alone answers 404 there: the catch-all
// not-found routes it adds for groups with middleware match first (and run
// the group's authentication, answering 401 before that).
func (s *Server) methodNotAllowed(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if req.Method == http.MethodOptions {
			return next(c)
		}
		path := echo.GetPath(req)
		if s.routed(req.Method, path) {
			return next(c)
		}
		var allow []string
		for _, m := range allowMethods {
			if m != req.Method && s.routed(m, path) {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			return next(c)
		}
		c.Response().Header().Set(echo.HeaderAllow, strings.Join(allow, ", "))
		return apiError(http.StatusMethodNotAllowed, "method_not_allowed",
			fmt.Sprintf("%s is not a method of %s; it answers %s", req.Method, path, strings.Join(allow, ", ")))
	}
}

// routed reports whether method and path reach a registered route.
func (s *Server) routed(method, path string) bool {
	c := s.echo.NewContext(nil, nil)
	s.echo.Router().Find(method, path, c)
	return s.routes[method+" "+c.Path()]
}

// Handler returns the HTTP handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.echo }

// Run serves on addr until ctx ends, with the agents' wake-up listener.
func (s *Server) Run(ctx context.Context, addr string) error {
	go s.hub.listen(ctx, s.cfg.DatabaseURL)
	s.startEvents(ctx)
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
	s.events.close() // event streams never end by themselves
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shut down API: %w", err)
	}
	return nil
}

// StartListener starts only the database listener (the agents' wake-ups
// and the live event stream), for servers run through Handler (tests); the
// event streams end when ctx does.
func (s *Server) StartListener(ctx context.Context) {
	go s.hub.listen(ctx, s.cfg.DatabaseURL)
	s.startEvents(ctx)
}

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

// statusClientClosed is the status logged for a request whose client went
// away before its answer (nginx's 499): not a fault of the server's.
const statusClientClosed = 499

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
	case inputRefused(err) != nil:
		ie := inputRefused(err)
		status, body = ie.Status, protocol.ErrorDetail{Code: "invalid_input", Message: ie.Error() + "; nothing was written",
			Details: map[string]any{"field": ie.Field, "reason": ie.Reason}}
	case isReferenceGone(err):
		status, body = http.StatusConflict, protocol.ErrorDetail{Code: "conflict",
			Message: "something this request refers to was removed by another request meanwhile; nothing was written, look again and retry"}
	case errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil:
		// The client went away (an agent stopped mid-poll) or the server
		// is stopping: nobody reads this answer, and nothing failed here.
		status, body = statusClientClosed, protocol.ErrorDetail{Code: "client_closed_request",
			Message: "the client closed the request before its answer"}
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

// inputRefused maps an error the database (or its driver) gave because of
// what the request carried — a value too long, out of range, of the wrong
// form, holding a NUL, too many parameters — to bad input naming the field
// where Postgres says which (else "body"); nil for any other error. The
// statement failed, so its transaction wrote nothing. The routes validate
// their input first (models/validate.go): this is the net under them, so
// that input never causes a 5xx.
func inputRefused(err error) *models.InputError {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		field := pg.ColumnName
		if field == "" {
			field = "body"
		}
		reason := pg.Message
		switch {
		case pg.Code == "22P05" || pg.Code == "22021":
			reason = "text and JSON values cannot contain NUL (\\u0000) characters"
		case pg.Code == "22001":
			reason = "a value is too long: " + pg.Message
		case pg.Code == "22003":
			reason = "a number is out of range: " + pg.Message
		case strings.HasPrefix(pg.Code, "22"), pg.Code == "23502", pg.Code == "23514":
			// Data exceptions (invalid text representation, bad time,
			// bad regular expression, ...), a missing or unacceptable value.
		case pg.Code == "54000" || pg.Code == "54001" || pg.Code == "08P01":
			// Program limits (an index row or statement too large) and
			// protocol limits: too much input in one request.
			return &models.InputError{Status: http.StatusRequestEntityTooLarge, Field: field, Reason: "the request is too large for the database: " + pg.Message}
		default:
			return nil
		}
		return &models.InputError{Status: http.StatusUnprocessableEntity, Field: field, Reason: reason}
	}
	// pgx refuses a statement of more than 65535 parameters before sending
	// it (a list of ids too long): the routes cap their lists, this is the
	// net under them.
	if msg := err.Error(); strings.Contains(msg, "extended protocol limited to") {
		return &models.InputError{Status: http.StatusRequestEntityTooLarge, Field: "body",
			Reason: fmt.Sprintf("a list in the request is too long (at most %d entries)", models.MaxListLen)}
	}
	return nil
}

// isReferenceGone reports a foreign-key violation: requests check what
// they refer to, so one means a concurrent request removed it (a role
// dropped by a release import while being bound).
func isReferenceGone(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23503"
}

// bindStrict decodes a JSON body strictly: one JSON object (not null, not
// followed by anything), no unknown fields, and a bad value named by its
// field — a type mismatch, a NUL character, a timestamp that does not parse.
func bindStrict(c echo.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	return decodeStrict(body, v, true, false)
}

// readBody reads the whole body; a body over the limit stays the 413 the
// body-limit middleware gives.
func readBody(c echo.Context) ([]byte, error) {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return nil, he
		}
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "cannot read the body: " + err.Error()}
	}
	return body, nil
}

// decodeStrict decodes body, which must hold exactly one JSON object, into
// v; known says whether unknown fields are refused, nulOK whether NUL
// characters are let through (agents' reports of command output, which the
// store strips of them).
func decodeStrict(body []byte, v any, known, nulOK bool) error {
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0:
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "empty body; send a JSON object"}
	case bytes.Equal(trimmed, []byte("null")):
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "null is not a JSON object; send an object"}
	case trimmed[0] != '{':
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "the body must be a JSON object {...}"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if known {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return decodeError(body, v, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "trailing data after the JSON object (send one JSON value per request)"}
	}
	if field := nulField(body); field != "" && !nulOK {
		return &models.InputError{Field: field, Reason: "must not contain a NUL (\\u0000) character"}
	}
	return nil
}

// decodeError names the field of a decoding error where it can be known.
func decodeError(body []byte, v any, err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var fe *protocol.FieldError
	switch {
	case errors.As(err, &syntax):
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "malformed JSON: the body ends in the middle of a value"}
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return &models.InputError{Status: http.StatusBadRequest, Field: field, Reason: fmt.Sprintf("must be %s, not %s", typ.Type, models.Clip(typ.Value))}
	case errors.As(err, &fe):
		return &models.InputError{Status: http.StatusBadRequest, Field: fe.Field, Reason: fe.Reason}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &models.InputError{Status: http.StatusBadRequest, Field: field, Reason: "unknown field"}
	}
	if field := badTimeField(body, reflect.TypeOf(v)); field != "" {
		return &models.InputError{Status: http.StatusBadRequest, Field: field, Reason: "is not an RFC 3339 time like 2006-01-02T15:04:05Z"}
	}
	return &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: err.Error()}
}

// nulField returns the path of the first string or key (in sorted key
// order) that holds a NUL character, or "". Postgres cannot store one in
// text or jsonb, and the answer should name the field, not the body.
func nulField(body []byte) string {
	if !bytes.Contains(body, []byte(`\u0000`)) {
		return ""
	}
	var doc any
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	return findJSON(doc, "", func(s string) bool { return strings.ContainsRune(s, 0) })
}

// findJSON walks a decoded JSON value and returns the path of the first
// string (value or key) for which bad holds.
func findJSON(v any, path string, bad func(string) bool) string {
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch x := v.(type) {
	case string:
		if bad(x) {
			return orBody(path)
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if bad(k) {
				return join(strings.ReplaceAll(k, "\x00", `\u0000`))
			}
			if f := findJSON(x[k], join(k), bad); f != "" {
				return f
			}
		}
	case []any:
		for i, e := range x {
			if f := findJSON(e, fmt.Sprintf("%s[%d]", path, i), bad); f != "" {
				return f
			}
		}
	}
	return ""
}

func orBody(path string) string {
	if path == "" {
		return "body"
	}
	return path
}

var timeType = reflect.TypeOf(time.Time{})

// badTimeField finds, among the time fields of t (a struct, through
// pointers, nested structs and slices), one whose value in body is not an
// RFC 3339 time, and returns its JSON path.
func badTimeField(body []byte, t reflect.Type) string {
	var doc any
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	return timeWalk(doc, t, "", 0)
}

func timeWalk(v any, t reflect.Type, path string, depth int) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || depth > 8 || v == nil {
		return ""
	}
	if t == timeType {
		var tm time.Time
		raw, _ := json.Marshal(v)
		if json.Unmarshal(raw, &tm) != nil {
			return orBody(path)
		}
		return ""
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			sub, ok := obj[name]
			if !ok {
				continue
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			if r := timeWalk(sub, f.Type, p, depth+1); r != "" {
				return r
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return ""
		}
		for i, e := range arr {
			if r := timeWalk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), depth+1); r != "" {
				return r
			}
		}
	}
	return ""
}

// authTTL bounds how long a verified operator token is trusted without
// asking the database again.
const authTTL = 10 * time.Second

// agentAuthTTL is authTTL for an agent's credential: longer than an idle
// agent's requests are apart (a heartbeat every 20 s, each long poll
// renewed every 55 s), so that they do not each look the node up again,
// most of what a thousand idle agents cost the API after their software
// polls. A credential that stops working is dropped from every server's
// cache at once all the same: Postgres announces it (migration 0030,
// authCache.revoked).
const agentAuthTTL = time.Minute

// authCache remembers recently verified tokens by their hash.
type authCache struct {
	mu      sync.Mutex
	entries map[string]authEntry
	// gen counts the credentials dropped: a verification that began
	// before one was dropped is not kept, as it may have read the
	// credential before it stopped working.
	gen uint64
	now func() time.Time // time.Now, unless a test sets it
}

type authEntry struct {
	p       models.Principal
	expires time.Time
}

func (a *authCache) authenticate(ctx context.Context, token string, verify func(context.Context, string) (models.Principal, error)) (models.Principal, error) {
	key := models.HashSecret(token)
	now := time.Now()
	if a.now != nil {
		now = a.now()
	}
	a.mu.Lock()
	e, ok := a.entries[key]
	gen := a.gen
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
	if a.gen != gen {
		return p, nil // verified, but not kept
	}
	if a.entries == nil || len(a.entries) > 10000 {
		a.entries = map[string]authEntry{} // crude bound; tokens are few
	}
	ttl := authTTL
	if p.IsAgent() {
		ttl = agentAuthTTL
	}
	a.entries[key] = authEntry{p: p, expires: now.Add(ttl)}
	return p, nil
}

// revoked drops the credential whose hash Postgres announced as no longer
// working, or every one when hash is "" (announcements may have been
// missed while the server did not listen).
func (a *authCache) revoked(hash string) {
	if hash == "" {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.entries = nil
		a.gen++
		return
	}
	a.forget(hash)
}

// forget drops a token (by its hash) from the cache: a revoked token stops
// working on this server at once.
func (a *authCache) forget(hash string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.entries, hash)
	a.gen++
}
