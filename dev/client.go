package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// apiClient is the dev tool's small client of the anneal REST API.
type apiClient struct {
	base, token string
	http        *http.Client
}

func newAPIClient(base, token string) *apiClient {
	return &apiClient{base: base, token: token, http: &http.Client{Timeout: 30 * time.Second}}
}

// call sends body (JSON, or raw bytes with contentType) and decodes a 2xx
// answer into out; other answers become errors carrying the API's message.
func (c *apiClient) call(ctx context.Context, method, path, contentType string, body any, out any) (int, error) {
	var reader io.Reader
	if raw, ok := body.([]byte); ok {
		reader = bytes.NewReader(raw)
	} else if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		reader, contentType = bytes.NewReader(buf), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return 0, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// waitHealthy polls /healthz until the API answers or the timeout passes.
func waitHealthy(ctx context.Context, base string, timeout time.Duration, alive <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API at %s did not answer within %s", base, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-alive:
			return fmt.Errorf("the server process exited before its API answered")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// listAll reads every page of a list endpoint ({"items", "next_cursor"})
// into out, a pointer to a slice.
func (c *apiClient) listAll(ctx context.Context, path string, out any) error {
	var all []json.RawMessage
	cursor := ""
	for {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		page := path + sep + "limit=1000"
		if cursor != "" {
			page += "&cursor=" + url.QueryEscape(cursor)
		}
		var body struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		if _, err := c.call(ctx, http.MethodGet, page, "", nil, &body); err != nil {
			return err
		}
		all = append(all, body.Items...)
		if body.NextCursor == "" {
			break
		}
		cursor = body.NextCursor
	}
	raw, err := json.Marshal(all)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}
