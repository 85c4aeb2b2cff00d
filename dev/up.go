package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/scenarios"
	"github.com/anneal-dev/anneal/worker/server"
)

// Names of the things `dev up` sets up.
const (
	devDatabase   = "anneal"
	devDeployment = "sample"
)

// up brings the whole system up and keeps it up until ctx ends.
func up(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	nodes := fs.Int("nodes", 3, "simulated nodes to start")
	apiAddr := fs.String("api", server.DefaultAPIAddr, "address of the REST API")
	eager := fs.Bool("eager-activities", true, "start the Temporal dev server with system.enableActivityEagerExecution=true: "+
		"the server hands an activity to the worker that scheduled it with its workflow task's reply, no trip through matching "+
		"(a server already running on the port is reused as it is)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes < 1 {
		return errors.New("--nodes must be at least 1")
	}
	if err := os.MkdirAll(filepath.Join(state, "logs"), 0o755); err != nil {
		return err
	}
	pg, err := devenv.EnsurePostgres(ctx, state, log)
	if err != nil {
		return err
	}
	defer pg.Close()
	dbURL, err := openDevDatabase(ctx, pg, state, log)
	if err != nil {
		return err
	}
	keyFile, err := ensureSecretKey(state)
	if err != nil {
		return err
	}
	// The Web UI reads the (encrypted) payloads through the codec proxy
	// this process serves (serveCodecProxy).
	codecAddr := fmt.Sprintf("127.0.0.1:%d", DefaultCodecProxyPort)
	topts := devenv.DefaultTemporalOptions(state)
	topts.ExtraArgs = append(topts.ExtraArgs, "--ui-codec-endpoint", "http://"+codecAddr)
	if *eager {
		topts.ExtraArgs = append(topts.ExtraArgs, eagerActivitiesArgs...)
	}
	tmp, err := devenv.EnsureTemporal(ctx, topts, log)
	if err != nil {
		return err
	}
	defer tmp.Close()
	bin, err := buildBinaries(ctx, root, state)
	if err != nil {
		return err
	}
	env := loadOrCreateEnv(state)
	apiURL := "http://" + *apiAddr
	env["ANNEAL_URL"], env["TEMPORAL_UI"], env["TEMPORAL_ADDRESS"] = apiURL, tmp.UIURL, tmp.Address

	// The admin token reaches the database as an install's first one
	// does: the server takes it as its bootstrap token.
	srv, err := startWorker(ctx, bin, dbURL, tmp.Address, tmp.UIURL, *apiAddr, env["ANNEAL_TOKEN"], keyFile, filepath.Join(state, "logs", "worker.log"))
	if err != nil {
		return err
	}
	defer srv.Stop(10 * time.Second)
	if err := serveCodecProxy(ctx, codecAddr, apiURL, env["ANNEAL_TOKEN"], strings.TrimRight(tmp.UIURL, "/")); err != nil {
		log.Warn("the Web UI will show encrypted payloads", "error", err)
	}
	api := newAPIClient(apiURL, env["ANNEAL_TOKEN"])
	if err := ensureEnrollToken(ctx, api, env); err != nil {
		return err
	}
	if err := seed(ctx, api); err != nil {
		return err
	}
	var agents []*devenv.Proc
	defer func() {
		for _, a := range agents {
			a.Stop(5 * time.Second)
		}
	}()
	names := make([]string, *nodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d.%s", i+1, server.DefaultDomain)
		workdir := filepath.Join(state, "nodes", names[i])
		if err := restoreCredential(ctx, dbURL, apiURL, names[i], workdir); err != nil {
			return err
		}
		port, err := devenv.FreePort()
		if err != nil {
			return err
		}
		a, err := devenv.StartProc(names[i], exec.Command(filepath.Join(bin, "agent"),
			"--api", apiURL, "--name", names[i], "--enroll-token", env["ANNEAL_ENROLL_TOKEN"], "--workdir", workdir,
			"--address", fmt.Sprintf("127.0.0.1:%d", port)),
			filepath.Join(state, "logs", names[i]+".log"))
		if err != nil {
			return err
		}
		agents = append(agents, a)
	}
	if err := assignNodes(ctx, api, names, agents); err != nil {
		return err
	}
	if err := bindSampleRoles(ctx, api, names); err != nil {
		return err
	}
	if err := writeEnv(state, env); err != nil {
		return err
	}
	fmt.Printf(`
anneal is up.
  Dashboard    %s/   (sign in with the API token below)
  API          %s   (token in .dev/env: source .dev/env)
  API token    %s
  Temporal UI  %s   (payloads are encrypted; the UI decodes them through the codec proxy at http://%s)
  Temporal     %s
  Postgres     %s (%s)
  Nodes        %s  (deployment %q)
  Logs         %s

Try:  source .dev/env && curl -s -H "Authorization: Bearer $ANNEAL_TOKEN" \
        -d '{"deployment":"sample","graphs":[{"type":"deployment"}]}' $ANNEAL_URL/api/v1/graphs/execute
Ctrl-C stops everything.
`, apiURL, apiURL, env["ANNEAL_TOKEN"], tmp.UIURL, codecAddr, tmp.Address, dbURL, pg.Source, strings.Join(names, ", "), devDeployment,
		filepath.Join(state, "logs"))
	select {
	case <-ctx.Done():
		fmt.Println("\nstopping...")
		return nil
	case <-srv.Done():
		return fmt.Errorf("the worker exited: %v\n%s", srv.Err(), srv.LogTail(20))
	}
}

// buildBinaries builds the worker and the agent into .dev/bin.
func buildBinaries(ctx context.Context, root, state string) (string, error) {
	bin := filepath.Join(state, "bin")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin+string(os.PathSeparator), "./worker", "./agent")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build worker and agent: %w\n%s", err, out)
	}
	return bin, nil
}

// loadOrCreateEnv reuses the tokens of .dev/env, or mints a new admin
// token (which the server stores as its bootstrap token).
func loadOrCreateEnv(state string) map[string]string {
	env := map[string]string{}
	if f, err := os.Open(filepath.Join(state, "env")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "="); ok {
				env[k] = strings.Trim(v, `'"`)
			}
		}
		f.Close()
	}
	if env["ANNEAL_TOKEN"] == "" {
		env["ANNEAL_TOKEN"] = models.NewSecret("ann_")
	}
	return env
}

// ensureEnrollToken creates the agents' enroll token through the API, as
// an operator would, unless .dev/env has one (the database kept it).
func ensureEnrollToken(ctx context.Context, api *apiClient, env map[string]string) error {
	if env["ANNEAL_ENROLL_TOKEN"] != "" {
		return nil
	}
	var tok struct {
		Token string `json:"token"`
	}
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/tokens", "", map[string]string{"name": "dev-enroll", "scope": models.ScopeEnroll}, &tok); err != nil {
		return fmt.Errorf("create the agents' enroll token: %w", err)
	}
	env["ANNEAL_ENROLL_TOKEN"] = tok.Token
	return nil
}

func writeEnv(state string, env map[string]string) error {
	var b strings.Builder
	b.WriteString("# Written by `go run ./dev up`; source it: . .dev/env (or set -a; . .dev/env; set +a to export)\n")
	for _, k := range []string{"ANNEAL_URL", "ANNEAL_TOKEN", "ANNEAL_ENROLL_TOKEN", "TEMPORAL_UI", "TEMPORAL_ADDRESS"} {
		fmt.Fprintf(&b, "%s=%s\n", k, env[k])
	}
	return os.WriteFile(filepath.Join(state, "env"), []byte(b.String()), 0o600)
}

// seed imports the sample release and creates the sample deployment
// through the API, as an operator would.
func seed(ctx context.Context, api *apiClient) error {
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/releases", "application/yaml", scenarios.SampleRelease, nil); err != nil {
		return fmt.Errorf("import the sample release: %w", err)
	}
	status, err := api.call(ctx, http.MethodPost, "/api/v1/deployments", "", map[string]string{"name": devDeployment, "release": "sample"}, nil)
	if err != nil && status != http.StatusConflict {
		return fmt.Errorf("create the sample deployment: %w", err)
	}
	return nil
}

// startWorker starts the worker binary with the API on apiAddr and waits
// until the API answers.
func startWorker(ctx context.Context, bin, dbURL, temporalAddr, temporalUI, apiAddr, bootstrapToken, keyFile, logFile string) (*devenv.Proc, error) {
	cmd := exec.Command(filepath.Join(bin, "worker"),
		"-database-url", dbURL, "-temporal", temporalAddr, "-temporal-ui", temporalUI, "-api", apiAddr, "-secret-key-file", keyFile)
	cmd.Env = append(os.Environ(), "ANNEAL_BOOTSTRAP_TOKEN="+bootstrapToken)
	srv, err := devenv.StartProc("worker", cmd, logFile)
	if err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, "http://"+apiAddr, 60*time.Second, srv.Done()); err != nil {
		srv.Stop(5 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, srv.LogTail(20))
	}
	return srv, nil
}

// waitNode waits until the node's agent has phoned home; agent, when not
// nil, is the agent's process, whose early exit is an error.
func waitNode(ctx context.Context, api *apiClient, name string, agent *devenv.Proc) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var node models.Node
		_, err := api.call(ctx, http.MethodGet, "/api/v1/nodes/"+name, "", nil, &node)
		if agent != nil {
			select {
			case <-agent.Done():
				return fmt.Errorf("the agent of %s exited: %v\n%s", name, agent.Err(), agent.LogTail(5))
			default:
			}
		}
		if err == nil && node.LastSeenAt != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s did not register within 60s (see its agent's log): %w", name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// assignNodes waits for the agents to phone home, then puts their nodes
// into the sample deployment: the first is the controller, the rest compute.
func assignNodes(ctx context.Context, api *apiClient, names []string, agents []*devenv.Proc) error {
	for i, name := range names {
		role := "compute"
		if i == 0 {
			role = "controller"
		}
		if err := waitNode(ctx, api, name, agents[i]); err != nil {
			return err
		}
		body := map[string]any{"deployment": devDeployment, "roles": []string{role}}
		if _, err := api.call(ctx, http.MethodPatch, "/api/v1/nodes/"+name, "", body, nil); err != nil {
			return fmt.Errorf("assign %s to %s: %w", role, name, err)
		}
	}
	return nil
}

// bindSampleRoles binds the sample release's Crowbar roles through a
// snapshot of the sample deployment, once: db-server on the first node,
// app-server on the others. Committing it wakes the annealer, which runs
// them in dependency order (after each node's node-base).
func bindSampleRoles(ctx context.Context, api *apiClient, names []string) error {
	var bound struct {
		Items []crowbar.NodeRole `json:"items"`
	}
	if _, err := api.call(ctx, http.MethodGet, "/api/v1/noderoles?limit=1&deployment="+devDeployment, "", nil, &bound); err != nil {
		return fmt.Errorf("list the sample noderoles: %w", err)
	}
	if len(bound.Items) > 0 {
		return nil // a second `up`: the deployment keeps what it has
	}
	var snap crowbar.Snapshot
	if _, err := api.call(ctx, http.MethodPost, "/api/v1/deployments/"+devDeployment+"/snapshots/propose", "", nil, &snap); err != nil {
		return fmt.Errorf("propose a snapshot of %s: %w", devDeployment, err)
	}
	for i, name := range names {
		role := "app-server"
		if i == 0 {
			role = "db-server"
		}
		body := map[string]string{"node": name, "role": role}
		if _, err := api.call(ctx, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/noderoles", snap.ID), "", body, nil); err != nil {
			return fmt.Errorf("bind %s to %s: %w", role, name, err)
		}
	}
	if _, err := api.call(ctx, http.MethodPost, fmt.Sprintf("/api/v1/snapshots/%d/commit", snap.ID), "", nil, nil); err != nil {
		return fmt.Errorf("commit snapshot %d: %w", snap.ID, err)
	}
	return nil
}

// openDevDatabase returns the dev database. Without .dev/env the tokens
// and the agents' credentials are gone, so the database starts afresh too.
func openDevDatabase(ctx context.Context, pg *devenv.Postgres, state string, log *slog.Logger) (string, error) {
	if _, err := os.Stat(filepath.Join(state, "env")); err == nil {
		return pg.EnsureDatabase(ctx, devDatabase)
	}
	log.Info("no .dev/env: starting with a fresh database and fresh simulated nodes")
	if err := os.RemoveAll(filepath.Join(state, "nodes")); err != nil {
		return "", err
	}
	return pg.ResetDatabase(ctx, devDatabase)
}

// restoreCredential gives a simulated node whose row exists but whose work
// directory lost its credential (a removed .dev/nodes) a new credential, as
// an operator re-provisioning the machine would; otherwise its agent could
// never register again under its name.
func restoreCredential(ctx context.Context, dbURL, apiURL, name, workdir string) error {
	path := filepath.Join(workdir, daemon.CredentialFile)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	db, err := models.Open(ctx, dbURL)
	if err != nil {
		return err
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	store := &models.Store{DB: db}
	node, token, err := store.ResetAgentCredential(ctx, name)
	if errors.Is(err, models.ErrNotFound) {
		return nil // a new node: its agent registers itself
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(workdir, 0o755); err != nil {
		return err
	}
	return daemon.SaveCredential(path, daemon.Credential{NodeID: node.ID, Name: node.Name, Token: token, APIURL: apiURL})
}
