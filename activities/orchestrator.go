package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// LocalRuns is what the orchestrator jig needs: starting a run in the
// worker, recording its result like an agent's, and move_to_bootstrap
// (the Fuel store, which reaches the kernel's run methods).
type LocalRuns interface {
	StartLocalRun(ctx context.Context, runID int64) (*models.TaskRun, *models.Node, error)
	RecordRunResult(ctx context.Context, nodeID, runID int64, res protocol.RunResult) (*models.RecordedResult, error)
	MoveToBootstrap(ctx context.Context, nodeID int64) error
	// NodeSecrets decrypts the named secrets of the node's deployment.
	NodeSecrets(ctx context.Context, nodeID int64, names []string) (map[string]string, error)
}

// masterShellEnv names the variables of the worker's environment a
// master_shell command inherits; everything else (DATABASE_URL, tokens,
// the secret key) stays out.
var masterShellEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"}

// cleanEnviron is the base environment of master_shell commands.
func cleanEnviron() []string {
	env := []string{}
	for _, k := range masterShellEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// RunOnOrchestrator runs a task in the worker rather than on its node (the
// orchestrator jig): master_shell runs its command here with the node's
// context in its environment, as Fuel runs it on the master node;
// move_to_bootstrap returns the node to discovery. The result is recorded
// like an agent's.
func (a *Activities) RunOnOrchestrator(ctx context.Context, in contract.RunTaskInput) (*contract.RunOutcome, error) {
	var run *models.TaskRun
	var node *models.Node
	err := a.whenNodeFree(ctx, in, func() error {
		var err error
		run, node, err = a.LocalRuns.StartLocalRun(ctx, in.RunID)
		return err
	})
	if err != nil {
		return nil, err
	}
	if run.State == contract.RunSucceeded || run.State == contract.RunSkipped {
		// A retry after it succeeded (do not run twice), or its inputs
		// turned out unchanged (LCM): nothing to do.
		return &contract.RunOutcome{}, nil
	}
	log := a.Log.With("transaction", run.TransactionID, "node", run.NodeName, "task", run.TaskName, "run", run.ID, "attempt", run.Attempt)
	defer keepAlive(ctx)() // the command runs in this worker
	var res protocol.RunResult
	switch run.TaskType {
	case fuel.TaskMoveToBootstrap:
		start := time.Now()
		err := a.LocalRuns.MoveToBootstrap(ctx, node.ID)
		res = protocol.RunResult{Attempt: run.Attempt, StartedAt: start, FinishedAt: time.Now(),
			StdoutTail: fmt.Sprintf("%s returned to discovery (system deployment, no roles or tags)\n", node.Name)}
		if err != nil {
			res.ExitCode, res.Error = -1, err.Error()
		}
	default:
		res, err = a.masterShell(ctx, run, node)
		if err != nil {
			return nil, err
		}
	}
	rec, err := a.LocalRuns.RecordRunResult(ctx, node.ID, run.ID, res)
	if err != nil {
		return nil, err
	}
	log.Info("orchestrator run finished", "state", rec.Run.State, "exit_code", res.ExitCode)
	if !res.Succeeded() {
		msg := fmt.Sprintf("task %s failed on the orchestrator for %s with exit code %d", run.TaskName, node.Name, res.ExitCode)
		if res.Error != "" {
			msg = fmt.Sprintf("task %s failed on the orchestrator for %s: %s", run.TaskName, node.Name, res.Error)
		}
		return nil, temporal.NewApplicationError(msg, contract.ErrTypeTaskFailed, contract.RunOutcome{ExitCode: res.ExitCode})
	}
	return &contract.RunOutcome{ExitCode: res.ExitCode}, nil
}

// masterShell runs a master_shell task's command in the worker, with the
// node's context: ANNEAL_NODE, ANNEAL_NODE_ID, ANNEAL_NODE_ADDRESS,
// ANNEAL_NODE_TAGS and ANNEAL_NODE_ROLES (comma separated), plus the
// transaction's outputs as the agent gets them.
func (a *Activities) masterShell(ctx context.Context, run *models.TaskRun, node *models.Node) (protocol.RunResult, error) {
	dir := filepath.Join(a.orchestratorDir(), node.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return protocol.RunResult{}, fmt.Errorf("orchestrator work directory: %w", err)
	}
	env := map[string]string{
		"ANNEAL_NODE_ID":      strconv.FormatInt(node.ID, 10),
		"ANNEAL_NODE_ADDRESS": node.Address,
		"ANNEAL_NODE_TAGS":    strings.Join(node.Tags, ","),
		"ANNEAL_NODE_ROLES":   strings.Join(node.Roles, ","),
	}
	// A clean environment: the worker's own (database URL, tokens, secret
	// key) is none of the command's business.
	exec := &daemon.ShellExecutor{WorkDir: dir, NodeName: node.Name, Logger: a.Log, BaseEnv: cleanEnviron()}
	item := protocol.WorkItem{
		RunID: run.ID, Attempt: run.Attempt, TransactionID: run.TransactionID.String(), Graph: run.GraphType,
		Task: run.TaskName, Type: "shell", Command: run.Spec.Cmd, TimeoutSec: run.Spec.TimeoutSec, Env: env,
	}
	if len(run.Spec.Secrets) > 0 {
		names := make([]string, 0, len(run.Spec.Secrets))
		for _, n := range run.Spec.Secrets {
			names = append(names, n)
		}
		vals, err := a.LocalRuns.NodeSecrets(ctx, node.ID, names)
		if err != nil {
			return protocol.RunResult{Attempt: run.Attempt, ExitCode: -1, StartedAt: time.Now(), FinishedAt: time.Now(),
				Error: "its secrets could not be resolved: " + err.Error()}, nil
		}
		for k, n := range run.Spec.Secrets {
			env[k] = vals[n]
			item.Redact = append(item.Redact, vals[n])
		}
	}
	if run.AttrsIn != nil || run.NodeRoleID != nil {
		// A noderole run of the local jig, or a graph task with its node's
		// merged data: it sees its attributes as an agent's run would.
		raw, err := json.Marshal(run.AttrsIn)
		if err != nil {
			return protocol.RunResult{}, fmt.Errorf("encode attributes of run %d: %w", run.ID, err)
		}
		item.Attrs = raw
	}
	if run.NodeRoleID != nil {
		item.TransactionID, item.NodeRoleID = "", *run.NodeRoleID
	}
	return exec.Execute(ctx, item), nil
}

func (a *Activities) orchestratorDir() string {
	if a.OrchestratorDir != "" {
		return a.OrchestratorDir
	}
	return filepath.Join(os.TempDir(), "anneal-orchestrator")
}

// keepAlive heartbeats the activity of ctx until the returned stop is
// called: the worker runs the command itself (orchestrator and ssh jigs),
// so nobody else heartbeats for it. The beat is well within the activity's
// heartbeat timeout (a third of it, at most every 5 s; the SDK throttles
// what it sends).
func keepAlive(ctx context.Context) (stop func()) {
	every := 5 * time.Second
	if hb := activity.GetInfo(ctx).HeartbeatTimeout; hb > 0 && hb/3 < every {
		every = max(hb/3, 100*time.Millisecond)
	}
	activity.RecordHeartbeat(ctx)
	beat, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-beat.Done():
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return cancel
}
