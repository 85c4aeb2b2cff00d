package web

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
)

// The operator's console: tokens, the transactions and releases lists, and
// deleting what is no longer used.

type createTokenRequest struct {
	Name  string `json:"name"`
	Scope string `json:"scope"`
}

// tokenCreated is the one answer that shows a token's secret.
type tokenCreated struct {
	models.APIToken
	Token string `json:"token"`
}

// createToken: POST /tokens {"name", "scope"} → 201 with the secret, once.
func (s *Server) createToken(c echo.Context) error {
	var req createTokenRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	tok, secret, err := s.cfg.Store.CreateToken(c.Request().Context(), req.Name, req.Scope)
	if err != nil {
		return err
	}
	s.log.Info("token created", "token_id", tok.ID, "name", tok.Name, "scope", tok.Scope, "by", principal(c).Name)
	return c.JSON(http.StatusCreated, tokenCreated{APIToken: *tok, Token: secret})
}

func (s *Server) listTokens(c echo.Context) error {
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	toks, next, err := s.cfg.Store.Tokens(c.Request().Context(), p)
	if err != nil {
		return err
	}
	return listOf(c, toks, next)
}

// revokeToken: DELETE /tokens/:id → 204. The token stops working at once on
// this server (its cache entry goes) and on the others when Postgres's
// announcement of it reaches them (migration 0030).
func (s *Server) revokeToken(c echo.Context) error {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return &models.InputError{Status: http.StatusBadRequest, Field: "id", Reason: fmt.Sprintf("%q is not a token id", c.Param("id"))}
	}
	tok, err := s.cfg.Store.RevokeToken(c.Request().Context(), id)
	if err != nil {
		return err
	}
	s.auth.forget(tok.TokenHash)
	s.log.Info("token revoked", "token_id", tok.ID, "name", tok.Name, "scope", tok.Scope, "by", principal(c).Name)
	return c.NoContent(http.StatusNoContent)
}

var txStatuses = []string{models.TxPending, models.TxRunning, models.TxReady, models.TxError, models.TxStopped}

// timeParam reads an RFC 3339 time parameter.
func timeParam(c echo.Context, name string) (*time.Time, error) {
	raw := c.QueryParam(name)
	if raw == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: name,
			Reason: fmt.Sprintf("%q is not an RFC 3339 time such as 2025-01-31T12:00:00Z", raw)}
	}
	return &t, nil
}

// listTransactions: GET /transactions?deployment=&status=&since=&until=,
// newest first, paginated.
func (s *Server) listTransactions(c echo.Context) error {
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	f := fuel.TransactionFilter{Deployment: c.QueryParam("deployment"), Status: c.QueryParam("status")}
	if f.Status != "" && !contains(txStatuses, f.Status) {
		return &models.InputError{Status: http.StatusBadRequest, Field: "status", Reason: fmt.Sprintf("%q is not one of %s", f.Status, strings.Join(txStatuses, ", "))}
	}
	if f.Since, err = timeParam(c, "since"); err != nil {
		return err
	}
	if f.Until, err = timeParam(c, "until"); err != nil {
		return err
	}
	txns, next, err := s.fuel.Transactions(c.Request().Context(), f, p)
	if err != nil {
		return err
	}
	items := make([]transactionView, len(txns))
	for i := range txns {
		items[i] = s.transactionView(&txns[i])
	}
	return listOf(c, items, next)
}

func (s *Server) listReleases(c echo.Context) error {
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	rels, next, err := s.cfg.Store.Releases(c.Request().Context(), p)
	if err != nil {
		return err
	}
	return listOf(c, rels, next)
}

// deleteRelease: DELETE /releases/:id → 204; 409 names its users.
func (s *Server) deleteRelease(c echo.Context) error {
	rel, err := s.cfg.Store.DeleteRelease(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	s.log.Info("release deleted", "release", rel.Name, "version", rel.Version, "by", principal(c).Name)
	return c.NoContent(http.StatusNoContent)
}

// deleteDeployment: DELETE /deployments/:id → 204; 409 names what it holds.
func (s *Server) deleteDeployment(c echo.Context) error {
	dep, err := s.cfg.Store.DeleteDeployment(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	s.log.Info("deployment deleted", "deployment", dep.Name, "by", principal(c).Name)
	return c.NoContent(http.StatusNoContent)
}

// deleteDeployable: DELETE /deployables/:id → 200 saying which instance
// nodes went with it (those that never came alive) and which stay.
func (s *Server) deleteDeployable(c echo.Context) error {
	out, err := s.audrey.DeleteDeployable(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	s.log.Info("deployable deleted", "deployable", out.Deployable.Name, "deleted_nodes", out.DeletedNodes, "kept_nodes", out.KeptNodes)
	return c.JSON(http.StatusOK, out)
}
