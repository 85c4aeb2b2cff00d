// Package daemon is the anneal node agent: it phones home to the API, keeps
// the node's heartbeat, long-polls for the runs handed to its node, executes
// them one at a time and reports their results.
//
// The pieces are small interfaces so that each can be replaced in tests or by
// another transport: a WorkSource hands out work, an Executor runs one work
// item, a Reporter sends run heartbeats and results. HTTPTransport is the
// WorkSource and Reporter speaking the protocol package's endpoints;
// ShellExecutor runs "shell" items.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// WorkSource hands out the runs to execute on this node. Fetch may block
// (long-poll) until work arrives or its wait ends, then returns an empty list.
type WorkSource interface {
	Fetch(ctx context.Context) ([]protocol.WorkItem, error)
}

// AheadSource is a WorkSource that can poll as an agent that reports
// batches (protocol.WorkAheadParam): the runs come marked acknowledged,
// needing no ack, and the first may head its chain's next runs, handed
// ahead (protocol.WorkResponse.Ahead).
type AheadSource interface {
	FetchAhead(ctx context.Context) (protocol.WorkResponse, error)
}

// Executor runs one work item until it finishes or ctx is done. Everything
// that goes wrong is described in the result.
type Executor interface {
	Execute(ctx context.Context, item protocol.WorkItem) protocol.RunResult
}

// Reporter tells the API about runs: RunHeartbeat while a run executes (cancel
// is true when the API wants it abandoned), Report when it has finished.
// Report returns the runs the API handed back with its answer (a chain's
// next run), to execute before polling again.
type Reporter interface {
	Report(ctx context.Context, runID int64, res protocol.RunResult) ([]protocol.WorkItem, error)
	RunHeartbeat(ctx context.Context, runID int64, attempt int) (cancel bool, err error)
}

// Acker is implemented by a Reporter that can acknowledge a run before it
// executes (HTTPTransport does): the API offers a run again until it is
// acknowledged. The answer's Cancel is true when the run is no longer
// awaited. ahead, sent only by an agent that reports batches, asks for
// the chain's next runs handed ahead when the run heads a chain: the
// answer's Runs and AheadMs (protocol.RunAckResponse).
type Acker interface {
	Ack(ctx context.Context, runID int64, attempt int, ahead bool) (protocol.RunAckResponse, error)
}

// BatchReporter is implemented by a Reporter that can send several results
// in one request (HTTPTransport does): the agent then reports every result
// through it, a single one too, since only the answer to a batch may hand
// a chain's next runs ahead (protocol.RunResultResponse.AheadMs), and the
// results of runs handed ahead go together in one batch.
type BatchReporter interface {
	ReportBatch(ctx context.Context, batch protocol.RunResults) (protocol.RunResultResponse, error)
}

// Config configures Run.
type Config struct {
	// APIURL is the API's base URL. It may be empty when a stored
	// credential names it.
	APIURL string
	// Name is the node's FQDN, sent when registering.
	Name string
	// Admin registers the node as an admin node.
	Admin bool
	// EnrollToken authenticates the first registration; it is not needed
	// once a credential is stored.
	EnrollToken string
	// WorkDir holds the credential, the run logs, and is where commands run.
	// Default "anneal-agent".
	WorkDir string
	// Address is where peers can reach the agent (host:port), if anywhere.
	Address string
	// Listen, when set, is where the agent accepts peers' reachability
	// checks (usually the same host:port as Address).
	Listen string
	// RebootCommand reboots the machine for a reboot task (e.g.
	// "systemctl reboot"); empty simulates it: the agent takes a new boot id.
	RebootCommand string
	// HeartbeatEvery is the node heartbeat period; default the period the
	// API asks for (a third of the silence after which it counts a node not
	// alive: 20s by default), 10s with an API that does not say.
	HeartbeatEvery time.Duration
	// RunHeartbeatEvery is the run heartbeat period; default 5s.
	RunHeartbeatEvery time.Duration
	// LogShipEvery is how often a running run's new log lines are sent to
	// the API; default 1s.
	LogShipEvery time.Duration
	// PollWait is how long the API may hold a work fetch; default 55s,
	// under the API's longest (60s): an idle agent asks about once a minute.
	PollWait time.Duration
	// RetryMin and RetryMax bound the exponential backoff between retries
	// of failed calls; defaults 200ms and 10s.
	RetryMin, RetryMax time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// HTTPClient defaults to NewHTTPClient(). Each call sets its own deadline,
	// so it should have no overall Timeout shorter than PollWait.
	HTTPClient *http.Client
	// Executor runs the work items; default a ShellExecutor in WorkDir.
	Executor Executor
	// HooksDir holds the software deployment hooks, one executable per
	// config group (see Hooks); default <WorkDir>/hooks.
	HooksDir string
	// Audrey, when set, makes the node a deployable's instance: the agent
	// also speaks the config-server protocol with the instance's
	// credential (see RunAudrey).
	Audrey *AudreyConfig
}

// ErrCredentialRejected is wrapped by the error Run returns when the API
// answers 401 to the stored node credential.
var ErrCredentialRejected = errors.New("the API rejected the node credential")

// errAgentStopping is the cause of cancellation when Run's context ends.
var errAgentStopping = errors.New("the agent is stopping")

// fatalError stops Run with err.
type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

type runKey struct {
	runID   int64
	attempt int
}

func keyOf(item protocol.WorkItem) runKey { return runKey{item.RunID, item.Attempt} }

type agent struct {
	cfg      Config
	log      *slog.Logger
	workDir  string
	credPath string
	bootMu   sync.Mutex // bootID changes at a (simulated) reboot
	bootID   string
	name     string
	api      *HTTPTransport
	src      WorkSource
	rep      Reporter
	exec     Executor
	stop     context.CancelCauseFunc
	records  *Records
	// active holds the runs this process is executing; a record in phase
	// started that is not here was left by a process that died.
	activeMu sync.Mutex
	active   map[runKey]struct{}
	// handed are runs the API handed back with a report (a chain's next
	// run, or runs handed ahead), executed before the next poll.
	handedMu sync.Mutex
	handed   []queued
	// Only the work loop (and recover, before it) reports results, so
	// what follows needs no lock.
	//
	// ahead is the list of runs handed ahead that the run going on heads
	// or belongs to, nil when it is no such list's.
	ahead *aheadList
	// pending holds the results kept for one batch while runs handed
	// ahead go on (see submit).
	pending []pendingReport
	// noBatches is set once the API answered that it has no batch route
	// (an older API): results go one by one for the life of the process.
	noBatches bool
	// noAckAhead is set once the API refused an ack that asked for runs
	// ahead (an API that predates protocol.RunAck.Ahead refuses unknown
	// fields): acks ask no more for the life of the process.
	noAckAhead bool
	// heartbeatEvery is the node heartbeat period the API asked for
	// (learnHeartbeatPeriod), 0 until it has.
	heartbeatEvery atomic.Int64
}

// Run runs the agent until ctx is done, then returns nil, or until a fatal
// error: a refused registration, a rejected credential, an unusable work
// directory.
//
// At start it loads <WorkDir>/credential.json, or registers with EnrollToken
// and stores the credential it gets, and reports as failed the runs its
// durable record (see Records) shows started by a previous process that
// never finished them, together with the results that process kept for a
// batch and never sent, in the order they ran. Then it sends a node
// heartbeat every HeartbeatEvery, and long-polls for work; each run handed
// out is acknowledged (asking, when the API takes batches, for the chain's
// next runs handed ahead when it heads one), recorded started and executed
// once (never twice for the same run and attempt, even across restarts: a
// run offered again gets its stored result), with a run heartbeat every
// RunHeartbeatEvery that cancels the execution when the API asks for it or
// no longer knows the run (404, 409), and its result is reported, retrying
// network errors and 5xx with backoff: in a batch (BatchReporter) with the
// results of the chain's runs the API handed ahead and that ran after it,
// when it did. Runs handed ahead that may no longer start (their window
// closed while a run went on) are released at once. A run interrupted by
// the agent's own shutdown is reported as cancelled, best effort.
func Run(ctx context.Context, cfg Config) error {
	a, err := newAgent(cfg)
	if err != nil {
		return err
	}
	release, err := lockWorkDir(a.workDir)
	if err != nil {
		return err
	}
	defer release()
	defer a.records.Close() // the run journal, opened at its first use
	// The agent's context is cancelled with a cause: errAgentStopping when
	// the caller's ctx ends, a *fatalError when the agent must stop.
	actx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stop(nil)
	unhook := context.AfterFunc(ctx, func() { stop(errAgentStopping) })
	defer unhook()
	a.stop = stop

	if err := a.connect(actx); err != nil {
		return a.outcome(actx, err)
	}
	if a.exec == nil {
		a.exec = &ShellExecutor{WorkDir: a.workDir, NodeName: a.name, Logger: a.log, ReuseScratch: true}
	}
	a.log.Info("agent started", "boot_id", a.bootID, "api", a.api.BaseURL, "workdir", a.workDir)

	a.recover(actx)
	var wg sync.WaitGroup
	wg.Go(func() { a.heartbeatLoop(actx) })
	wg.Go(func() { a.softwareLoop(actx) })
	wg.Go(func() { a.probeLoop(actx) })
	wg.Go(func() { a.pruneLoop(actx) })
	if cfg.Audrey != nil {
		wg.Go(func() {
			err := RunAudrey(actx, a.api.BaseURL, a.workDir, cfg.HooksDir, a.name, *cfg.Audrey, cfg.HTTPClient, a.log)
			if err != nil && actx.Err() == nil {
				a.log.Error("the instance's config-server protocol stopped", "error", err)
			}
		})
	}
	a.workLoop(actx)
	stop(errAgentStopping)
	wg.Wait()
	return a.outcome(actx, nil)
}

// NewHTTPClient is the agent's default client: its own transport that keeps
// a connection for each request it may have in flight to the API (the work
// poll, the software poll, a heartbeat, a run's report), where
// http.DefaultTransport keeps two and the others dial anew each time.
func NewHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 4
	return &http.Client{Transport: t}
}

func newAgent(cfg Config) (*agent, error) {
	if cfg.Name == "" {
		return nil, errors.New("no node name given")
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = "anneal-agent"
	}
	if cfg.RunHeartbeatEvery <= 0 {
		cfg.RunHeartbeatEvery = 5 * time.Second
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 55 * time.Second
	}
	if cfg.LogShipEvery <= 0 {
		cfg.LogShipEvery = time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 200 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 10 * time.Second
	}
	cfg.RetryMax = max(cfg.RetryMax, cfg.RetryMin)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = NewHTTPClient()
	}
	if cfg.APIURL != "" {
		if err := checkURL(cfg.APIURL); err != nil {
			return nil, err
		}
	}
	workDir, err := filepath.Abs(cfg.WorkDir)
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	a := &agent{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.Name),
		workDir:  workDir,
		credPath: filepath.Join(workDir, CredentialFile),
		bootID:   uuid.NewString(),
		name:     cfg.Name,
		exec:     cfg.Executor,
		records:  &Records{Dir: filepath.Join(workDir, RecordsDir)},
		active:   map[runKey]struct{}{},
	}
	// A compaction of the run journal that fails is logged, not fatal.
	a.records.Logger = a.log
	a.api = &HTTPTransport{
		BaseURL:   cfg.APIURL,
		Client:    cfg.HTTPClient,
		PollWait:  cfg.PollWait,
		UserAgent: "anneal-agent",
	}
	a.src, a.rep = a.api, a.api
	return a, nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("API URL %q is not an http(s) URL", s)
	}
	return nil
}

// outcome is what Run returns: the fatal error if there was one, nil when
// the agent was merely asked to stop, else err.
func (a *agent) outcome(ctx context.Context, err error) error {
	var fe *fatalError
	if errors.As(context.Cause(ctx), &fe) {
		a.log.Error("agent stopped", "error", fe.err)
		return fe.err
	}
	if errors.As(err, &fe) {
		return fe.err
	}
	if ctx.Err() != nil {
		a.log.Info("agent stopped")
		return nil
	}
	return err
}

func (a *agent) fatal(err error) {
	a.stop(&fatalError{err})
}

func (a *agent) credentialRejected(err error) error {
	return fmt.Errorf("%w (%s): delete %s and restart the agent with an enrollment token to re-enroll the node",
		ErrCredentialRejected, apiMessage(err), a.credPath)
}

// connect loads the stored credential and checks it with a first heartbeat,
// or registers the node and stores its new credential.
func (a *agent) connect(ctx context.Context) error {
	cred, err := LoadCredential(a.credPath)
	if errors.Is(err, fs.ErrNotExist) {
		return a.register(ctx)
	}
	if err != nil {
		return err
	}
	switch {
	case a.cfg.APIURL == "" && cred.APIURL == "":
		return fmt.Errorf("no API URL given and none stored in %s", a.credPath)
	case a.cfg.APIURL == "":
		if err := checkURL(cred.APIURL); err != nil {
			return fmt.Errorf("%w (stored in %s)", err, a.credPath)
		}
		a.api.BaseURL = cred.APIURL
	case cred.APIURL != "" && cred.APIURL != a.cfg.APIURL:
		a.log.Warn("the stored credential was issued by another API URL; using the configured one",
			"stored", cred.APIURL, "configured", a.cfg.APIURL)
	}
	if cred.Name != "" && cred.Name != a.cfg.Name {
		a.log.Warn("the stored credential belongs to another node name; using it anyway (delete it to re-enroll under the new name)",
			"stored", cred.Name, "configured", a.cfg.Name, "credential", a.credPath)
		a.name = cred.Name
		a.log = a.cfg.Logger.With("node", a.name)
	}
	a.api.Token = cred.Token

	var hb protocol.HeartbeatResponse
	err = a.retry(ctx, "node heartbeat", func(ctx context.Context) error {
		var err error
		hb, err = a.api.Heartbeat(ctx, a.heartbeatRequest())
		return err
	})
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return err
	case statusOf(err) == http.StatusUnauthorized:
		return a.credentialRejected(err)
	default:
		return fmt.Errorf("first heartbeat refused by the API: %w", err)
	}
	a.learnHeartbeatPeriod(hb)
	if hb.NodeID != 0 && cred.NodeID != 0 && hb.NodeID != cred.NodeID {
		a.log.Warn("the API says the credential belongs to another node id", "stored", cred.NodeID, "api", hb.NodeID)
	}
	a.log.Info("using the stored credential", "node_id", hb.NodeID, "credential", a.credPath)
	return nil
}

func (a *agent) register(ctx context.Context) error {
	if a.cfg.APIURL == "" {
		return errors.New("no credential stored and no API URL given")
	}
	if a.cfg.EnrollToken == "" {
		return fmt.Errorf("no credential in %s and no enrollment token given to register the node", a.credPath)
	}
	req := protocol.RegisterRequest{Name: a.cfg.Name, Admin: a.cfg.Admin, BootID: a.currentBootID(), Address: a.cfg.Address}
	var resp protocol.RegisterResponse
	err := a.retry(ctx, "registration", func(ctx context.Context) error {
		var err error
		resp, err = a.api.Register(ctx, a.cfg.EnrollToken, req)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) {
			return fmt.Errorf("the API refused to register node %q (%d %s): %s",
				a.cfg.Name, apiErr.Status, apiErr.Code, apiMessage(err))
		}
		return fmt.Errorf("registering node %q: %w", a.cfg.Name, err)
	}
	cred := Credential{NodeID: resp.NodeID, Name: resp.Name, Token: resp.Token, APIURL: a.cfg.APIURL}
	if cred.Name == "" {
		cred.Name = a.cfg.Name
	}
	if err := SaveCredential(a.credPath, cred); err != nil {
		return fmt.Errorf("node %q registered (id %d) but its credential could not be stored: %w", cred.Name, cred.NodeID, err)
	}
	if cred.Name != a.name {
		a.name = cred.Name
		a.log = a.cfg.Logger.With("node", a.name)
	}
	a.api.Token = cred.Token
	a.log.Info("node registered", "node_id", cred.NodeID, "credential", a.credPath)
	return nil
}

func (a *agent) heartbeatRequest() protocol.HeartbeatRequest {
	return protocol.HeartbeatRequest{BootID: a.currentBootID(), Address: a.cfg.Address}
}

// defaultHeartbeatEvery is the node heartbeat period until the API has
// said which it wants, or if it never does (an older API).
const defaultHeartbeatEvery = 10 * time.Second

// heartbeatPeriod is the node heartbeat period now.
func (a *agent) heartbeatPeriod() time.Duration {
	if a.cfg.HeartbeatEvery > 0 {
		return a.cfg.HeartbeatEvery
	}
	if p := a.heartbeatEvery.Load(); p > 0 {
		return time.Duration(p)
	}
	return defaultHeartbeatEvery
}

// learnHeartbeatPeriod keeps the period a heartbeat's answer asks for.
func (a *agent) learnHeartbeatPeriod(resp protocol.HeartbeatResponse) {
	if resp.EverySec > 0 {
		a.heartbeatEvery.Store(int64(min(time.Duration(resp.EverySec)*time.Second, time.Hour)))
	}
}

func (a *agent) heartbeatLoop(ctx context.Context) {
	everyPeriod(ctx, a.heartbeatPeriod, func() bool {
		resp, err := a.api.Heartbeat(ctx, a.heartbeatRequest())
		switch {
		case err == nil:
			a.learnHeartbeatPeriod(resp)
			a.log.Debug("node heartbeat sent")
		case ctx.Err() != nil:
			return false
		case statusOf(err) == http.StatusUnauthorized:
			a.fatal(a.credentialRejected(err))
			return false
		default:
			a.log.Warn("node heartbeat failed", "error", err)
		}
		return true
	})
}

// every calls f every period until ctx ends or f returns false.
func every(ctx context.Context, period time.Duration, f func() bool) {
	everyPeriod(ctx, func() time.Duration { return period }, f)
}

// everyPeriod is every with a period that may change: read again after
// each call of f.
func everyPeriod(ctx context.Context, period func() time.Duration, f func() bool) {
	cur := period()
	t := time.NewTicker(cur)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !f() {
			return
		}
		if p := period(); p != cur {
			cur = p
			t.Reset(p)
		}
	}
}

func (a *agent) workLoop(ctx context.Context) {
	// Runs handed back with the last report and not started are
	// abandoned as those of a poll are, and so are any that the reports
	// of abandoned runs hand back: each list of runs handed ahead ends
	// (its timer stopped) before Run returns.
	defer func() {
		for runs := a.takeHandedBack(); len(runs) > 0; runs = a.takeHandedBack() {
			a.abandon(ctx, runs)
		}
	}()
	b := a.backoff()
	for ctx.Err() == nil {
		// Runs handed back with a report go first; then the long poll.
		runs := a.takeHandedBack()
		var err error
		if len(runs) == 0 {
			runs, err = a.fetch(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if statusOf(err) == http.StatusUnauthorized {
				a.fatal(a.credentialRejected(err))
				return
			}
			d := b.next()
			a.log.Warn("fetching work failed", "error", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		b.reset()
		for i, q := range runs {
			if ctx.Err() != nil {
				a.abandon(ctx, runs[i:])
				return
			}
			a.runQueued(ctx, q)
		}
	}
}

// fetch long-polls for work. An agent that reports batches polls as one
// (AheadSource, when the source can): the first run may then head runs
// handed ahead, as a report's answer's does.
func (a *agent) fetch(ctx context.Context) ([]queued, error) {
	src, ok := a.src.(AheadSource)
	if !ok || a.batchReporter() == nil {
		items, err := a.src.Fetch(ctx)
		return queuedOf(items), err
	}
	resp, err := src.FetchAhead(ctx)
	if err != nil {
		return nil, err
	}
	received := time.Now()
	runs := queuedOf(resp.Runs)
	if len(runs) > 0 && len(resp.Ahead) > 0 && resp.AheadMs > 0 {
		runs[0].ahead = a.newAheadList(ctx, resp.Ahead, received.Add(time.Duration(resp.AheadMs)*time.Millisecond))
	}
	return runs, nil
}

// queuedOf queues runs handed out one by one.
func queuedOf(items []protocol.WorkItem) []queued {
	runs := make([]queued, len(items))
	for i, item := range items {
		runs[i] = queued{item: item}
	}
	return runs
}

// queued is a run for the work loop: from a poll, or handed back with a
// report's answer, where it may head a list of runs handed ahead.
type queued struct {
	item  protocol.WorkItem
	ahead *aheadList // the runs handed ahead after item, or nil
}

// aheadList is what is left of the runs handed ahead after the run that
// heads them: by a report's answer (protocol.RunResultResponse.AheadMs),
// the first of which is queued heading the others, by the answer to the
// head's ack (protocol.RunAckResponse), or by the poll that handed out
// the head (protocol.WorkResponse.Ahead).
type aheadList struct {
	until time.Time // none starts at or after it
	// goOn says that the last result was kept for the batch (submit):
	// the next of rest starts now. Work loop only, as is release.
	goOn bool
	// release, when the agent reports batches, releases rest at until
	// (releaseLate): the runs left must not show running in the API while
	// a long run goes on, since none of them starts any more. nil once
	// the list has ended (end).
	release *laterLoop
	// mu guards rest, which release takes on its own goroutine.
	mu   sync.Mutex
	rest []protocol.WorkItem // not started, in order
}

// newAheadList makes the list of runs handed ahead that start only before
// until, with the timer that releases them then (see aheadList.release);
// ctx is the agent's.
func (a *agent) newAheadList(ctx context.Context, rest []protocol.WorkItem, until time.Time) *aheadList {
	l := &aheadList{rest: rest, until: until}
	// The reporter is taken now: noBatches is the work loop's.
	if br := a.batchReporter(); br != nil && len(rest) > 0 {
		l.release = afterPeriod(time.Until(until), func() { a.releaseLate(ctx, br, l) })
	}
	return l
}

// left reports whether a run of the list may start now. The caller holds
// l.mu.
func (l *aheadList) left() bool {
	return len(l.rest) > 0 && time.Now().Before(l.until)
}

// hasNext reports whether the next run of the list may start now.
func (l *aheadList) hasNext() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.left()
}

// next takes the next run to start, if one may start now: the deadline
// may have passed, and releaseLate taken the rest, since hasNext said so.
func (l *aheadList) next() (protocol.WorkItem, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.left() {
		return protocol.WorkItem{}, false
	}
	item := l.rest[0]
	l.rest = l.rest[1:]
	return item, true
}

// end ends the list: its timer is stopped, or waited for if it fired
// (its release either took the rest or, failing, put it back), and the
// runs not started nor released yet are returned, to release.
func (l *aheadList) end() []protocol.WorkItem {
	if l.release != nil {
		l.release.wait()
		l.release = nil
	}
	l.goOn = false
	l.mu.Lock()
	defer l.mu.Unlock()
	rest := l.rest
	l.rest = nil
	return rest
}

// runQueued runs a queued run and, when it heads runs handed ahead, each
// next one for as long as submit keeps the results for one batch; then
// it sends what is kept, releasing the runs not started.
func (a *agent) runQueued(ctx context.Context, q queued) {
	a.ahead = q.ahead
	defer func() { a.ahead = nil }()
	item := q.item
	for {
		// The ack of item may make it head a list (ack sets a.ahead).
		a.runItem(ctx, item)
		l := a.ahead
		if l == nil || !l.goOn || ctx.Err() != nil {
			break
		}
		l.goOn = false
		var ok bool
		if item, ok = l.next(); !ok {
			break
		}
	}
	// Nothing to do after a result that was sent (submit flushed); kept
	// results are sent when the run after them left none (it was not
	// executed), or the agent is stopping.
	a.flushPending(ctx)
}

// runItem executes one work item exactly once on this node, with run
// heartbeats, then reports it. The durable record decides: a run and
// attempt already finished gets its stored result reported again; one a
// dead agent process had started is reported failed; a new one is
// acknowledged, recorded started, executed and its result stored before it
// is reported.
func (a *agent) runItem(ctx context.Context, item protocol.WorkItem) {
	log := a.log.With(runAttrs(item)...)
	key := keyOf(item)
	if !a.begin(key) {
		log.Info("run handed out again while it executes here; its result will be reported when it ends")
		return
	}
	defer a.end(key)

	rec, err := a.records.LoadRun(item.RunID, item.Attempt)
	switch {
	case err != nil:
		// Whether it ran is unknown: failing it is safer than running it
		// twice.
		log.Error("the run's record is unreadable; reporting it failed rather than risk running it twice", "error", err)
		// Recorded finished with that result, so that the attempt's
		// record is readable from now on: offered again, it gets the
		// same answer, and it is no longer listed unfinished.
		a.finish(ctx, log, &RunRecord{RunID: item.RunID, Attempt: item.Attempt, Task: item.Task, TransactionID: item.TransactionID,
			NodeRoleID: item.NodeRoleID, Type: item.Type},
			failedResult(item, fmt.Sprintf("not run: the agent's record of this run is unreadable (%v)", err)))
		return
	case rec != nil && rec.Phase == PhaseFinished && rec.Result != nil:
		log.Info("run already executed on this node; reporting its stored result again", "exit_code", rec.Result.ExitCode)
		a.logShipper(log, item).drain(ctx, a)
		a.submit(ctx, pendingReport{log: log, rec: rec, res: *rec.Result})
		return
	case rec != nil && rec.Phase == PhaseStarted:
		a.reportInterrupted(ctx, rec)
		return
	}
	// New, or received by a process that stopped before starting it. No
	// record is written before the acknowledgement: one that said
	// "received" would be treated exactly as no record at all (the command
	// has not started, so running it later is safe), and each record
	// written costs a sync. The first record is "started", written
	// before the command starts.
	rec = &RunRecord{RunID: item.RunID, Attempt: item.Attempt, Task: item.Task, TransactionID: item.TransactionID,
		NodeRoleID: item.NodeRoleID, Type: item.Type, Phase: PhaseStarted}
	if !item.Acknowledged && !a.ack(ctx, log, item) {
		return
	}
	if err := a.records.CreateRun(rec); err != nil {
		log.Error("cannot record the run's start durably; not starting it", "error", err)
		a.finish(ctx, log, rec, failedResult(item, fmt.Sprintf("not started: the agent cannot record the run durably (%v)", err)))
		return
	}

	if item.Type == protocol.TypeReboot {
		a.reboot(ctx, log, item, rec)
		return
	}
	log.Info("run started", "type", item.Type, "timeout_sec", item.TimeoutSec)
	runCtx, cancelRun := context.WithCancelCause(ctx)
	beat := a.runHeartbeat(runCtx, cancelRun, item.RunID, item.Attempt, log)
	heartbeats := afterPeriod(a.cfg.RunHeartbeatEvery, func() {
		if runCtx.Err() == nil && beat() {
			every(runCtx, a.cfg.RunHeartbeatEvery, beat)
		}
	})
	// The log goes to the API while the run goes on; the rest is sent
	// before the result, or with it (finishWithLog), so a reader following
	// it sees all of it.
	execDone := make(chan struct{})
	tail := a.logShipper(log, item)
	var shipping *laterLoop
	if tail != nil {
		shipping = afterPeriod(a.cfg.LogShipEvery, func() {
			tail.shipNew(ctx)
			tail.follow(ctx, a, a.cfg.LogShipEvery, execDone)
		})
	}
	res := a.exec.Execute(runCtx, item)
	cancelRun(errors.New("run finished"))
	close(execDone)
	heartbeats.wait()
	if shipping != nil && !shipping.wait() && !tail.withResult {
		tail.drain(ctx, a) // what follow does when the run ends
	}
	res.Attempt = item.Attempt

	attrs := []any{"exit_code", res.ExitCode, "duration", res.FinishedAt.Sub(res.StartedAt).Round(time.Millisecond)}
	if res.Error != "" {
		attrs = append(attrs, "error", res.Error)
	}
	if res.Succeeded() {
		log.Info("run succeeded", attrs...)
	} else {
		log.Warn("run failed", attrs...)
	}
	a.finishWithLog(ctx, log, rec, res, tail)
}

// begin marks a run as executing in this process; false if it already is.
func (a *agent) begin(key runKey) bool {
	a.activeMu.Lock()
	defer a.activeMu.Unlock()
	if _, ok := a.active[key]; ok {
		return false
	}
	a.active[key] = struct{}{}
	return true
}

func (a *agent) end(key runKey) {
	a.activeMu.Lock()
	defer a.activeMu.Unlock()
	delete(a.active, key)
}

// ack acknowledges a run before it starts, retrying network errors and
// 5xx. It reports whether to go on: not when the API no longer awaits the
// run (a final 4xx, or cancel) or the agent is stopping. An API without
// the ack route (404 without an error envelope) is an older one, for
// which the first run heartbeat is the acknowledgement.
//
// An agent that reports batches asks for runs ahead with the ack of a
// run that heads no list yet; the runs the answer hands ahead make the
// run head a list (a.ahead), released at the end if it does not execute.
// An API that refuses the ack asking (400: it predates the field) is
// sent it again without, and not asked again.
func (a *agent) ack(ctx context.Context, log *slog.Logger, item protocol.WorkItem) bool {
	acker, ok := a.rep.(Acker)
	if !ok {
		return true
	}
	ahead := a.ahead == nil && !a.noAckAhead && a.batchReporter() != nil
	var resp protocol.RunAckResponse
	var received time.Time
	send := func() error {
		return a.retry(ctx, "acknowledging the run", func(ctx context.Context) error {
			var err error
			resp, err = acker.Ack(ctx, item.RunID, item.Attempt, ahead)
			received = time.Now()
			return err
		})
	}
	err := send()
	if ahead && statusOf(err) == http.StatusBadRequest {
		log.Info("the API refused an ack asking for runs ahead (an older server); acknowledging without asking, and not asking again",
			"error", apiMessage(err))
		a.noAckAhead, ahead = true, false
		err = send()
	}
	if err == nil && ahead && len(resp.Runs) > 0 {
		log.Debug("runs handed ahead with the ack", "runs", len(resp.Runs), "ahead_ms", resp.AheadMs)
		a.ahead = a.newAheadList(ctx, resp.Runs, received.Add(time.Duration(resp.AheadMs)*time.Millisecond))
	}
	var apiErr *APIError
	switch {
	case err == nil && !resp.Cancel:
		return true
	case err == nil:
		log.Info("the API no longer awaits the run; not starting it")
	case ctx.Err() != nil:
		log.Warn("agent stopping; run acknowledged neither started (it will be offered again)")
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound && apiErr.Code == "":
		log.Debug("the API has no ack route; the first run heartbeat acknowledges the run")
		return true
	case statusOf(err) == http.StatusUnauthorized:
		a.fatal(a.credentialRejected(err))
	default:
		log.Warn("the API refused the run; not starting it", "status", statusOf(err), "error", apiMessage(err))
	}
	return false
}

// finish stores a run's result durably, then reports it (once only when
// the agent is stopping), or keeps it for a batch (submit).
func (a *agent) finish(ctx context.Context, log *slog.Logger, rec *RunRecord, res protocol.RunResult) {
	a.finishWithLog(ctx, log, rec, res, nil)
}

// finishWithLog is finish for a run whose log tail ships its log: the end
// of the log rides on the report when the API takes it there (see
// logTail.rest; reportOne says what happens when the API refuses it
// there). The stored record never keeps the log.
func (a *agent) finishWithLog(ctx context.Context, log *slog.Logger, rec *RunRecord, res protocol.RunResult, tail *logTail) {
	a.store(log, rec, res)
	r := pendingReport{log: log, rec: rec, res: res, tail: tail}
	r.res.Log = tail.rest(ctx, a)
	a.submit(ctx, r)
}

// store appends a run's result to the journal, marked to be reported.
// Synced only if the agent has to wait for the API first (retry) or
// stops: in a chain, the next run's started record syncs it.
func (a *agent) store(log *slog.Logger, rec *RunRecord, res protocol.RunResult) {
	rec.Phase, rec.Result, rec.ReportPending = PhaseFinished, &res, true
	if err := a.records.SaveRunUnsynced(rec); err != nil {
		// The result still goes out; only a repeated offer would miss it.
		log.Error("cannot store the run's result durably", "error", err)
	}
}

// pendingReport is a run's result on its way to the API.
type pendingReport struct {
	log *slog.Logger
	// rec is the run's record, marked reported (MarkReported) once the
	// API has the result if it is ReportPending.
	rec *RunRecord
	// res is the result, with the end of the log on it (Log) if it rides
	// there, shipped by tail when the API refuses it on the report.
	res  protocol.RunResult
	tail *logTail
}

// submit reports a result, or keeps it for one batch with the results
// after it when the run going on belongs to runs handed ahead and the
// next of them may start (goesOn). Results kept go first, in the order
// they ran, with whichever report follows.
func (a *agent) submit(ctx context.Context, r pendingReport) {
	a.pending = append(a.pending, r)
	if a.goesOn(r) {
		a.ahead.goOn = true
		return
	}
	a.flushPending(ctx)
}

// goesOn reports whether the next run handed ahead may start after the
// run whose result r is (protocol.RunResultResponse.AheadMs): one is left,
// this one succeeded with no outputs and no attributes handed back (which
// the API would have to see first), it is not a reboot (reported before
// the node goes down), the batch has room, and the deadline has not
// passed.
func (a *agent) goesOn(r pendingReport) bool {
	l := a.ahead
	return l != nil && len(a.pending) < protocol.MaxRunResults &&
		r.res.Succeeded() && len(r.res.Outputs) == 0 && r.res.Attrs == nil && r.rec.Type != protocol.TypeReboot &&
		l.hasNext()
}

// flushPending sends the results kept for a batch, releasing the runs
// handed ahead not started (and not released at the deadline already),
// which are then never started here: the list ends.
func (a *agent) flushPending(ctx context.Context) {
	var released []protocol.WorkItem
	if l := a.ahead; l != nil {
		released = l.end()
	}
	batch := a.pending
	if len(batch) == 0 {
		// No result to carry them (the run heading them was not
		// executed): a batch of its own releases them.
		if br := a.batchReporter(); len(released) > 0 && (br == nil || !a.releaseAhead(ctx, br, released)) {
			a.log.Info("runs handed ahead not started and not released; the API hands them out again once its lease ends",
				"runs", len(released))
		}
		return
	}
	a.flush(ctx, batch, released)
	clear(batch)
	a.pending = batch[:0]
}

// recover runs at start: runs a previous agent process started and never
// finished are reported failed (their commands may have done part of their
// work; running them again silently could do it twice), and old records,
// scratch files and log files are pruned.
func (a *agent) recover(ctx context.Context) {
	if err := a.records.Prune(time.Now().Add(-RecordRetention)); err != nil {
		a.log.Warn("cannot prune old run records", "error", err)
	}
	// The shell's scratch files: shared attributes files (one that is
	// still in use is written again when next needed) and an earlier
	// agent process's slots.
	if err := pruneFiles(scratchDir(a.workDir), time.Now().Add(-RecordRetention), nil); err != nil {
		a.log.Warn("cannot prune old scratch files", "error", err)
	}
	recs, err := a.records.Unreported()
	if err != nil {
		// Logs are not pruned either: an interrupted run's may be old.
		a.log.Warn("cannot read the run records", "error", err)
		return
	}
	// In the journal's order, the order they ran in, one result per
	// request: they may be runs of different activities (a batch that
	// failed to go out, then a run of the next poll), and the API
	// continues a chain and completes an activity after a batch's last
	// result only.
	batch := make([]pendingReport, 0, len(recs))
	for _, rec := range recs {
		if ctx.Err() != nil {
			return
		}
		if rec.Phase == PhaseStarted {
			batch = append(batch, a.interrupted(ctx, rec))
			continue
		}
		if rec.Result == nil {
			continue
		}
		log := a.recordLog(rec)
		log.Info("reporting the result of a run the previous agent process finished and did not report")
		// The end of its log was to ride on the report.
		a.logShipper(log, recordItem(rec)).drain(ctx, a)
		batch = append(batch, pendingReport{log: log, rec: rec, res: *rec.Result})
	}
	for i := 0; i < len(batch) && ctx.Err() == nil; i++ {
		a.flush(ctx, batch[i:i+1], nil)
	}
	// Logs last: an interrupted run's log is shipped from its file above.
	a.pruneLogs()
}

// recordLog is the agent's logger with a run record's attributes.
func (a *agent) recordLog(rec *RunRecord) *slog.Logger {
	return a.log.With("run", rec.RunID, "attempt", rec.Attempt, "task", rec.Task, "transaction", rec.TransactionID)
}

// recordItem is the work item a record was written for, as far as its log
// file goes (see LogPather).
func recordItem(rec *RunRecord) protocol.WorkItem {
	return protocol.WorkItem{RunID: rec.RunID, Attempt: rec.Attempt, Task: rec.Task,
		TransactionID: rec.TransactionID, NodeRoleID: rec.NodeRoleID, Type: rec.Type}
}

// pruneLogs removes the runs' log files older than LogRetention: at the
// agent's start, once the interrupted runs' logs are shipped, then daily
// (pruneLoop), as an agent may run for months.
func (a *agent) pruneLogs() {
	if err := pruneLogs(a.workDir, time.Now().Add(-LogRetention)); err != nil {
		a.log.Warn("cannot prune old log files", "error", err)
	}
}

// pruneLoop prunes old log files every day until ctx ends. The log of a
// run going on now was written to when it started, and a run's timeout
// is far shorter than LogRetention.
func (a *agent) pruneLoop(ctx context.Context) {
	every(ctx, 24*time.Hour, func() bool { a.pruneLogs(); return true })
}

// reportInterrupted stores and reports as failed a run that a previous
// agent process started and never finished.
func (a *agent) reportInterrupted(ctx context.Context, rec *RunRecord) {
	a.submit(ctx, a.interrupted(ctx, rec))
}

// interrupted stores as failed a run that a previous agent process started
// and never finished, and returns its report.
func (a *agent) interrupted(ctx context.Context, rec *RunRecord) pendingReport {
	log := a.recordLog(rec)
	log.Warn("the agent stopped while this run was executing; reporting it failed instead of running it again",
		"started", rec.UpdatedAt, "pid", rec.PID)
	// What the interrupted run wrote is shipped first, from where the
	// server's copy ends.
	a.logShipper(log, recordItem(rec)).drain(ctx, a)
	now := time.Now().UTC()
	res := protocol.RunResult{Attempt: rec.Attempt, ExitCode: -1, StartedAt: rec.UpdatedAt, FinishedAt: now,
		Error: fmt.Sprintf("interrupted: the agent (pid %d) stopped while the run was executing (started %s); "+
			"it is not run again by the agent, only a new attempt would run it", rec.PID, rec.UpdatedAt.Format(time.RFC3339))}
	a.store(log, rec, res)
	return pendingReport{log: log, rec: rec, res: res}
}

func failedResult(item protocol.WorkItem, reason string) protocol.RunResult {
	now := time.Now().UTC()
	return protocol.RunResult{Attempt: item.Attempt, ExitCode: -1, Error: reason, StartedAt: now, FinishedAt: now}
}

// runHeartbeat returns what sends one heartbeat of a run: false when no
// other is to follow (the API cancelled the run or no longer awaits it,
// or the agent stops), and then the run is cancelled.
func (a *agent) runHeartbeat(ctx context.Context, cancelRun context.CancelCauseFunc, runID int64, attempt int, log *slog.Logger) func() bool {
	return func() bool {
		cancel, err := a.rep.RunHeartbeat(ctx, runID, attempt)
		switch st := statusOf(err); {
		case err == nil && cancel:
			log.Info("the API asked to cancel the run")
			cancelRun(errors.New("the API asked to cancel the run"))
			return false
		case err == nil:
			log.Debug("run heartbeat sent")
		case ctx.Err() != nil:
			return false
		case st == http.StatusNotFound || st == http.StatusConflict:
			msg := apiMessage(err)
			log.Warn("the API no longer awaits the run; abandoning it", "status", st, "error", msg)
			cancelRun(fmt.Errorf("the API no longer awaits the run: %s", msg))
			return false
		case st == http.StatusUnauthorized:
			a.fatal(a.credentialRejected(err))
			return false
		default:
			log.Warn("run heartbeat failed", "error", err)
		}
		return true
	}
}

// laterLoop is a loop of a run's (its heartbeats, its log shipping) that
// starts once its first period has passed: most runs end sooner, and
// need neither a goroutine nor a ticker for it. A list of runs handed
// ahead has one too: its release at its deadline (aheadList.release).
type laterLoop struct {
	timer *time.Timer
	done  chan struct{}
}

// afterPeriod runs loop in a goroutine of its own once period has passed.
func afterPeriod(period time.Duration, loop func()) *laterLoop {
	l := &laterLoop{done: make(chan struct{})}
	l.timer = time.AfterFunc(period, func() {
		defer close(l.done)
		loop()
	})
	return l
}

// wait returns at once when the loop has not started (it never will),
// else once it has returned: its caller makes it return first (ends its
// context, or closes what it waits for). It says whether the loop ran.
func (l *laterLoop) wait() bool {
	if l.timer.Stop() {
		return false
	}
	<-l.done
	return true
}

// flush reports results in the order they ran: in one batch (RunResults,
// with the runs handed ahead that were not started released) when the
// reporter takes batches, else one by one. An API without the batch route
// (404 without an error envelope) gets results one by one from then on;
// a batch refused otherwise for good (a 4xx) goes again one by one, so
// that one result the API refuses does not cost the others, and a result
// refused with the end of its log on it goes again without (reportOne).
// The runs released then stay with the API until its lease ends, never
// started here. Network errors and 5xx are retried with backoff; when the
// agent is stopping, each request is made once.
func (a *agent) flush(ctx context.Context, batch []pendingReport, released []protocol.WorkItem) {
	if br := a.batchReporter(); br != nil {
		err := a.sendBatch(ctx, br, batch, released)
		var apiErr *APIError
		switch st := statusOf(err); {
		case err == nil, st == http.StatusUnauthorized, !errors.As(err, &apiErr) || apiErr.Retryable():
			for _, r := range batch {
				a.logReport(ctx, r.log, err)
			}
			a.markReported(err, batch...)
			return
		case st == http.StatusNotFound && apiErr.Code == "":
			a.noBatches = true
			a.log.Info("the API takes no batches of results (an older server); reporting each on its own")
		default:
			a.log.Warn("the API refused a batch of results; reporting them one by one",
				"status", st, "error", apiMessage(err), "results", len(batch))
		}
	}
	for _, r := range batch {
		a.reportOne(ctx, r)
	}
}

// sendBatch sends results in one RunResults (see flush); the runs its
// answer hands back are kept for the work loop.
func (a *agent) sendBatch(ctx context.Context, br BatchReporter, batch []pendingReport, released []protocol.WorkItem) error {
	body := batchBody(released)
	for _, r := range batch {
		body.Results = append(body.Results, protocol.RunReport{RunID: r.rec.RunID, RunResult: r.res})
	}
	return a.send(ctx, "reporting the results", func(sctx context.Context) error {
		resp, err := br.ReportBatch(sctx, body)
		if err == nil {
			// The agent's ctx: a list's timer outlives this request.
			a.handBackAnswer(ctx, resp, time.Now())
		}
		return err
	})
}

// batchBody is a RunResults releasing runs, with no result yet.
func batchBody(released []protocol.WorkItem) protocol.RunResults {
	body := protocol.RunResults{Results: []protocol.RunReport{}}
	for _, item := range released {
		body.Released = append(body.Released, protocol.RunAttempt{RunID: item.RunID, Attempt: item.Attempt})
	}
	return body
}

// batchReporter returns the reporter as a BatchReporter, or nil when it
// is none or the API takes no batches.
func (a *agent) batchReporter() BatchReporter {
	if br, ok := a.rep.(BatchReporter); ok && !a.noBatches {
		return br
	}
	return nil
}

// Bounds of releaseAhead, which a list's end may wait for (aheadList.end).
const (
	releaseTries   = 3
	releaseTimeout = 2 * time.Second
)

// releaseAhead sends a batch that only releases runs handed ahead (no
// result; its answer is empty), best effort: a few tries of a short
// timeout each for network errors and 5xx, one when the agent is
// stopping. It reports whether the API took it. It runs on the work loop
// or on a list's timer, so it reads nothing of the work loop's.
func (a *agent) releaseAhead(ctx context.Context, br BatchReporter, items []protocol.WorkItem) bool {
	body := batchBody(items)
	b := a.backoff()
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_, err := br.ReportBatch(rctx, body)
		cancel()
		switch {
		case err == nil:
			a.log.Info("released the runs handed ahead not started", "runs", len(items))
			return true
		case try == releaseTries || !retryable(ctx, err):
			a.log.Warn("cannot release the runs handed ahead not started", "runs", len(items), "error", err)
			return false
		}
		if !sleep(ctx, b.next()) {
			return false
		}
	}
}

// releaseLate releases a list's runs at its deadline (aheadList.release),
// while the run before them goes on: none of them starts any more. On
// failure it puts them back, for the list's end to release with the
// batch.
func (a *agent) releaseLate(ctx context.Context, br BatchReporter, l *aheadList) {
	l.mu.Lock()
	rest := l.rest
	l.rest = nil
	l.mu.Unlock()
	if len(rest) == 0 || a.releaseAhead(ctx, br, rest) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Past the deadline nothing takes from the list: rest is still empty.
	l.rest = rest
}

// reportOne reports one result on its own. A report refused with the log
// on it (an API that cannot take it after all, a body past its limit, a
// gap in the server's copy of the log) is not the end of the result: the
// log goes in log requests, then the result is reported again without it.
func (a *agent) reportOne(ctx context.Context, r pendingReport) {
	report := func(res protocol.RunResult) error {
		return a.send(ctx, "reporting the result", func(ctx context.Context) error {
			next, err := a.rep.Report(ctx, r.rec.RunID, res)
			a.handBack(next)
			return err
		})
	}
	err := report(r.res)
	if st := statusOf(err); r.res.Log != nil && st >= 400 && st < 500 && st != http.StatusUnauthorized {
		r.log.Info("the API refused the result with the end of the log on it; shipping the log on its own, then the result again",
			"status", st, "error", apiMessage(err))
		r.tail.drain(ctx, a)
		res := r.res
		res.Log = nil
		err = report(res)
	}
	a.logReport(ctx, r.log, err)
	a.markReported(err, r)
}

// send calls f until the API has answered for good, retrying network
// errors and 5xx with backoff (retry, which makes the journal durable
// before any wait: until the API has a result, the journal is its only
// copy). When the agent is stopping, f is called once, with a few seconds
// of its own.
func (a *agent) send(ctx context.Context, what string, f func(context.Context) error) error {
	if ctx.Err() != nil {
		// The journal is synced when it is closed, as the agent stops.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return f(rctx)
	}
	return a.retry(ctx, what, f)
}

// markReported marks in the journal the records of results the API has
// answered for good: taken (err nil), or refused with a final 4xx, which
// sending them again at the next start would only repeat. A credential
// refused (401), a network error or a stop leaves them to be reported by
// the next process.
func (a *agent) markReported(err error, reports ...pendingReport) {
	var apiErr *APIError
	if err != nil && (!errors.As(err, &apiErr) || apiErr.Retryable() || apiErr.Status == http.StatusUnauthorized) {
		return
	}
	var recs []*RunRecord
	for _, r := range reports {
		if r.rec.ReportPending {
			recs = append(recs, r.rec)
		}
	}
	if err := a.records.MarkReported(recs...); err != nil {
		a.log.Warn("cannot mark results reported in the run journal; the next agent process reports them again", "error", err)
	}
}

// syncRecords makes the run journal's unsynced results durable.
func (a *agent) syncRecords() {
	if err := a.records.Sync(); err != nil {
		a.log.Error("cannot store the run results durably", "error", err)
	}
}

// handBack keeps runs the API handed back with a report for the work loop.
func (a *agent) handBack(items []protocol.WorkItem) {
	if len(items) == 0 {
		return
	}
	a.handedMu.Lock()
	defer a.handedMu.Unlock()
	for _, item := range items {
		a.handed = append(a.handed, queued{item: item})
	}
}

// handBackAnswer keeps the runs a batch's answer (received at received)
// hands back for the work loop: when it hands them ahead, the first is
// queued heading the others, which start only as goesOn allows.
func (a *agent) handBackAnswer(ctx context.Context, resp protocol.RunResultResponse, received time.Time) {
	if resp.AheadMs <= 0 || len(resp.Runs) == 0 {
		a.handBack(resp.Runs)
		return
	}
	l := a.newAheadList(ctx, resp.Runs[1:], received.Add(time.Duration(resp.AheadMs)*time.Millisecond))
	a.handedMu.Lock()
	defer a.handedMu.Unlock()
	a.handed = append(a.handed, queued{item: resp.Runs[0], ahead: l})
}

// takeHandedBack returns the runs handed back since the last call.
func (a *agent) takeHandedBack() []queued {
	a.handedMu.Lock()
	defer a.handedMu.Unlock()
	runs := a.handed
	a.handed = nil
	return runs
}

func (a *agent) logReport(ctx context.Context, log *slog.Logger, err error) {
	switch st := statusOf(err); {
	case err == nil:
		log.Info("result reported")
	case st == http.StatusUnauthorized:
		a.fatal(a.credentialRejected(err))
	case st >= 400 && st < 500 && !isRetryableStatus(err):
		log.Warn("the API refused the result", "status", st, "error", apiMessage(err))
	case ctx.Err() != nil:
		log.Warn("agent stopping; result not reported", "error", err)
	default:
		log.Warn("result not reported", "error", err)
	}
}

// isRetryableStatus reports whether err is an API answer worth trying
// again later (APIError.Retryable).
func isRetryableStatus(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Retryable()
}

// abandon reports runs that were handed out but not started because the
// agent is stopping, best effort, and records them so that a later offer
// of the same attempt reports the same. Runs handed ahead behind one of
// them are released with its report.
func (a *agent) abandon(ctx context.Context, runs []queued) {
	defer func() { a.ahead = nil }()
	for _, q := range runs {
		a.ahead = q.ahead
		a.abandonOne(ctx, q.item)
		// Ends q's list (finish did, if it reported): its timer is
		// stopped and its runs released.
		a.flushPending(ctx)
	}
}

// abandonOne reports one run of abandon's.
func (a *agent) abandonOne(ctx context.Context, item protocol.WorkItem) {
	rec, err := a.records.LoadRun(item.RunID, item.Attempt)
	if err != nil || (rec != nil && rec.Phase != PhaseReceived) {
		return // known already: handled when offered again
	}
	log := a.log.With(runAttrs(item)...)
	log.Warn("agent stopping; run not started")
	rec = &RunRecord{RunID: item.RunID, Attempt: item.Attempt, Task: item.Task, TransactionID: item.TransactionID,
		NodeRoleID: item.NodeRoleID, Type: item.Type}
	a.finish(ctx, log, rec, failedResult(item, "cancelled: the agent stopped before starting the run"))
}

// retry calls f until it succeeds, fails for good (see retryable) or ctx
// ends, sleeping with exponential backoff in between.
func (a *agent) retry(ctx context.Context, what string, f func(context.Context) error) error {
	b := a.backoff()
	for {
		err := f(ctx)
		if err == nil || !retryable(ctx, err) {
			return err
		}
		d := b.next()
		a.log.Warn(what+" failed; retrying", "error", err, "retry_in", d)
		// Results the API has not taken yet (a report, or the log
		// shipped before it) are made durable before any wait.
		a.syncRecords()
		if !sleep(ctx, d) {
			return err
		}
	}
}

func runAttrs(item protocol.WorkItem) []any {
	return []any{"run", item.RunID, "attempt", item.Attempt, "task", item.Task,
		"transaction", item.TransactionID, "graph", item.Graph}
}

// sleep waits d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type backoff struct{ min, max, cur time.Duration }

func (a *agent) backoff() *backoff { return &backoff{min: a.cfg.RetryMin, max: a.cfg.RetryMax} }

// next returns the next delay, with ±20% jitter so that many agents do not
// retry in step.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	if j := int64(d) / 5; j > 0 {
		d += time.Duration(rand.Int64N(2*j+1) - j)
	}
	return d
}

func (b *backoff) reset() { b.cur = 0 }
