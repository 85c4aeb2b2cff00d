package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// held at a time, each deployment round run once by its hook (the signal
// is kept in <dir>/signal.json, so a restarted agent re-sends it instead of
// running the hook again), and its signal sent with retries.
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

func (a *agent) deploySoftware(ctx context.Context, hooks *Hooks, d protocol.SoftwareDeployment) {
	log := a.log.With("software_deployment", d.ID, "round", d.Round, "action", d.Action, "group", d.Group, "config", d.Name)
	marker := filepath.Join(hooks.Dir(d), "signal.json")
	var sig protocol.SoftwareSignal
	if data, err := os.ReadFile(marker); err == nil && json.Unmarshal(data, &sig) == nil {
		log.Info("software deployment already run; sending its signal again")
	} else {
		log.Info("software deployment started")
		sig = hooks.Run(ctx, d)
		if ctx.Err() != nil {
			log.Warn("agent stopping; software deployment not signalled")
			return
		}
		if data, err := json.Marshal(sig); err == nil {
			if err := os.WriteFile(marker, data, 0o600); err != nil {
				log.Warn("cannot keep the signal", "path", marker, "error", err)
			}
		}
		if sig.StatusCode == 0 {
			log.Info("software deployment ran", "outputs", len(sig.Outputs))
		} else {
			log.Warn("software deployment failed", "status_code", sig.StatusCode, "reason", sig.StatusReason)
		}
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
