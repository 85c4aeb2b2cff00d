package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls the anneal REST API with a bearer token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

// APIError is an answer in the API's error envelope
// {"error": {"code", "message", "details": {"field", ...}}}.
type APIError struct {
	Method  string
	Path    string
	Status  int
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// Error is the server's message.
func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%s %s: HTTP %d", e.Method, e.Path, e.Status)
	}
	return e.Message
}

// Field names the request field the server refused, if it named one.
func (e *APIError) Field() string {
	f, _ := e.Details["field"].(string)
	return f
}

// RouteMissing reports whether the server has no such endpoint at all
// (Echo's own 404/405), as opposed to a missing resource.
func (e *APIError) RouteMissing() bool {
	return (e.Status == http.StatusNotFound && e.Message == http.StatusText(http.StatusNotFound)) ||
		e.Status == http.StatusMethodNotAllowed
}

// ConnError is a failure to reach the API at all.
type ConnError struct {
	URL string
	Err error
}

// Error names the URL and the cause.
func (e *ConnError) Error() string {
	return fmt.Sprintf("cannot reach the API at %s: %v", e.URL, e.Err)
}

// Unwrap returns the cause.
func (e *ConnError) Unwrap() error { return e.Err }

// Do sends a request (body JSON-encoded unless nil or []byte) and returns
// the raw answer of a 2xx, or an *APIError / *ConnError.
func (c *Client) Do(ctx context.Context, method, path string, body any) ([]byte, error) {
	resp, err := c.send(ctx, method, path, body, c.HTTP)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, &ConnError{URL: c.BaseURL, Err: fmt.Errorf("read answer of %s %s: %w", method, path, err)}
	}
	return raw, nil
}

// Stream sends a GET and returns the open body of a 2xx answer, with no
// overall timeout (for following logs).
func (c *Client) Stream(ctx context.Context, path string) (io.ReadCloser, error) {
	streaming := &http.Client{Transport: c.HTTP.Transport}
	resp, err := c.send(ctx, http.MethodGet, path, nil, streaming)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

func (c *Client) send(ctx context.Context, method, path string, body any, hc *http.Client) (*http.Response, error) {
	var reader io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		reader = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("encode request body: %w", err)
		}
		reader = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, reader)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, path, err)
	}
	if reader != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &ConnError{URL: c.BaseURL, Err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	apiErr := &APIError{Method: method, Path: path, Status: resp.StatusCode}
	var env struct {
		Error *APIError `json:"error"`
	}
	if json.Unmarshal(raw, &env) == nil && env.Error != nil {
		env.Error.Method, env.Error.Path, env.Error.Status = method, path, resp.StatusCode
		return nil, env.Error
	}
	// Not our envelope (a proxy in between?): keep the first line.
	apiErr.Message = strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0])
	return nil, apiErr
}

// GetJSON fetches path and decodes the answer into out; it returns the raw
// answer too, for -o json.
func (c *Client) GetJSON(ctx context.Context, path string, out any) ([]byte, error) {
	return c.call(ctx, http.MethodGet, path, nil, out)
}

// call sends a request and decodes a JSON answer into out (when not nil).
func (c *Client) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	raw, err := c.Do(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("decode answer of %s %s: %w", method, path, err)
		}
	}
	return raw, nil
}

// esc escapes one path segment (node names, deployment names).
func esc(s string) string { return url.PathEscape(s) }

// query builds a query string from the non-empty pairs.
func query(pairs ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			v.Set(pairs[i], pairs[i+1])
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// newHTTPClient bounds plain calls; following uses repeated short calls.
func newHTTPClient() *http.Client { return &http.Client{Timeout: 60 * time.Second} }

// isRouteMissing reports an error saying the server lacks the endpoint.
func isRouteMissing(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.RouteMissing()
}

// getAll reads every page of a list endpoint ({"items": [...],
// "next_cursor": "..."}), following next_cursor, into out. The raw answer
// it returns is the JSON array of all the items, for -o json.
func getAll[T any](ctx context.Context, c *Client, path string, out *[]T) ([]byte, error) {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	all := []json.RawMessage{}
	cursor := ""
	for {
		p := path + sep + "limit=1000"
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		var page struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		if _, err := c.GetJSON(ctx, p, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	raw, err := json.Marshal(all)
	if err != nil {
		return nil, fmt.Errorf("encode the items of %s: %w", path, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return raw, fmt.Errorf("decode the items of %s: %w", path, err)
	}
	return raw, nil
}
