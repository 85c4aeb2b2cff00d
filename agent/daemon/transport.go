package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// APIError is a non-2xx answer of the API. Message is the API's own message
// from its {"error": {...}} envelope when it sent one, else the body text.
type APIError struct {
	Method  string
	Path    string
	Status  int
	Code    string
	Message string
	Details map[string]any
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Code != "" {
		return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Code, msg)
	}
	return fmt.Sprintf("%s %s: %d: %s", e.Method, e.Path, e.Status, msg)
}

// Retryable reports whether the same request may succeed later: server
// errors, 408 and 429. Any other 4xx is the API's final word.
func (e *APIError) Retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusRequestTimeout || e.Status == http.StatusTooManyRequests
}

// retryable reports whether err (from a transport call) is worth retrying:
// network errors, undecodable answers and retryable API errors are; a final
// API answer and the caller's own cancellation are not.
func retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Retryable()
	}
	return true
}

// statusOf returns the HTTP status of an API error, or 0.
func statusOf(err error) int {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

// apiMessage returns the API's message for err, or err's text.
func apiMessage(err error) string {
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Message != "" {
		return apiErr.Message
	}
	return err.Error()
}

// HTTPTransport talks to the anneal API's agent endpoints. It implements
// WorkSource and Reporter once Token holds the node's credential.
type HTTPTransport struct {
	// BaseURL is the API's base URL, e.g. http://anneal:8080.
	BaseURL string
	// Token is the node's bearer token.
	Token string
	// Client does the requests; it should have no overall Timeout shorter
	// than PollWait (each call sets its own deadline). nil: a plain client.
	Client *http.Client
	// PollWait is how long the API may hold a work fetch open. It is sent
	// as whole seconds (at least 1).
	PollWait time.Duration
	// RequestTimeout bounds every call but the work fetch, which gets
	// PollWait plus RequestTimeout. Default 30s.
	RequestTimeout time.Duration
	// UserAgent is sent with every request.
	UserAgent string
}

var (
	_ WorkSource    = (*HTTPTransport)(nil)
	_ Reporter      = (*HTTPTransport)(nil)
	_ Acker         = (*HTTPTransport)(nil)
	_ BatchReporter = (*HTTPTransport)(nil)
	_ LogShipper    = (*HTTPTransport)(nil)
)

// Register phones home for the first time, authenticated by an enrollment
// token, and returns the node's credential.
func (t *HTTPTransport) Register(ctx context.Context, enrollToken string, req protocol.RegisterRequest) (protocol.RegisterResponse, error) {
	var resp protocol.RegisterResponse
	err := t.do(ctx, http.MethodPost, protocol.PathRegister, nil, enrollToken, t.timeout(), req, &resp)
	if err == nil && resp.Token == "" {
		err = fmt.Errorf("POST %s: the API answered without a token", protocol.PathRegister)
	}
	return resp, err
}

// Heartbeat tells the API that the agent is alive.
func (t *HTTPTransport) Heartbeat(ctx context.Context, req protocol.HeartbeatRequest) (protocol.HeartbeatResponse, error) {
	var resp protocol.HeartbeatResponse
	err := t.do(ctx, http.MethodPost, protocol.PathHeartbeat, nil, t.Token, t.timeout(), req, &resp)
	return resp, err
}

// Fetch long-polls for work: GET PathWork?wait=<PollWait>s.
func (t *HTTPTransport) Fetch(ctx context.Context) ([]protocol.WorkItem, error) {
	var resp protocol.WorkResponse
	if err := t.poll(ctx, url.Values{}, &resp); err != nil {
		return nil, err
	}
	return resp.Runs, nil
}

// FetchAhead long-polls for work as Fetch does, as an agent that runs
// runs handed ahead: GET PathWork?wait=<PollWait>s&ahead=1.
func (t *HTTPTransport) FetchAhead(ctx context.Context) (protocol.WorkResponse, error) {
	var resp protocol.WorkResponse
	err := t.poll(ctx, url.Values{protocol.WorkAheadParam: {"1"}}, &resp)
	return resp, err
}

// poll is one long poll for work, with the query q besides its wait.
func (t *HTTPTransport) poll(ctx context.Context, q url.Values, resp *protocol.WorkResponse) error {
	q.Set("wait", strconv.Itoa(t.waitSeconds())+"s")
	timeout := time.Duration(t.waitSeconds())*time.Second + t.timeout()
	return t.do(ctx, http.MethodGet, protocol.PathWork, q, t.Token, timeout, nil, resp)
}

// Report sends a finished run's result, and returns the runs the API
// handed back with its answer (a chain's next run, claimed for this agent).
func (t *HTTPTransport) Report(ctx context.Context, runID int64, res protocol.RunResult) ([]protocol.WorkItem, error) {
	var resp protocol.RunResultResponse
	err := t.do(ctx, http.MethodPost, fmt.Sprintf(protocol.PathRunResult, runID), nil, t.Token, t.timeout(), res, &resp)
	return resp.Runs, err
}

// ReportBatch sends several finished runs' results in one request (POST
// PathRunResults), in the order they ran, with the runs handed ahead that
// were not started (Released), and returns the API's answer to the last
// result: the runs it hands back, and with AheadMs > 0 handed ahead. An
// API without the route answers 404 without an error envelope.
func (t *HTTPTransport) ReportBatch(ctx context.Context, batch protocol.RunResults) (protocol.RunResultResponse, error) {
	var resp protocol.RunResultResponse
	err := t.do(ctx, http.MethodPost, protocol.PathRunResults, nil, t.Token, t.timeout(), batch, &resp)
	return resp, err
}

// Ack tells the API the agent took delivery of a run's attempt, so that it
// is not offered again. ahead asks, for a chain's head, for the chain's
// next runs handed ahead with the answer (protocol.RunAck.Ahead); an API
// that predates the field refuses it with 400.
func (t *HTTPTransport) Ack(ctx context.Context, runID int64, attempt int, ahead bool) (protocol.RunAckResponse, error) {
	var resp protocol.RunAckResponse
	err := t.do(ctx, http.MethodPost, fmt.Sprintf(protocol.PathRunAck, runID), nil, t.Token, t.timeout(),
		protocol.RunAck{Attempt: attempt, Ahead: ahead}, &resp)
	return resp, err
}

// RunHeartbeat tells the API the attempt of the run is still executing;
// cancel is true when the API wants it abandoned. Another attempt than the
// run's current one is answered 409.
func (t *HTTPTransport) RunHeartbeat(ctx context.Context, runID int64, attempt int) (bool, error) {
	var resp protocol.RunHeartbeatResponse
	err := t.do(ctx, http.MethodPost, fmt.Sprintf(protocol.PathRunHeartbeat, runID), nil, t.Token, t.timeout(),
		protocol.RunHeartbeatRequest{Attempt: attempt}, &resp)
	return resp.Cancel, err
}

// ShipLog sends the bytes of a run attempt's log from offset on and
// returns where the next chunk starts. When the API answers that the chunk
// starts past what it has (409 with the offset to send from), that offset
// is returned with no error, so the caller simply sends from there.
func (t *HTTPTransport) ShipLog(ctx context.Context, runID int64, attempt int, offset int64, data []byte) (protocol.RunLogState, error) {
	var resp protocol.RunLogState
	q := url.Values{"attempt": {strconv.Itoa(attempt)}, "offset": {strconv.FormatInt(offset, 10)}}
	err := t.do(ctx, http.MethodPost, fmt.Sprintf(protocol.PathRunLog, runID), q, t.Token, t.timeout(), rawBody(data), &resp)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict {
		if o, ok := apiErr.Details["offset"].(float64); ok && o >= 0 {
			return protocol.RunLogState{Offset: int64(o)}, nil
		}
	}
	return resp, err
}

// rawBody is a request body sent as is (application/octet-stream).
type rawBody []byte

func (t *HTTPTransport) timeout() time.Duration {
	if t.RequestTimeout > 0 {
		return t.RequestTimeout
	}
	return 30 * time.Second
}

func (t *HTTPTransport) waitSeconds() int {
	s := int((t.PollWait + time.Second - 1) / time.Second)
	return max(s, 1)
}

func (t *HTTPTransport) do(ctx context.Context, method, path string, query url.Values, token string, timeout time.Duration, in, out any) error {
	u := strings.TrimRight(t.BaseURL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var body io.Reader
	raw, isRaw := in.(rawBody)
	if isRaw {
		body = bytes.NewReader(raw)
	} else if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encoding request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if isRaw {
		req.Header.Set("Content-Type", "application/octet-stream")
	} else if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if t.UserAgent != "" {
		req.Header.Set("User-Agent", t.UserAgent)
	}
	client := t.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return newAPIError(method, path, resp.StatusCode, data)
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}

func newAPIError(method, path string, status int, body []byte) *APIError {
	e := &APIError{Method: method, Path: path, Status: status}
	var env protocol.ErrorBody
	if json.Unmarshal(body, &env) == nil && (env.Error.Message != "" || env.Error.Code != "") {
		e.Code, e.Message, e.Details = env.Error.Code, env.Error.Message, env.Error.Details
		return e
	}
	text := strings.TrimSpace(string(body))
	if len(text) > 512 {
		text = text[:512] + "…"
	}
	e.Message = text
	return e
}
