package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
)

// TestHandleErrorNeverInternalForInput: every class of error that input
// causes — the database refusing a value (too long, out of range, wrong
// form, NUL, missing, too big for its limits), the driver refusing too many
// parameters, the body limit, our own validation — is answered 4xx with
// the envelope and a field, never 500.
func TestHandleErrorNeverInternalForInput(t *testing.T) {
	s := New(Config{})
	pg := func(code, column, msg string) error {
		return fmt.Errorf("create thing: %w", &pgconn.PgError{Code: code, ColumnName: column, Message: msg})
	}
	cases := []struct {
		name   string
		err    error
		status int
		field  string
	}{
		{"string too long", pg("22001", "name", "value too long for type character varying(255)"), 422, "name"},
		{"number out of range", pg("22003", "max_nodes_in_flight", "integer out of range"), 422, "max_nodes_in_flight"},
		{"invalid text representation", pg("22P02", "", "invalid input syntax for type uuid"), 422, "body"},
		{"NUL in text", pg("22021", "", "invalid byte sequence for encoding \"UTF8\": 0x00"), 422, "body"},
		{"NUL in jsonb", pg("22P05", "", "unsupported Unicode escape sequence"), 422, "body"},
		{"bad datetime", pg("22007", "", "invalid input syntax for type timestamp"), 422, "body"},
		{"datetime out of range", pg("22008", "", "date/time field value out of range"), 422, "body"},
		{"bad regular expression", pg("2201B", "", "invalid regular expression"), 422, "body"},
		{"not null", pg("23502", "name", "null value in column \"name\""), 422, "name"},
		{"check", pg("23514", "", "new row violates check constraint"), 422, "body"},
		{"program limit", pg("54000", "", "index row size exceeds maximum"), 413, "body"},
		{"statement too complex", pg("54001", "", "stack depth limit exceeded"), 413, "body"},
		{"protocol limit", pg("08P01", "", "bind message has 70000 parameter formats but 0 parameters"), 413, "body"},
		{"too many parameters", fmt.Errorf("check nodes: %w", errors.New("extended protocol limited to 65535 parameters")), 413, "body"},
		{"validation", models.Invalid("graphs[0].nodes", "may list at most 1000 entries"), 422, "graphs[0].nodes"},
		{"malformed body", &models.InputError{Status: 400, Field: "body", Reason: "trailing data"}, 400, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c := s.echo.NewContext(httptest.NewRequest(http.MethodPost, "/api/v1/things", nil), rec)
			s.handleError(tc.err, c)
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			var body protocol.ErrorBody
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
			assert.Equal(t, "invalid_input", body.Error.Code)
			assert.Equal(t, tc.field, body.Error.Details["field"])
		})
	}

	t.Run("body limit stays 413", func(t *testing.T) {
		rec := httptest.NewRecorder()
		c := s.echo.NewContext(httptest.NewRequest(http.MethodPost, "/", nil), rec)
		s.handleError(echo.ErrStatusRequestEntityTooLarge, c)
		assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	})
	t.Run("a client gone is 499, not a failure", func(t *testing.T) {
		rec := httptest.NewRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c := s.echo.NewContext(httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/agent/work", nil), rec)
		s.handleError(fmt.Errorf("claim work: %w", context.Canceled), c)
		assert.Equal(t, statusClientClosed, rec.Code)
	})
	t.Run("a cancellation of our own making is still 500", func(t *testing.T) {
		rec := httptest.NewRecorder()
		c := s.echo.NewContext(httptest.NewRequest(http.MethodGet, "/", nil), rec)
		s.handleError(context.Canceled, c)
		assert.Equal(t, http.StatusInternalServerError, rec.Code)
	})
	t.Run("other errors are still 500", func(t *testing.T) {
		rec := httptest.NewRecorder()
		c := s.echo.NewContext(httptest.NewRequest(http.MethodPost, "/", nil), rec)
		s.handleError(pg("XX000", "", "internal error"), c)
		assert.Equal(t, http.StatusInternalServerError, rec.Code, "a fault of ours is not blamed on the input")
	})
}

// TestDecodeStrict: one JSON object per body, no null, and the field named
// for a type mismatch, an unknown field, a NUL or a bad timestamp.
func TestDecodeStrict(t *testing.T) {
	type inner struct {
		Name string `json:"name"`
	}
	type req struct {
		Name  string  `json:"name"`
		Count int     `json:"count"`
		Items []inner `json:"items"`
		Data  map[string]any
	}
	cases := []struct {
		name   string
		body   string
		status int
		field  string
	}{
		{"trailing garbage", `{"name": "a"} xyz`, 400, "body"},
		{"two objects", `{"name": "a"}{"name": "b"}`, 400, "body"},
		{"trailing brace", `{"name": "a"}}`, 400, "body"},
		{"null", `null`, 400, "body"},
		{"null with spaces", " \n null \n", 400, "body"},
		{"array", `[{"name": "a"}]`, 400, "body"},
		{"string", `"a"`, 400, "body"},
		{"empty", ``, 400, "body"},
		{"wrong type", `{"count": "x"}`, 400, "count"},
		{"nested wrong type", `{"items": [{"name": 3}]}`, 400, "items.name"},
		{"out of range", `{"count": 99999999999999999999}`, 400, "count"},
		{"unknown field", `{"nmae": "a"}`, 400, "nmae"},
		{"NUL", `{"name": "a\u0000b"}`, 422, "name"},
		{"nested NUL", `{"items": [{"name": "ok"}, {"name": "\u0000"}]}`, 422, "items[1].name"},
		{"NUL in a key", `{"Data": {"k\u0000": 1}}`, 422, "Data.k\\u0000"},
		{"truncated", `{"name": "a"`, 400, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var v req
			err := decodeStrict([]byte(tc.body), &v, true, false)
			var ie *models.InputError
			require.True(t, errors.As(err, &ie), "want an InputError, got %v", err)
			status := ie.Status
			if status == 0 {
				status = 422
			}
			assert.Equal(t, tc.status, status, ie.Error())
			assert.Equal(t, tc.field, ie.Field, ie.Error())
		})
	}
	var ok req
	require.NoError(t, decodeStrict([]byte(` {"name": "a", "count": 2} `+"\n"), &ok, true, false))
	assert.Equal(t, req{Name: "a", Count: 2}, ok)
	require.NoError(t, decodeStrict([]byte(`{"name": "a\u0000"}`), &ok, true, true), "NUL allowed where the store strips it")
	assert.NoError(t, decodeStrict([]byte(`{"name": "a\\u0000"}`), &ok, true, false), "an escaped backslash is not a NUL")

	for _, field := range []string{"started_at", "finished_at"} {
		var res protocol.RunResult
		err := decodeStrict([]byte(`{"attempt": 1, "`+field+`": "yesterday"}`), &res, true, true)
		var ie *models.InputError
		require.True(t, errors.As(err, &ie), "%v", err)
		assert.Equal(t, field, ie.Field)
		assert.Equal(t, http.StatusBadRequest, ie.Status)
		err = decodeStrict([]byte(`{"attempt": 1, "`+field+`": 12}`), &res, true, true)
		require.True(t, errors.As(err, &ie), "%v", err)
		assert.Equal(t, field, ie.Field, "a number is not a time either")
	}

	var sig protocol.SoftwareSignal
	err := decodeStrict([]byte(`{"deploy_status_code": 4294967296}`), &sig, false, true)
	var ie *models.InputError
	require.True(t, errors.As(err, &ie), "%v", err)
	assert.Equal(t, "deploy_status_code", ie.Field)
	err = decodeStrict([]byte(`{"deploy_round": "x"}`), &sig, false, true)
	require.True(t, errors.As(err, &ie), "%v", err)
	assert.Equal(t, "deploy_round", ie.Field)
	assert.True(t, strings.Contains(ie.Reason, "32 bits"), ie.Reason)
}

// TestParseReleaseStrict: one document per body, an object at its root.
func TestParseReleaseStrict(t *testing.T) {
	for _, tc := range []struct{ name, body, ct string }{
		{"JSON trailing", `{"name": "a"} {}`, "application/json"},
		{"JSON null", `null`, "application/json"},
		{"YAML null", "null\n", "application/yaml"},
		{"YAML empty", "", "application/yaml"},
		{"YAML list", "- a\n", "application/yaml"},
		{"YAML two documents", "name: a\n---\nname: b\n", "application/yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRelease([]byte(tc.body), tc.ct)
			var ie *models.InputError
			require.True(t, errors.As(err, &ie), "%v", err)
			assert.Equal(t, http.StatusBadRequest, ie.Status)
		})
	}
	spec, err := ParseRelease([]byte("name: a\nversion: \"1\"\n"), "application/yaml")
	require.NoError(t, err)
	assert.Equal(t, "a", spec.Name)
}
