package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// FetchSoftware long-polls for the node's software deployments awaiting the
// agent: GET PathSoftwareDeployments?version=<v>&wait=<PollWait>s. It
// reports notModified when the API answered 304 (nothing changed).
func (t *HTTPTransport) FetchSoftware(ctx context.Context, version string) (resp protocol.SoftwareDeploymentsResponse, notModified bool, err error) {
	q := url.Values{"version": {version}, "wait": {strconv.Itoa(t.waitSeconds()) + "s"}}
	timeout := time.Duration(t.waitSeconds())*time.Second + t.timeout()
	err = t.do(ctx, http.MethodGet, protocol.PathSoftwareDeployments, q, t.Token, timeout, nil, &resp)
	if statusOf(err) == http.StatusNotModified {
		return resp, true, nil
	}
	return resp, false, err
}

// SignalSoftware sends a deployment round's signal.
func (t *HTTPTransport) SignalSoftware(ctx context.Context, id int64, sig protocol.SoftwareSignal) error {
	return t.do(ctx, http.MethodPost, fmt.Sprintf(protocol.PathSoftwareSignal, id), nil, t.Token, t.timeout(), sig, nil)
}

// softwareLoop is the agent's software deployment poller: one long poll
// held at a time, each deployment round run once by its hook (its record
// keeps the signal, so a restarted agent re-sends it instead of running
// the hook again), and its signal sent with retries.
func (a *agent) softwareLoop(ctx context.Context) {
	hooks := &Hooks{WorkDir: a.workDir, HooksDir: a.cfg.HooksDir, NodeName: a.name, Logger: a.log}
	version := ""
	b := a.backoff()
	for ctx.Err() == nil {
		resp, notModified, err := a.api.FetchSoftware(ctx, version)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			switch statusOf(err) {
			case http.StatusUnauthorized:
				a.fatal(a.credentialRejected(err))
				return
			case http.StatusNotFound:
				// An API without software deployments: look again later.
				sleep(ctx, a.cfg.RetryMax)
				continue
			}
			d := b.next()
			a.log.Warn("fetching software deployments failed", "error", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		b.reset()
		if notModified {
			continue
		}
		version = resp.Version
		for _, d := range resp.Deployments {
			if ctx.Err() != nil {
				return
			}
			a.deploySoftware(ctx, hooks, d)
		}
	}
}

// deploySoftware runs a deployment round's hook once on this node and
// signals it. The durable record (see Records) decides: a round already
// run gets its stored signal sent again (the API lists a round until it is
// signalled, so it comes again after a lost signal or a restart), one a
// dead agent process had started is signalled failed rather than applied
// twice, and a new one is marked started before its hook runs.
func (a *agent) deploySoftware(ctx context.Context, hooks *Hooks, d protocol.SoftwareDeployment) {
	log := a.log.With("software_deployment", d.ID, "round", d.Round, "action", d.Action, "group", d.Group, "config", d.Name)
	sig, ok := a.softwareSignal(ctx, log, hooks, d)
	if !ok {
		return
	}
	err := a.retry(ctx, "signalling a software deployment", func(ctx context.Context) error {
		return a.api.SignalSoftware(ctx, d.ID, sig)
	})
	var apiErr *APIError
	switch {
	case err == nil:
		log.Info("software deployment signalled")
	case ctx.Err() != nil:
	case statusOf(err) == http.StatusUnauthorized:
		a.fatal(a.credentialRejected(err))
	case errors.As(err, &apiErr):
		log.Warn("the API refused the signal", "status", apiErr.Status, "error", apiMessage(err))
	default:
		log.Warn("signal not sent", "error", err)
	}
}

// softwareSignal returns the signal of a deployment round, running its hook
// only if this node never started it. ok is false when there is nothing to
// send (the agent is stopping).
func (a *agent) softwareSignal(ctx context.Context, log *slog.Logger, hooks *Hooks, d protocol.SoftwareDeployment) (sig protocol.SoftwareSignal, ok bool) {
	rec, err := a.records.LoadSoftware(d.ID, d.Round)
	switch {
	case err != nil:
		log.Error("the deployment round's record is unreadable; signalling it failed rather than risk applying it twice", "error", err)
		return failedSignal(d, fmt.Sprintf("not applied: the agent's record of this round is unreadable (%v)", err)), true
	case rec != nil && rec.Signal != nil:
		log.Info("software deployment already run; sending its signal again")
		return *rec.Signal, true
	case rec != nil && rec.Phase == PhaseStarted:
		log.Warn("the agent stopped while this deployment round was running; signalling it failed instead of applying it again",
			"started", rec.UpdatedAt, "pid", rec.PID)
		sig = failedSignal(d, fmt.Sprintf("interrupted: the agent (pid %d) stopped while the hook was running (started %s); "+
			"it is not applied again by the agent", rec.PID, rec.UpdatedAt.Format(time.RFC3339)))
		a.storeSignal(log, rec, sig)
		return sig, true
	}
	// An agent from before the records kept only the signal, next to the
	// round's files.
	if data, err := os.ReadFile(filepath.Join(hooks.Dir(d), "signal.json")); err == nil && json.Unmarshal(data, &sig) == nil {
		log.Info("software deployment already run; sending its signal again")
		return sig, true
	}
	rec = &SoftwareRecord{ID: d.ID, Round: d.Round, Phase: PhaseStarted}
	if err := a.records.SaveSoftware(rec); err != nil {
		log.Error("cannot record the deployment round durably; not running its hook", "error", err)
		return failedSignal(d, fmt.Sprintf("not applied: the agent cannot record the round durably (%v)", err)), true
	}
	log.Info("software deployment started")
	sig = hooks.Run(ctx, d)
	if ctx.Err() != nil {
		// The hook was interrupted: the record stays started, and the round
		// is signalled failed when it comes again.
		log.Warn("agent stopping; software deployment not signalled")
		return sig, false
	}
	a.storeSignal(log, rec, sig)
	if sig.StatusCode == 0 {
		log.Info("software deployment ran", "outputs", len(sig.Outputs))
	} else {
		log.Warn("software deployment failed", "status_code", sig.StatusCode, "reason", sig.StatusReason)
	}
	return sig, true
}

func (a *agent) storeSignal(log *slog.Logger, rec *SoftwareRecord, sig protocol.SoftwareSignal) {
	rec.Phase, rec.Signal = PhaseFinished, &sig
	if err := a.records.SaveSoftware(rec); err != nil {
		log.Error("cannot store the deployment round's signal durably", "error", err)
	}
}

// failedSignal is the signal of a round the agent did not (fully) run.
func failedSignal(d protocol.SoftwareDeployment, reason string) protocol.SoftwareSignal {
	return protocol.SoftwareSignal{Round: d.Round, Outputs: map[string]any{}, StatusCode: HookBroken, StatusReason: reason, Stderr: reason}
}
