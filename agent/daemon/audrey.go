package daemon

// Audrey on the node (seed 003's "client tools"). An agent started as an
// instance of an imported deployable (Config.Audrey: the instance's uuid
// and credential, and the instance-config document it was launched with)
// speaks the config-server protocol, at the root of the API's URL:
//
//  1. POST /configs/<uuid> with its instance config (when it has one): 201.
//  2. GET /configs/<uuid> until 200 (complete). On 202 (a partial config,
//     the service allows it) it applies the services that are complete
//     already; on 204 (partial, not allowed) it waits and asks again.
//  3. Applies each service through the hooks its config names: every
//     <script name="S"/> of the service runs, in order, with the hook
//     "G" for a name "G:rest" (G a hook name: the built-in "script" takes
//     rest as the script, another G is <HooksDir>/G with rest as its config),
//     and with the hook "audrey" (<HooksDir>/audrey, the configuration
//     engine) for any other name, given the name as its config (a puppet
//     class, a recipe). The hook gets the service's parameters as inputs
//     (a list as a JSON array) and the instance's provided parameters as
//     its outputs; what the hooks output under those names is the
//     instance's reply. A failing hook is tried again at the next poll.
//  4. GET /params/<uuid>: while 202, PUT /reply/<uuid> with the provided
//     parameters it has values for, as soon as it has them (so instances
//     waiting for them can go on); 200 ends the protocol.
//
// What was applied is kept in <WorkDir>/audrey/state.json, so a restarted
// agent does not apply a service twice.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/audrey/aeolus"
)

// AudreyEngineHook is the hook that applies a script named without a hook
// prefix (Audrey's configuration engine on the node).
const AudreyEngineHook = "audrey"

// AudreyConfig makes the agent a deployable's instance.
type AudreyConfig struct {
	// UUID is the instance's uuid; Token its own credential (from the
	// deployable's import).
	UUID  string
	Token string
	// ConfigXML is the <instance-config> the instance was launched with;
	// when set it is POSTed first.
	ConfigXML []byte
	// Poll is the pause between GETs while the config or the parameters
	// are incomplete; default 5s.
	Poll time.Duration
}

// AudreyState is what the agent did as an instance (state.json).
type AudreyState struct {
	Posted   bool                         `json:"posted"`
	Applied  map[string]map[string]string `json:"applied"` // service → its outputs
	Replied  map[string]string            `json:"replied"` // provided parameter → value sent
	Complete bool                         `json:"complete"`
}

// audreyClient is the instance's side of the config server.
type audreyClient struct {
	base   string
	cfg    AudreyConfig
	http   *http.Client
	hooks  *Hooks
	log    *slog.Logger
	state  AudreyState
	path   string
	failed map[string]string // service → why its last application failed
}

// RunAudrey speaks the config-server protocol until the instance is
// configured and has replied every provided parameter, or ctx ends. It
// answers nil when done; an error when the config server refuses the
// instance (401, 404) or a document cannot be read.
func RunAudrey(ctx context.Context, apiURL, workDir, hooksDir, node string, cfg AudreyConfig, client *http.Client, log *slog.Logger) error {
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	if log == nil {
		log = slog.Default()
	}
	c := &audreyClient{
		base: strings.TrimRight(apiURL, "/"), cfg: cfg, http: client, log: log.With("instance", cfg.UUID),
		hooks: &Hooks{WorkDir: filepath.Join(workDir, "audrey"), HooksDir: hooksDir, NodeName: node, Logger: log},
		path:  filepath.Join(workDir, "audrey", "state.json"), failed: map[string]string{},
	}
	if hooksDir == "" {
		c.hooks.HooksDir = filepath.Join(workDir, "hooks")
	}
	if err := c.load(); err != nil {
		return err
	}
	return c.run(ctx)
}

func (c *audreyClient) load() error {
	c.state = AudreyState{Applied: map[string]map[string]string{}, Replied: map[string]string{}}
	b, err := os.ReadFile(c.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read audrey state: %w", err)
	}
	if err := json.Unmarshal(b, &c.state); err != nil {
		return fmt.Errorf("read audrey state %s: %w", c.path, err)
	}
	if c.state.Applied == nil {
		c.state.Applied = map[string]map[string]string{}
	}
	if c.state.Replied == nil {
		c.state.Replied = map[string]string{}
	}
	return nil
}

func (c *audreyClient) save() error {
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	return writeReplacing(c.path, "."+filepath.Base(c.path)+".*.tmp", b, false)
}

// call sends one request; a network error or a 5xx is retried after Poll.
func (c *audreyClient) call(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, method, c.base+path+c.cfg.UUID, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
		if body != nil {
			req.Header.Set("Content-Type", "application/xml")
		}
		resp, err := c.http.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			resp.Body.Close()
			if rerr == nil && resp.StatusCode < 500 {
				return resp.StatusCode, b, nil
			}
			err = fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
		}
		c.log.Warn("config server unreachable, retrying", "error", err)
		if err := sleepCtx(ctx, c.cfg.Poll); err != nil {
			return 0, nil, err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// refused is a config-server answer that ends the protocol.
func refused(method, path string, code int, body []byte) error {
	return fmt.Errorf("config server refused %s %s: %d %s", method, path, code, strings.TrimSpace(string(body)))
}

func (c *audreyClient) run(ctx context.Context) error {
	if c.state.Complete {
		return nil
	}
	if len(c.cfg.ConfigXML) > 0 && !c.state.Posted {
		code, body, err := c.call(ctx, http.MethodPost, "/configs/", c.cfg.ConfigXML)
		if err != nil {
			return err
		}
		if code != http.StatusCreated {
			return refused("POST", "/configs/", code, body)
		}
		c.state.Posted = true
		if err := c.save(); err != nil {
			return err
		}
		c.log.Info("instance config posted")
	}
	for {
		code, body, err := c.call(ctx, http.MethodGet, "/configs/", nil)
		if err != nil {
			return err
		}
		var rc *aeolus.ResolvedConfig
		switch code {
		case http.StatusOK, http.StatusAccepted:
			if rc, err = aeolus.ParseResolvedConfig(body); err != nil {
				return fmt.Errorf("read the config of instance %s: %w", c.cfg.UUID, err)
			}
			c.apply(ctx, rc, code == http.StatusOK)
			if err := c.reply(ctx, rc); err != nil {
				return err
			}
		case http.StatusNoContent:
			// Partial, and this instance may not configure partially.
		default:
			return refused("GET", "/configs/", code, body)
		}
		if code == http.StatusOK && len(c.failed) == 0 {
			done, err := c.paramsDone(ctx, rc)
			if err != nil {
				return err
			}
			if done {
				c.state.Complete = true
				c.log.Info("instance configured; every provided parameter replied")
				return c.save()
			}
		}
		if err := sleepCtx(ctx, c.cfg.Poll); err != nil {
			return err
		}
	}
}

// apply runs the services not applied yet: all when the config is
// complete, else the complete ones (a partial config).
func (c *audreyClient) apply(ctx context.Context, rc *aeolus.ResolvedConfig, complete bool) {
	for i, svc := range rc.Services {
		if _, done := c.state.Applied[svc.Name]; done {
			continue
		}
		if !complete && !svc.Complete {
			continue
		}
		outputs, err := c.applyService(ctx, rc, i)
		if err != nil {
			c.failed[svc.Name] = err.Error()
			c.log.Warn("applying a service failed; trying again at the next poll", "service", svc.Name, "error", err)
			continue
		}
		delete(c.failed, svc.Name)
		c.state.Applied[svc.Name] = outputs
		if err := c.save(); err != nil {
			c.log.Warn("cannot store the audrey state", "error", err)
		}
		c.log.Info("service applied", "service", svc.Name, "outputs", slices.Sorted(maps.Keys(outputs)))
	}
}

// scriptHook splits a script name into its hook and the hook's config.
func scriptHook(name string) (hook, config string) {
	if g, rest, ok := strings.Cut(name, ":"); ok && !strings.HasPrefix(rest, ":") && validGroup(g) && !strings.Contains(g, ":") {
		return g, rest
	}
	return AudreyEngineHook, name
}

// applyService runs the hooks of service i's scripts and returns what they
// output for the instance's provided parameters.
func (c *audreyClient) applyService(ctx context.Context, rc *aeolus.ResolvedConfig, i int) (map[string]string, error) {
	svc := rc.Services[i]
	inputs := map[string]any{}
	var ios []protocol.SoftwareIO
	for _, p := range svc.Params {
		var v any = strings.Join(p.Values, "")
		if p.List {
			v = append([]string{}, p.Values...)
		}
		inputs[p.Name] = v
		ios = append(ios, protocol.SoftwareIO{Name: p.Name, Value: v})
	}
	var outs []protocol.SoftwareIO
	for _, p := range rc.Provided {
		outs = append(outs, protocol.SoftwareIO{Name: p})
	}
	got := map[string]string{}
	for j, script := range svc.Scripts {
		hook, config := scriptHook(script)
		d := protocol.SoftwareDeployment{
			ID: int64(i*100 + j), Round: len(c.state.Applied) + 1, Action: "CREATE", Server: c.hooks.NodeName,
			Name: svc.Name, Group: hook, Config: config, Inputs: ios, Outputs: outs, InputValues: inputs,
			Options: map[string]any{"instance": rc.Name, "instance_uuid": rc.ID, "assembly_type": rc.Type, "script": script},
		}
		sig := c.hooks.Run(ctx, d)
		if sig.StatusCode != 0 {
			reason := sig.StatusReason
			if reason == "" {
				reason = strings.TrimSpace(sig.Stderr)
			}
			return nil, fmt.Errorf("script %q of service %s (hook %s) exited %d: %s", script, svc.Name, hook, sig.StatusCode, reason)
		}
		for k, v := range sig.Outputs {
			if slices.Contains(rc.Provided, k) {
				got[k] = inputText(v)
			}
		}
	}
	return got, nil
}

// reply PUTs the provided parameters the applied services produced and
// that were not sent yet.
func (c *audreyClient) reply(ctx context.Context, rc *aeolus.ResolvedConfig) error {
	values := map[string]string{}
	var order []string
	for _, svc := range rc.Services {
		for k, v := range c.state.Applied[svc.Name] {
			if sent, ok := c.state.Replied[k]; ok && sent == v {
				continue
			}
			if _, dup := values[k]; !dup {
				order = append(order, k)
			}
			values[k] = v
		}
	}
	if len(order) == 0 {
		return nil
	}
	slices.Sort(order)
	code, body, err := c.call(ctx, http.MethodPut, "/reply/", aeolus.ReplyXML(values, order))
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return refused("PUT", "/reply/", code, body)
	}
	for _, k := range order {
		c.state.Replied[k] = values[k]
	}
	c.log.Info("provided parameters replied", "parameters", order)
	return c.save()
}

// paramsDone asks GET /params whether the config server needs anything
// more from the instance (200: no).
func (c *audreyClient) paramsDone(ctx context.Context, rc *aeolus.ResolvedConfig) (bool, error) {
	code, body, err := c.call(ctx, http.MethodGet, "/params/", nil)
	if err != nil {
		return false, err
	}
	switch code {
	case http.StatusOK:
		return true, nil
	case http.StatusAccepted:
		c.log.Info("the config server still expects provided parameters no hook produced", "answer", strings.TrimSpace(string(body)))
		return false, nil
	}
	return false, refused("GET", "/params/", code, body)
}
