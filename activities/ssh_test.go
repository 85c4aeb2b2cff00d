package activities_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"golang.org/x/crypto/ssh"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// fakeSSH keeps one run, its node and the node's SSH settings in memory,
// as the kernel store does for the ssh jig.
type fakeSSH struct {
	mu       sync.Mutex
	run      models.TaskRun
	node     models.Node
	settings models.NodeSSH
	keyErr   error // what NodeSSH answers instead of the settings
	outputs  []models.RunOutputs
	results  []protocol.RunResult
}

func (f *fakeSSH) StartLocalRun(_ context.Context, runID int64) (*models.TaskRun, *models.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.run.State, f.run.Attempt = contract.RunRunning, f.run.Attempt+1
	r, n := f.run, f.node
	return &r, &n, nil
}

func (f *fakeSSH) RecordRunResult(_ context.Context, nodeID, runID int64, res protocol.RunResult) (*models.RecordedResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results = append(f.results, res)
	f.run.State = contract.RunFailed
	if res.Succeeded() {
		f.run.State = contract.RunSucceeded
	}
	r := f.run
	return &models.RecordedResult{Run: &r, Changed: true}, nil
}

func (f *fakeSSH) NodeSSH(context.Context, int64) (*models.NodeSSH, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keyErr != nil {
		return nil, f.keyErr
	}
	s := f.settings
	return &s, nil
}

func (f *fakeSSH) PinSSHHostKey(_ context.Context, _ int64, line string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.settings.KnownHosts == "" {
		f.settings.KnownHosts = line + "\n"
	}
	return f.settings.KnownHosts, nil
}

func (f *fakeSSH) RunContext(context.Context, *models.TaskRun) (*models.RunContext, error) {
	return &models.RunContext{Outputs: f.outputs}, nil
}

func (f *fakeSSH) last(t *testing.T) protocol.RunResult {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.results, "a result was recorded")
	return f.results[len(f.results)-1]
}

// sshFixture is an sshd and a run of cmd on its node.
func sshFixture(t *testing.T, cmd string, timeoutSec int) (*testenv.SSHD, *fakeSSH) {
	sshd := testenv.StartSSHD(t)
	f := &fakeSSH{
		run: models.TaskRun{ID: 7, TransactionID: uuid.New(), GraphType: "deployment", NodeID: 3, NodeName: "n1.anneal.test",
			TaskName: "setup", TaskType: "shell", State: contract.RunPending,
			Spec: models.RunSpec{Jig: "ssh", Cmd: cmd, TimeoutSec: timeoutSec}},
		node:     models.Node{ID: 3, Name: "n1.anneal.test", Address: "127.0.0.1:9999"},
		settings: models.NodeSSH{NodeID: 3, User: sshd.User, Port: sshd.Port, PrivateKey: sshd.ClientKey},
	}
	return sshd, f
}

func runOverSSH(t *testing.T, f *fakeSSH, keepalive time.Duration, dir string) (time.Duration, error) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	env.RegisterActivity(&activities.Activities{SSH: f, Log: quiet, OrchestratorDir: dir, SSHKeepalive: keepalive})
	start := time.Now()
	_, err := env.ExecuteActivity(contract.RunOverSSHActivity, contract.RunTaskInput{RunID: 7, Task: "setup", Node: "n1.anneal.test"})
	return time.Since(start), err
}

func TestRunOverSSHSucceedsWithOutputs(t *testing.T) {
	sshd, f := sshFixture(t, `echo "hello from $ANNEAL_NODE task $ANNEAL_TASK"; echo oops >&2
echo "prev=$ANNEAL_OUT_BASE_VERSION" >> "$ANNEAL_OUTPUTS"
printf 'address=10.0.0.5\nport = 5432\n' >> "$ANNEAL_OUTPUTS"`, 30)
	f.outputs = []models.RunOutputs{{TaskName: "base", NodeName: "n1.anneal.test", Outputs: map[string]string{"version": "3"}},
		{TaskName: "base", NodeName: "other.anneal.test", Outputs: map[string]string{"version": "9"}}}
	dir := t.TempDir()
	_, err := runOverSSH(t, f, 0, dir)
	require.NoError(t, err)
	res := f.last(t)
	assert.Equal(t, 0, res.ExitCode)
	assert.Empty(t, res.Error)
	assert.Equal(t, map[string]string{"address": "10.0.0.5", "port": "5432", "prev": "3"}, res.Outputs)
	assert.Equal(t, "hello from n1.anneal.test task setup\n", res.StdoutTail)
	assert.Equal(t, "oops\n", res.StderrTail)
	// The host key was pinned on first use: exactly the server's.
	keys, err := models.ParseKnownHosts(f.settings.KnownHosts)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	assert.Equal(t, ssh.FingerprintSHA256(sshd.HostKey), ssh.FingerprintSHA256(keys[0]))
	// The full log is kept in the worker, in the agent's format.
	log, err := os.ReadFile(filepath.Join(dir, "n1.anneal.test", "logs", f.run.TransactionID.String(), "setup.7.1.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "out| hello from n1.anneal.test task setup\n")
	assert.Contains(t, string(log), "err| oops\n")

	// A second run reuses the pinned key (no new pin), and the run's
	// directory on the node was removed.
	f.run.Spec.Cmd = `ls "$HOME/.anneal/runs"`
	pinned := f.settings.KnownHosts
	_, err = runOverSSH(t, f, 0, dir)
	require.NoError(t, err)
	assert.Equal(t, pinned, f.settings.KnownHosts)
	assert.Equal(t, "7.2\n", f.last(t).StdoutTail, "only this run's directory is left while it runs")
}

func TestRunOverSSHNonZeroExit(t *testing.T) {
	_, f := sshFixture(t, `echo "stage=half" >> "$ANNEAL_OUTPUTS"; echo failing; exit 3`, 30)
	_, err := runOverSSH(t, f, 0, t.TempDir())
	require.Error(t, err)
	assert.Equal(t, contract.ErrTypeTaskFailed, appErrType(t, err))
	assert.Contains(t, err.Error(), "exit code 3")
	res := f.last(t)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "failing\n", res.StdoutTail)
	assert.Equal(t, map[string]string{"stage": "half"}, res.Outputs, "a failed run's outputs are kept, as the agent's")
}

func TestRunOverSSHTimeout(t *testing.T) {
	_, f := sshFixture(t, `echo started; sleep 61.5; echo never`, 2)
	took, err := runOverSSH(t, f, 0, t.TempDir())
	require.Error(t, err)
	assert.Less(t, took, 15*time.Second, "the task's timeout ends the run")
	// The command's process group on the node was stopped too.
	require.Eventually(t, func() bool {
		out, _ := exec.Command("pgrep", "-f", "sleep 61.5").Output()
		return len(out) == 0
	}, 10*time.Second, 100*time.Millisecond, "the remote command outlived its timeout")
	res := f.last(t)
	assert.Equal(t, -1, res.ExitCode)
	assert.Contains(t, res.Error, "timed out after 2s")
	assert.Equal(t, "started\n", res.StdoutTail)
}

func TestRunOverSSHWrongHostKey(t *testing.T) {
	sshd, f := sshFixture(t, `echo should not run`, 30)
	other, _ := testenv.NewSSHKey(t)
	f.settings.KnownHosts = "# pinned when the node was installed\n[127.0.0.1]:22 " + string(ssh.MarshalAuthorizedKey(other))
	_, err := runOverSSH(t, f, 0, t.TempDir())
	require.Error(t, err)
	assert.Equal(t, contract.ErrTypeTaskFailed, appErrType(t, err))
	res := f.last(t)
	assert.Equal(t, -1, res.ExitCode)
	for _, want := range []string{"host key mismatch for node n1.anneal.test", ssh.FingerprintSHA256(sshd.HostKey), ssh.FingerprintSHA256(other)} {
		assert.Contains(t, res.Error, want)
		assert.Contains(t, err.Error(), want)
	}
	assert.Empty(t, res.StdoutTail, "nothing ran")
	assert.NotContains(t, f.settings.KnownHosts, ssh.FingerprintSHA256(sshd.HostKey), "a mismatch pins nothing")
}

// A key sealed with a key the worker lacks fails the run saying so: a
// retry would meet the same.
func TestRunOverSSHUnreadableKey(t *testing.T) {
	_, f := sshFixture(t, `echo should not run`, 30)
	f.keyErr = fmt.Errorf("node 3: %w: %w", models.ErrSSHKeyUnreadable, secrets.ErrUnknownKey)
	_, err := runOverSSH(t, f, 0, t.TempDir())
	require.Error(t, err)
	assert.Equal(t, contract.ErrTypeTaskFailed, appErrType(t, err))
	res := f.last(t)
	assert.Equal(t, -1, res.ExitCode)
	assert.Contains(t, res.Error, "the SSH key of node n1.anneal.test cannot be opened")
	assert.Contains(t, res.Error, secrets.ErrUnknownKey.Error())
}

func TestRunOverSSHServerKilledMidRun(t *testing.T) {
	sshd, f := sshFixture(t, `echo started; sleep 60`, 120)
	go func() {
		// Once the command runs, the machine dies.
		time.Sleep(2 * time.Second)
		sshd.Kill()
	}()
	took, err := runOverSSH(t, f, 500*time.Millisecond, t.TempDir())
	require.Error(t, err)
	assert.Less(t, took, 20*time.Second, "a dead connection fails the run, it does not hang")
	res := f.last(t)
	assert.Equal(t, -1, res.ExitCode)
	assert.Contains(t, res.Error, "connection to node n1.anneal.test lost")
}

func TestRunOverSSHServerHungMidRun(t *testing.T) {
	sshd, f := sshFixture(t, `echo started; sleep 60`, 120)
	go func() {
		time.Sleep(2 * time.Second)
		sshd.Freeze() // the connection stays open, nothing answers
	}()
	t.Cleanup(sshd.Thaw)
	took, err := runOverSSH(t, f, 500*time.Millisecond, t.TempDir())
	require.Error(t, err)
	assert.Less(t, took, 20*time.Second, "unanswered keepalives fail the run")
	res := f.last(t)
	assert.Contains(t, res.Error, "no answer to 3 keepalives")
}
