package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
)

// The live event stream's tuning.
const (
	// eventHeartbeat is how often an idle stream gets a comment line, so
	// that proxies and clients see the connection is alive.
	eventHeartbeat = 15 * time.Second
	// eventRetryMS is the reconnection delay the stream asks of clients.
	eventRetryMS = 2000
	// eventBacklog is how many recent events the hub keeps for clients
	// reconnecting with Last-Event-ID.
	eventBacklog = 4096
	// eventQueue is how many events a subscriber may have waiting: a client
	// that reads slower than that is dropped (it reconnects and resumes
	// from the backlog), never blocking the others.
	eventQueue = 512
	// eventLeaseTTL is how long the server's lease on the database's change
	// announcements lasts (migration 0028); it is renewed every third of
	// that while the server has clients, and lapses when it has had none
	// for that long, so that a client reconnecting at once misses nothing.
	eventLeaseTTL = time.Minute
	// eventLeaseSettle is how long a subscription waits, after a lease
	// taken when none was live, for the transactions that may have written
	// unannounced; eventLeaseWait bounds the wait after that, when its
	// subscribers are told to read the state again.
	eventLeaseSettle = 2 * time.Second
	eventLeaseWait   = time.Minute
)

// event is one change announced by the database (the triggers of
// migrations 0016 and 0028) as the hub keeps it.
type event struct {
	// epoch and seq make its id (eventHub.id).
	epoch string
	seq   uint64
	kind  string
	// deployments are the deployments the event concerns (a node moved
	// concerns two).
	deployments [2]int64
	data        []byte
}

// eventHeader is what the hub reads of a notification's JSON payload.
type eventHeader struct {
	Kind             string `json:"kind"`
	DeploymentID     int64  `json:"deployment_id"`
	FromDeploymentID int64  `json:"from_deployment_id"`
}

// subscriber is one client of the stream.
type subscriber struct {
	deployment int64 // 0: every deployment
	ch         chan event
	// gone is closed when the hub drops the subscriber (it fell behind, or
	// the server is stopping).
	gone   chan struct{}
	reason string
}

func (sub *subscriber) wants(e event) bool {
	return sub.deployment == 0 || e.kind == eventResync || e.deployments[0] == sub.deployment || e.deployments[1] == sub.deployment
}

// eventResync is the event that tells clients to read the state again: the
// server may have missed notifications (its LISTEN connection was lost) or
// cannot replay what the client missed.
const eventResync = "resync"

// eventHub fans the database's notifications out to the stream's
// subscribers. Event ids are "<epoch>-<seq>": the epoch is random per
// process, and drawn again when the hub learns that changes went
// unannounced (restart), so an id from another server, before a restart or
// before such a gap is known not to be resumable here.
type eventHub struct {
	log    *slog.Logger
	epoch  string
	mu     sync.Mutex
	seq    uint64
	recent []event // the last eventBacklog (to twice that) events, oldest first
	subs   map[*subscriber]struct{}
	closed bool
}

func newEventHub(log *slog.Logger) *eventHub {
	return &eventHub{log: log, epoch: randomHex(4), subs: map[*subscriber]struct{}{}}
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

// restart begins a new epoch, as the changes before it were not all
// announced (no server held a lease): no event id from before can be
// resumed, and the subscribers are told to read the state again.
func (h *eventHub) restart(reason string) {
	h.mu.Lock()
	h.epoch, h.recent = randomHex(4), nil
	h.mu.Unlock()
	h.resync(reason)
}

// subscribed says whether the hub has subscribers.
func (h *eventHub) subscribed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) > 0
}

// publish hands a notification's payload to every subscriber it concerns.
func (h *eventHub) publish(payload string) {
	var hdr eventHeader
	if err := json.Unmarshal([]byte(payload), &hdr); err != nil || hdr.Kind == "" {
		h.log.Warn("ignoring malformed event notification", "payload", models.Clip(payload))
		return
	}
	// Compact: Postgres's json type spaces its output.
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(payload)); err != nil {
		return
	}
	h.send(event{kind: hdr.Kind, deployments: [2]int64{hdr.DeploymentID, hdr.FromDeploymentID}, data: buf.Bytes()})
}

// resync tells every subscriber to read the state again.
func (h *eventHub) resync(reason string) {
	data, _ := json.Marshal(map[string]string{"kind": eventResync, "reason": reason})
	h.send(event{kind: eventResync, data: data})
}

func (h *eventHub) send(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.seq++
	e.epoch, e.seq = h.epoch, h.seq
	if len(h.recent) == 2*eventBacklog {
		// Forget the older half at once: amortised O(1) per event.
		h.recent = append(make([]event, 0, 2*eventBacklog), h.recent[eventBacklog:]...)
	}
	h.recent = append(h.recent, e)
	for sub := range h.subs {
		if !sub.wants(e) {
			continue
		}
		select {
		case sub.ch <- e:
		default:
			h.drop(sub, "the client fell behind")
		}
	}
}

// drop removes a subscriber; the caller holds h.mu.
func (h *eventHub) drop(sub *subscriber, reason string) {
	if _, ok := h.subs[sub]; !ok {
		return
	}
	delete(h.subs, sub)
	sub.reason = reason
	close(sub.gone)
}

// subscribe registers a subscriber of one deployment (0: all) that last
// saw the event lastID (""). It returns the events it missed that the hub
// still holds, and whether it must resync because the hub cannot replay
// them all.
func (h *eventHub) subscribe(deployment int64, lastID string) (*subscriber, []event, bool) {
	sub := &subscriber{deployment: deployment, ch: make(chan event, eventQueue), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		sub.reason = "the server is stopping"
		close(sub.gone)
		return sub, nil, false
	}
	h.subs[sub] = struct{}{}
	if lastID == "" {
		return sub, nil, false
	}
	epoch, raw, _ := strings.Cut(lastID, "-")
	last, err := strconv.ParseUint(raw, 10, 64)
	if epoch != h.epoch || err != nil || last > h.seq {
		return sub, nil, true
	}
	if len(h.recent) > 0 && last+1 < h.recent[0].seq {
		return sub, nil, true // some were already forgotten
	}
	var missed []event
	for _, e := range h.recent {
		if e.seq > last && sub.wants(e) {
			missed = append(missed, e)
		}
	}
	return sub, missed, false
}

// unsubscribe removes a subscriber that is done.
func (h *eventHub) unsubscribe(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, sub)
}

// close ends every stream (the server is stopping) and refuses new ones.
func (h *eventHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for sub := range h.subs {
		h.drop(sub, "the server is stopping")
	}
}

func (h *eventHub) id(e event) string { return e.epoch + "-" + strconv.FormatUint(e.seq, 10) }

// streamEvents is GET /events: server-sent events of transaction, run, node
// and noderole changes, of one deployment with ?deployment=<name or id>.
// Each event is "id: <epoch>-<seq>", "event: <kind>" and one JSON "data:"
// line (kind, id, deployment_id, state and a few names); a client
// reconnecting with Last-Event-ID gets what it missed if the server still
// holds it, else a "resync" event (read the state again). ?wait= ends the
// stream after that long (default: never), for scripts.
func (s *Server) streamEvents(c echo.Context) error {
	ctx := c.Request().Context()
	var depID int64
	if ref := c.QueryParam("deployment"); ref != "" {
		dep, err := s.cfg.Store.Deployment(ctx, ref)
		if err != nil {
			return err
		}
		depID = dep.ID
	}
	var limit <-chan time.Time
	if w := c.QueryParam("wait"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d < 0 {
			return &models.InputError{Status: http.StatusBadRequest, Field: "wait", Reason: fmt.Sprintf("%q is not a duration like 30s", w)}
		}
		t := time.NewTimer(d)
		defer t.Stop()
		limit = t.C
	}
	lastID := c.Request().Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = c.QueryParam("last_event_id") // for clients that cannot set headers
	}
	if len(lastID) > 64 {
		return models.Invalid("Last-Event-ID", "is not an event id of this stream")
	}

	if err := s.holdEventLease(ctx, false); err != nil {
		return err
	}
	sub, missed, resync := s.events.subscribe(depID, lastID)
	defer s.events.unsubscribe(sub)

	res := c.Response()
	h := res.Header()
	h.Set(echo.HeaderContentType, "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	res.WriteHeader(http.StatusOK)
	write := func(text string) error {
		if _, err := res.Write([]byte(text)); err != nil {
			return err
		}
		res.Flush()
		return nil
	}
	send := func(e event) error {
		return write("id: " + s.events.id(e) + "\nevent: " + e.kind + "\ndata: " + string(e.data) + "\n\n")
	}
	if err := write(fmt.Sprintf("retry: %d\n: anneal events\n\n", eventRetryMS)); err != nil {
		return nil
	}
	if resync {
		data, _ := json.Marshal(map[string]string{"kind": eventResync, "reason": "the events after Last-Event-ID are no longer held; read the state again"})
		if err := write("event: " + eventResync + "\ndata: " + string(data) + "\n\n"); err != nil {
			return nil
		}
	}
	for _, e := range missed {
		if err := send(e); err != nil {
			return nil
		}
	}
	beat := time.NewTicker(eventHeartbeat)
	defer beat.Stop()
	for {
		select {
		case e := <-sub.ch:
			if err := send(e); err != nil {
				return nil
			}
		case <-beat.C:
			if err := write(": heartbeat\n\n"); err != nil {
				return nil
			}
		case <-sub.gone:
			s.log.Info("event stream ended by the server", "reason", sub.reason, "who", principal(c).Name)
			return nil
		case <-limit:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// startEvents runs the event stream's background work until ctx (the
// listener's) ends: it renews the server's event lease while the stream
// has clients, and ends every stream when the server stops.
func (s *Server) startEvents(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.events.close()
	}()
	go func() {
		tick := time.NewTicker(eventLeaseTTL / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !s.events.subscribed() {
				continue // the lease lapses: nobody listens
			}
			if err := s.holdEventLease(ctx, true); err != nil && ctx.Err() == nil {
				s.log.Warn("renewing the event listener lease failed; the event stream's clients will be told to read the state again once it is renewed", "error", err)
			}
		}
	}()
}

// eventLease is the server's lease on the database's change
// announcements: the event triggers fire only while some server holds one
// (migration 0028), so that nothing is announced while nobody listens.
type eventLease struct {
	// id names the server's lease row: its host, process and a random part.
	id string
	mu sync.Mutex // one renewal at a time
	// until is when the lease lapses at the earliest, by this clock.
	until time.Time
}

func newEventLease() *eventLease {
	host, _ := os.Hostname()
	return &eventLease{id: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), randomHex(4))}
}

// holdEventLease makes sure the database announces changes to this server
// before a client subscribes (renew false: only when less than half of the
// lease is left) or at each renewal (renew true). When no lease was live,
// changes went unannounced: the hub restarts its epoch, and once the
// transactions that may have written unannounced have ended, its
// subscribers are told to read the state again.
func (s *Server) holdEventLease(ctx context.Context, renew bool) error {
	l := s.eventLease
	l.mu.Lock()
	defer l.mu.Unlock()
	if !renew && time.Until(l.until) > eventLeaseTTL/2 {
		return nil
	}
	asked := time.Now()
	lease, err := s.cfg.Store.HoldEventListener(ctx, l.id, eventLeaseTTL)
	if err != nil {
		return err
	}
	l.until = asked.Add(eventLeaseTTL)
	if lease.WasLive {
		return nil
	}
	s.events.restart("the server began announcing changes again after a time nobody listened; read the state again")
	if len(lease.Writers) == 0 {
		return nil
	}
	// Wait a little for the transactions that may have written
	// unannounced, so that the client reads their changes; past that, the
	// clients are told to read the state again once they have ended.
	wctx, cancel := context.WithTimeout(ctx, eventLeaseSettle)
	defer cancel()
	if s.cfg.Store.AwaitTransactions(wctx, lease.Writers, 10*time.Millisecond) == nil {
		return nil
	}
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), eventLeaseWait)
		defer cancel()
		if err := s.cfg.Store.AwaitTransactions(wctx, lease.Writers, 100*time.Millisecond); err != nil {
			s.log.Warn("transactions that may have written unannounced did not end in time; telling the clients to read the state again anyway", "error", err)
		}
		s.events.resync("changes made as the server began announcing them may not have been announced; read the state again")
	}()
	return nil
}
