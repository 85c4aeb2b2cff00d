package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
)

const (
	enrollToken = "enroll-secret"
	nodeToken   = "node-token-1"
	nodeID      = int64(7)
)

// fakeAPI is an in-memory stand-in for the API's agent endpoints that
// records every call.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu                sync.Mutex
	calls             []string // "METHOD path auth"
	tokens            map[string]bool
	registers         []protocol.RegisterRequest
	registerFailures  int // answer 503 to this many registrations first
	heartbeats        []protocol.HeartbeatRequest
	heartbeatEverySec int // the period the heartbeat's answers ask for
	waits             []string
	pollAheads        []bool // whether each poll asked as an agent that runs runs ahead (protocol.WorkAheadParam)
	polling           int    // work fetches being answered
	generation        int    // the agent process work is handed to (see testConfig)
	queue             []protocol.WorkItem
	notify            chan struct{}
	runHeartbeats     map[int64]int
	hbAttempts        map[int64][]int // attempts named by run heartbeats
	cancelAfter       map[int64]int   // answer cancel from the Nth run heartbeat
	runHBStatus       map[int64]int   // answer run heartbeats with this status
	results           map[int64][]protocol.RunResult
	resultPosts       map[int64]int
	resultFailures    map[int64]int                 // answer 503 to this many result posts first
	resultStatus      map[int64]int                 // answer result posts with this status
	handBack          map[int64][]protocol.WorkItem // runs handed back with a run's result (a chain's next)
	refuseResultLog   int                           // answer a result carrying a log with this status (an API that does not take it)
	acks              map[int64][]int               // attempts acknowledged per run
	ackAheads         map[int64][]bool              // whether each ack acknowledged asked for runs ahead
	ackRefused        int                           // acks refused for asking for runs ahead
	ackStatus         map[int64]int                 // answer acks with this status
	software          []protocol.SoftwareDeployment
	softwareVersion   int // bumped at every listing, so the agent sees it again
	signals           map[int64][]protocol.SoftwareSignal
	logs              *fakeLogs   // the run logs shipped (logship_test.go)
	batch             fakeBatches // the batch route (batch_test.go)
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{
		t:              t,
		tokens:         map[string]bool{},
		notify:         make(chan struct{}, 1),
		runHeartbeats:  map[int64]int{},
		hbAttempts:     map[int64][]int{},
		cancelAfter:    map[int64]int{},
		runHBStatus:    map[int64]int{},
		results:        map[int64][]protocol.RunResult{},
		resultPosts:    map[int64]int{},
		resultFailures: map[int64]int{},
		resultStatus:   map[int64]int{},
		handBack:       map[int64][]protocol.WorkItem{},
		acks:           map[int64][]int{},
		ackAheads:      map[int64][]bool{},
		ackStatus:      map[int64]int{},
		signals:        map[int64][]protocol.SoftwareSignal{},
		logs:           newFakeLogs(),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.PathRegister, f.register)
	mux.HandleFunc("POST "+protocol.PathHeartbeat, f.heartbeat)
	mux.HandleFunc("GET "+protocol.PathWork, f.work)
	mux.HandleFunc("POST "+strings.Replace(protocol.PathRunHeartbeat, "%d", "{id}", 1), f.runHeartbeat)
	mux.HandleFunc("POST "+strings.Replace(protocol.PathRunResult, "%d", "{id}", 1), f.result)
	mux.HandleFunc("POST "+protocol.PathRunResults, f.batchResults)
	mux.HandleFunc("POST "+strings.Replace(protocol.PathRunAck, "%d", "{id}", 1), f.ack)
	mux.HandleFunc("POST "+strings.Replace(protocol.PathRunLog, "%d", "{id}", 1), f.runLog)
	mux.HandleFunc("GET "+protocol.PathSoftwareDeployments, f.softwareDeployments)
	mux.HandleFunc("POST "+strings.Replace(protocol.PathSoftwareSignal, "%d", "{id}", 1), f.signal)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each agent process talks to the fake under its own prefix, /g<n>
		// (see testConfig): a poll of a stopped process, still on the wire,
		// is told apart from the next process's polls.
		var gen int
		if _, err := fmt.Sscanf(r.URL.Path, "/g%d/", &gen); err == nil {
			r.URL.Path = strings.TrimPrefix(r.URL.Path, fmt.Sprintf("/g%d", gen))
			r = r.WithContext(context.WithValue(r.Context(), generationKey{}, gen))
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// generationKey keys the agent process generation of a request's prefix.
type generationKey struct{}

// stale reports whether a request comes from an agent process older than
// the newest one testConfig configured.
func (f *fakeAPI) stale(r *http.Request) bool {
	gen, ok := r.Context().Value(generationKey{}).(int)
	f.mu.Lock()
	defer f.mu.Unlock()
	return ok && gen != f.generation
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(protocol.ErrorBody{Error: protocol.ErrorDetail{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeAPI) record(r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
}

// authorized checks the node token and answers 401 when it is not valid.
func (f *fakeAPI) authorized(w http.ResponseWriter, r *http.Request) bool {
	f.mu.Lock()
	ok := f.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	f.mu.Unlock()
	if !ok {
		apiError(w, http.StatusUnauthorized, "unauthorized", "unknown node token")
	}
	return ok
}

func (f *fakeAPI) register(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if r.Header.Get("Authorization") != "Bearer "+enrollToken {
		apiError(w, http.StatusForbidden, "forbidden", "bad enrollment token")
		return
	}
	var req protocol.RegisterRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.registerFailures > 0 {
		f.registerFailures--
		apiError(w, http.StatusServiceUnavailable, "unavailable", "database is starting")
		return
	}
	f.registers = append(f.registers, req)
	f.tokens[nodeToken] = true
	writeJSON(w, protocol.RegisterResponse{NodeID: nodeID, Name: req.Name, Token: nodeToken})
}

func (f *fakeAPI) heartbeat(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	var req protocol.HeartbeatRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.heartbeats = append(f.heartbeats, req)
	f.mu.Unlock()
	writeJSON(w, protocol.HeartbeatResponse{NodeID: nodeID, Name: "node1.example.com", EverySec: f.heartbeatEverySec})
}

func (f *fakeAPI) work(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	wait, err := time.ParseDuration(r.URL.Query().Get("wait"))
	if err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", "wait: "+err.Error())
		return
	}
	f.mu.Lock()
	f.waits = append(f.waits, r.URL.Query().Get("wait"))
	asked := r.URL.Query().Get(protocol.WorkAheadParam) == "1"
	f.pollAheads = append(f.pollAheads, asked)
	f.polling++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.polling--
		f.mu.Unlock()
	}()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for {
		if r.Context().Err() != nil || f.stale(r) {
			// A poll of an agent that stopped, reaching the handler late:
			// it must not take runs meant for the next agent process.
			writeJSON(w, protocol.WorkResponse{Runs: []protocol.WorkItem{}})
			return
		}
		f.mu.Lock()
		runs := f.queue
		f.queue = nil
		resp := protocol.WorkResponse{Runs: runs}
		if asked && len(runs) > 0 {
			resp = f.pollAnswer(runs)
		}
		f.mu.Unlock()
		if len(runs) > 0 {
			writeJSON(w, resp)
			return
		}
		select {
		case <-f.notify:
		case <-timeout.C:
			writeJSON(w, protocol.WorkResponse{Runs: []protocol.WorkItem{}})
			return
		case <-r.Context().Done():
			return
		}
	}
}

func runID(r *http.Request) int64 {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id
}

func (f *fakeAPI) runHeartbeat(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	id := runID(r)
	var req protocol.RunHeartbeatRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.runHeartbeats[id]++
	f.hbAttempts[id] = append(f.hbAttempts[id], req.Attempt)
	n, after, status := f.runHeartbeats[id], f.cancelAfter[id], f.runHBStatus[id]
	f.mu.Unlock()
	if status != 0 {
		apiError(w, status, "conflict", fmt.Sprintf("run %d is not running", id))
		return
	}
	writeJSON(w, protocol.RunHeartbeatResponse{Cancel: after > 0 && n >= after})
}

func (f *fakeAPI) result(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	id := runID(r)
	var res protocol.RunResult
	if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resultPosts[id]++
	if f.resultFailures[id] > 0 {
		f.resultFailures[id]--
		apiError(w, http.StatusServiceUnavailable, "unavailable", "try later")
		return
	}
	if res.Log != nil && f.refuseResultLog != 0 {
		apiError(w, f.refuseResultLog, "invalid_input", `json: unknown field "log"`)
		return
	}
	f.keepResult(id, res)
	if st := f.resultStatus[id]; st != 0 {
		apiError(w, st, "conflict", fmt.Sprintf("run %d was not awaiting a result", id))
		return
	}
	if next := f.handBack[id]; len(next) > 0 {
		delete(f.handBack, id)
		writeJSON(w, protocol.RunResultResponse{RunID: id, State: "succeeded", NextRunID: next[0].RunID, Runs: next})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// keepResult records a run's result; the end of the log sent with it is
// stored as a log request's chunk would be. The caller holds mu.
func (f *fakeAPI) keepResult(id int64, res protocol.RunResult) {
	if res.Log != nil {
		k := logKey{id, res.Attempt}
		f.logs.withResult[k]++
		if size, ok := f.logs.store(k, res.Log.Offset, res.Log.Data); !ok {
			f.t.Errorf("run %d: the log sent with the result starts at %d, past %d", id, res.Log.Offset, size)
		}
		res.Log = nil
	}
	f.results[id] = append(f.results[id], res)
}

func (f *fakeAPI) ack(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	id := runID(r)
	var req protocol.RunAck
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Ahead && !f.batch.on {
		// An older API, without the batch route, knows no "ahead" and
		// refuses unknown fields.
		f.ackRefused++
		apiError(w, http.StatusBadRequest, "invalid_input", "ahead: unknown field")
		return
	}
	if st := f.ackStatus[id]; st != 0 {
		apiError(w, st, "conflict", fmt.Sprintf("run %d is not running", id))
		return
	}
	f.acks[id] = append(f.acks[id], req.Attempt)
	f.ackAheads[id] = append(f.ackAheads[id], req.Ahead)
	writeJSON(w, f.ackAnswer(id, req))
}

// softwareDeployments lists f.software under a new version every time
// (after a short wait), as an API whose signals never arrived would.
func (f *fakeAPI) softwareDeployments(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	time.Sleep(20 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.softwareVersion++
	writeJSON(w, protocol.SoftwareDeploymentsResponse{Version: strconv.Itoa(f.softwareVersion),
		Deployments: append([]protocol.SoftwareDeployment{}, f.software...)})
}

func (f *fakeAPI) signal(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	var sig protocol.SoftwareSignal
	if err := json.NewDecoder(r.Body).Decode(&sig); err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals[runID(r)] = append(f.signals[runID(r)], sig)
	writeJSON(w, map[string]any{})
}

func (f *fakeAPI) push(items ...protocol.WorkItem) {
	f.mu.Lock()
	f.queue = append(f.queue, items...)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// waitNoPolls waits until no work fetch is being answered, so that a stopped
// agent's fetch cannot take work meant for the next one.
func (f *fakeAPI) waitNoPolls(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.polling == 0
	}, 5*time.Second, 5*time.Millisecond)
}

func (f *fakeAPI) revokeTokens() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.tokens)
}

// waitResults waits until run id has n recorded results and returns them.
func (f *fakeAPI) waitResults(t *testing.T, id int64, n int) []protocol.RunResult {
	t.Helper()
	var got []protocol.RunResult
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = append([]protocol.RunResult(nil), f.results[id]...)
		return len(got) >= n
	}, 10*time.Second, 10*time.Millisecond, "results of run %d", id)
	return got
}

func (f *fakeAPI) snapshot() (registers []protocol.RegisterRequest, heartbeats []protocol.HeartbeatRequest, calls []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.RegisterRequest(nil), f.registers...),
		append([]protocol.HeartbeatRequest(nil), f.heartbeats...),
		append([]string(nil), f.calls...)
}

func (f *fakeAPI) count(m map[int64]int, id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[id]
}

// testConfig returns fast settings for the agent in dir.
// Each call configures a new agent process: from then on, work goes only to
// its polls.
func testConfig(t *testing.T, f *fakeAPI, dir string) daemon.Config {
	f.mu.Lock()
	f.generation++
	gen := f.generation
	f.mu.Unlock()
	return daemon.Config{
		APIURL:            fmt.Sprintf("%s/g%d", f.srv.URL, gen),
		Name:              "node1.example.com",
		EnrollToken:       enrollToken,
		WorkDir:           dir,
		Address:           "10.0.0.5:7000",
		HeartbeatEvery:    50 * time.Millisecond,
		RunHeartbeatEvery: 50 * time.Millisecond,
		PollWait:          time.Second,
		RetryMin:          10 * time.Millisecond,
		RetryMax:          50 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// start runs the agent in the background; the returned function stops it
// and returns Run's error.
func start(t *testing.T, cfg daemon.Config) (stop func() error, done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	var err error
	go func() {
		defer close(finished)
		err = daemon.Run(ctx, cfg)
	}()
	errc := make(chan error, 1)
	go func() {
		<-finished
		errc <- err
	}()
	stop = func() error {
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context was cancelled")
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, errc
}

func work(id int64, attempt int, cmd string) protocol.WorkItem {
	return protocol.WorkItem{RunID: id, Attempt: attempt, TransactionID: "tx-e2e", Graph: "deployment",
		Task: fmt.Sprintf("task%d", id), Type: "shell", Command: cmd, TimeoutSec: 30}
}

func lines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Count(string(data), "\n")
}

func TestRunRegistersExecutesAndRestartsWithCredential(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	cfg := testConfig(t, f, dir)
	stop, _ := start(t, cfg)

	f.push(
		work(1, 1, `echo hello; echo ran >> "$ANNEAL_WORKDIR/count-1"; echo greeting=hi > "$ANNEAL_OUTPUTS"`),
		work(2, 3, `echo oops >&2; exit 4`),
	)
	r1 := f.waitResults(t, 1, 1)[0]
	assert.Equal(t, 1, r1.Attempt)
	assert.Equal(t, 0, r1.ExitCode)
	assert.Equal(t, "hello\n", r1.StdoutTail)
	assert.Equal(t, map[string]string{"greeting": "hi"}, r1.Outputs)
	r2 := f.waitResults(t, 2, 1)[0]
	assert.Equal(t, 3, r2.Attempt)
	assert.Equal(t, 4, r2.ExitCode)
	assert.Equal(t, "oops\n", r2.StderrTail)
	assert.FileExists(t, filepath.Join(dir, "logs", "tx-e2e", "task2.2.3.log"))

	// The same (run, attempt) handed out again is not run twice (its
	// stored result is reported again); a new attempt of the same run is.
	f.push(work(1, 1, `echo ran >> "$ANNEAL_WORKDIR/count-1"`), work(3, 1, "true"))
	f.waitResults(t, 3, 1)
	f.push(work(1, 2, `echo ran >> "$ANNEAL_WORKDIR/count-1"`))
	r1b := f.waitResults(t, 1, 3)
	assert.Equal(t, r1, r1b[1], "the stored result, again")
	assert.Equal(t, 2, r1b[2].Attempt)
	assert.Equal(t, 2, lines(t, filepath.Join(dir, "count-1")))
	assert.Equal(t, 1, f.count(f.resultPosts, 3))
	f.mu.Lock()
	assert.Equal(t, []int{1, 2}, f.acks[1], "each attempt acknowledged once, before it ran")
	f.mu.Unlock()

	// Node heartbeats flow with the node token.
	require.Eventually(t, func() bool {
		_, hbs, _ := f.snapshot()
		return len(hbs) >= 2
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	f.waitNoPolls(t)

	regs, hbs, calls := f.snapshot()
	require.Len(t, regs, 1)
	assert.Equal(t, "node1.example.com", regs[0].Name)
	assert.Equal(t, "10.0.0.5:7000", regs[0].Address)
	assert.NotEmpty(t, regs[0].BootID)
	for _, hb := range hbs {
		assert.Equal(t, regs[0].BootID, hb.BootID)
		assert.Equal(t, "10.0.0.5:7000", hb.Address)
	}
	for _, c := range calls {
		if strings.HasPrefix(c, "POST "+protocol.PathRegister) {
			assert.Equal(t, "POST "+protocol.PathRegister+" Bearer "+enrollToken, c)
		} else {
			assert.True(t, strings.HasSuffix(c, " Bearer "+nodeToken), c)
		}
	}
	f.mu.Lock()
	assert.Contains(t, f.waits, "1s")
	f.mu.Unlock()

	// The credential is stored, private.
	credPath := filepath.Join(dir, daemon.CredentialFile)
	st, err := os.Stat(credPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	cred, err := daemon.LoadCredential(credPath)
	require.NoError(t, err)
	assert.Equal(t, daemon.Credential{NodeID: nodeID, Name: "node1.example.com", Token: nodeToken, APIURL: cfg.APIURL}, cred)

	// A restart uses the stored credential, needs no enrollment token and
	// does not register again; it has a new boot id.
	cfg = testConfig(t, f, dir)
	cfg.EnrollToken = ""
	stop2, _ := start(t, cfg)
	f.push(work(4, 1, `echo again`))
	r4 := f.waitResults(t, 4, 1)[0]
	assert.Equal(t, "again\n", r4.StdoutTail)
	require.NoError(t, stop2())

	regs, hbs2, _ := f.snapshot()
	assert.Len(t, regs, 1)
	require.Greater(t, len(hbs2), len(hbs))
	assert.NotEqual(t, regs[0].BootID, hbs2[len(hbs2)-1].BootID)
}

// A chain's next run handed back with the answer to a report is executed
// at once, without a poll for it: the API never queues it here. One the
// API took as acknowledged with its hand-back gets no ack; one it did not
// (an older API) is acknowledged like any other.
func TestRunHandedBackWithAReport(t *testing.T) {
	f := newFakeAPI(t)
	stop, _ := start(t, testConfig(t, f, t.TempDir()))
	taken := work(3, 1, "echo third")
	taken.Acknowledged = true
	f.mu.Lock()
	f.handBack[1] = []protocol.WorkItem{work(2, 1, "echo second")}
	f.handBack[2] = []protocol.WorkItem{taken}
	f.mu.Unlock()
	f.push(work(1, 1, "echo first"))
	assert.Equal(t, "first\n", f.waitResults(t, 1, 1)[0].StdoutTail)
	assert.Equal(t, "second\n", f.waitResults(t, 2, 1)[0].StdoutTail)
	assert.Equal(t, "third\n", f.waitResults(t, 3, 1)[0].StdoutTail)
	f.mu.Lock()
	assert.Equal(t, []int{1}, f.acks[2], "the handed-back run is acknowledged like any other")
	assert.Empty(t, f.acks[3], "acknowledged by its hand-back")
	f.mu.Unlock()
	require.NoError(t, stop())
}

func TestRunHeartbeatsAndCancel(t *testing.T) {
	f := newFakeAPI(t)
	f.cancelAfter[10] = 3
	start(t, testConfig(t, f, t.TempDir()))

	began := time.Now()
	f.push(work(10, 4, `sleep 30`), work(11, 1, `echo next`))
	r := f.waitResults(t, 10, 1)[0]
	assert.Less(t, time.Since(began), 8*time.Second)
	assert.Equal(t, -1, r.ExitCode)
	assert.Equal(t, "cancelled: the API asked to cancel the run", r.Error)
	assert.Equal(t, 4, r.Attempt)
	assert.GreaterOrEqual(t, f.count(f.runHeartbeats, 10), 3)
	f.mu.Lock()
	for _, a := range f.hbAttempts[10] {
		assert.Equal(t, 4, a, "run heartbeats name their attempt")
	}
	f.mu.Unlock()

	// The agent goes on with the next run.
	assert.Equal(t, "next\n", f.waitResults(t, 11, 1)[0].StdoutTail)
}

func TestRunAbandonedOnConflictAndRefusedReport(t *testing.T) {
	f := newFakeAPI(t)
	f.runHBStatus[20] = http.StatusConflict
	f.resultStatus[20] = http.StatusConflict
	start(t, testConfig(t, f, t.TempDir()))

	f.push(work(20, 2, `sleep 30`), work(21, 1, `echo next`))
	r := f.waitResults(t, 20, 1)[0]
	assert.Equal(t, -1, r.ExitCode)
	assert.Equal(t, "cancelled: the API no longer awaits the run: run 20 is not running", r.Error)
	assert.Equal(t, 2, r.Attempt)

	// A 4xx answer to the report is final: no retry, the agent moves on.
	f.waitResults(t, 21, 1)
	assert.Equal(t, 1, f.count(f.resultPosts, 20))
}

func TestRunRetriesReportAfter503(t *testing.T) {
	f := newFakeAPI(t)
	f.resultFailures[30] = 3
	start(t, testConfig(t, f, t.TempDir()))

	f.push(work(30, 1, `echo done`))
	r := f.waitResults(t, 30, 1)[0]
	assert.Equal(t, "done\n", r.StdoutTail)
	assert.Equal(t, 4, f.count(f.resultPosts, 30))
}

func TestRunStopCancelsRunningCommand(t *testing.T) {
	f := newFakeAPI(t)
	stop, _ := start(t, testConfig(t, f, t.TempDir()))

	f.push(work(40, 1, `echo started; sleep 30`))
	require.Eventually(t, func() bool { return f.count(f.runHeartbeats, 40) > 0 }, 5*time.Second, 10*time.Millisecond)
	began := time.Now()
	require.NoError(t, stop())
	assert.Less(t, time.Since(began), 5*time.Second)

	// The interrupted run is reported, best effort.
	r := f.waitResults(t, 40, 1)[0]
	assert.Equal(t, "cancelled: the agent is stopping", r.Error)
	assert.Equal(t, "started\n", r.StdoutTail)
}

func TestRunRejectedStoredCredential(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	credPath := filepath.Join(dir, daemon.CredentialFile)
	require.NoError(t, daemon.SaveCredential(credPath, daemon.Credential{NodeID: 3, Name: "node1.example.com", Token: "stale", APIURL: f.srv.URL}))

	cfg := testConfig(t, f, dir)
	cfg.APIURL = "" // taken from the credential
	_, done := start(t, cfg)
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not fail on a rejected credential")
	}
	require.ErrorIs(t, err, daemon.ErrCredentialRejected)
	assert.Contains(t, err.Error(), "unknown node token")
	assert.Contains(t, err.Error(), "delete "+credPath)
	assert.Contains(t, err.Error(), "re-enroll")

	regs, _, calls := f.snapshot()
	assert.Empty(t, regs)
	assert.Equal(t, []string{"POST " + protocol.PathHeartbeat + " Bearer stale"}, calls)
}

func TestRunCredentialRevokedWhileRunning(t *testing.T) {
	f := newFakeAPI(t)
	_, done := start(t, testConfig(t, f, t.TempDir()))
	require.Eventually(t, func() bool {
		_, hbs, _ := f.snapshot()
		return len(hbs) > 0
	}, 5*time.Second, 10*time.Millisecond)

	f.revokeTokens()
	select {
	case err := <-done:
		require.ErrorIs(t, err, daemon.ErrCredentialRejected)
		assert.Contains(t, err.Error(), "delete ")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not fail on a revoked credential")
	}
}

func TestRunRegistrationRefused(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	cfg := testConfig(t, f, dir)
	cfg.EnrollToken = "wrong"
	err := daemon.Run(context.Background(), cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad enrollment token")
	assert.Contains(t, err.Error(), "403")
	assert.NoFileExists(t, filepath.Join(dir, daemon.CredentialFile))
}

func TestRunRegistrationRetriedAfter503(t *testing.T) {
	f := newFakeAPI(t)
	f.registerFailures = 2
	dir := t.TempDir()
	start(t, testConfig(t, f, dir))
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, daemon.CredentialFile))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	regs, _, calls := f.snapshot()
	assert.Len(t, regs, 1)
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, "POST "+protocol.PathRegister) {
			n++
		}
	}
	assert.Equal(t, 3, n)
}

func TestRunNeedsEnrollTokenWithoutCredential(t *testing.T) {
	f := newFakeAPI(t)
	cfg := testConfig(t, f, t.TempDir())
	cfg.EnrollToken = ""
	err := daemon.Run(context.Background(), cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no enrollment token")
	_, _, calls := f.snapshot()
	assert.Empty(t, calls)
}

func TestRunStopsWhileRegistrationRetries(t *testing.T) {
	// Nothing listens: registration keeps failing until the context ends,
	// and Run then returns nil.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	f := &fakeAPI{srv: &httptest.Server{URL: url}}
	cfg := testConfig(t, f, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	assert.NoError(t, daemon.Run(ctx, cfg))
}

// A second agent on a work directory another one runs on is refused,
// naming the directory and the first agent's pid: the two would share one
// run journal. Once the first stops, the directory is free again.
func TestOneAgentPerWorkDir(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	stop, _ := start(t, testConfig(t, f, dir))
	f.push(work(70, 1, "true"))
	f.waitResults(t, 70, 1)

	cfg := testConfig(t, f, dir)
	cfg.EnrollToken = ""
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := daemon.Run(ctx, cfg) // returns at once when refused
	require.Error(t, err)
	assert.Contains(t, err.Error(), "in use by another agent")
	assert.Contains(t, err.Error(), fmt.Sprintf("pid %d", os.Getpid()))
	assert.Contains(t, err.Error(), dir)

	require.NoError(t, stop())
	f.waitNoPolls(t)
	start(t, cfg)
	f.push(work(71, 1, "true"))
	f.waitResults(t, 71, 1)
}

// An agent prunes, at its start, run logs older than LogRetention, and
// the directories they leave empty; newer logs, and files a command wrote
// there that are not run logs, stay; a directory it cannot prune does not
// stop it.
func TestOldLogsPrunedAtStart(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	logs := filepath.Join(dir, daemon.LogsDir)
	oldLog := filepath.Join(logs, "tx-old", "task1.1.1.log")
	oldInMixed := filepath.Join(logs, "tx-mixed", "task2.2.1.log")
	recent := filepath.Join(logs, "tx-mixed", "task3.3.1.log")
	notALog := filepath.Join(logs, "tx-mixed", "data.txt")
	afterBad := filepath.Join(logs, "tx-z", "task4.4.1.log")
	long := time.Now().Add(-daemon.LogRetention - time.Hour)
	for _, p := range []string{oldLog, oldInMixed, recent, notALog, afterBad} {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("# a log\n"), 0o644))
	}
	for _, p := range []string{oldLog, oldInMixed, notALog, afterBad} {
		require.NoError(t, os.Chtimes(p, long, long))
	}
	// An old log that cannot be removed (immutable, which even root
	// cannot remove), in a directory before tx-z in name order.
	stuck := filepath.Join(logs, "tx-bad", "task5.5.1.log")
	require.NoError(t, os.MkdirAll(filepath.Dir(stuck), 0o755))
	require.NoError(t, os.WriteFile(stuck, nil, 0o644))
	require.NoError(t, os.Chtimes(stuck, long, long))
	setImmutable(t, stuck, true)
	t.Cleanup(func() { setImmutable(t, stuck, false) })

	start(t, testConfig(t, f, dir))
	f.push(work(80, 1, "true"))
	f.waitResults(t, 80, 1)
	assert.NoDirExists(t, filepath.Dir(oldLog), "emptied, then removed")
	assert.NoFileExists(t, oldInMixed)
	assert.FileExists(t, recent)
	assert.FileExists(t, notALog, "not a run's log")
	assert.FileExists(t, stuck, "could not be removed")
	assert.NoFileExists(t, afterBad, "pruned past a file that could not be")
	assert.FileExists(t, filepath.Join(logs, "tx-e2e", "task80.80.1.log"), "this run's")
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h, which x/sys/unix does
// not name.
const fsImmutableFL = 0x10

// setImmutable sets or clears a file's immutable attribute (chattr +i).
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	require.NoError(t, err, "the file system must support file attributes (ext4 does)")
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	require.NoError(t, unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags))
}

// An agent not given a node heartbeat period keeps to the one the API asks
// for in its answers; one given a period keeps to its own.
func TestHeartbeatPeriodAskedByTheAPI(t *testing.T) {
	f := newFakeAPI(t)
	f.mu.Lock()
	f.heartbeatEverySec = 1
	f.mu.Unlock()
	dir := t.TempDir()
	stop, _ := start(t, testConfig(t, f, dir)) // enrolls
	require.Eventually(t, func() bool { regs, _, _ := f.snapshot(); return len(regs) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())

	beatsIn := func(cfg daemon.Config, d time.Duration) int {
		_, before, _ := f.snapshot()
		stop, _ := start(t, cfg)
		time.Sleep(d)
		require.NoError(t, stop())
		_, after, _ := f.snapshot()
		return len(after) - len(before)
	}
	cfg := testConfig(t, f, dir)
	cfg.HeartbeatEvery = 0
	assert.GreaterOrEqual(t, beatsIn(cfg, 2500*time.Millisecond), 3, "the first (with the stored credential), then one a second, not one in 10 s")
	cfg = testConfig(t, f, dir)
	cfg.HeartbeatEvery = time.Hour
	assert.Equal(t, 1, beatsIn(cfg, 2500*time.Millisecond), "the first only: its own period")
}
