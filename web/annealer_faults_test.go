package web_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// The annealer under faults: an agent lost while it runs a noderole, the
// worker going away mid-run, admin nodes' bootstrap roles, and nodes the
// annealer must leave alone (not available, not alive).

// partition is an agent's network: once cut, every request the agent makes
// fails as if its node had dropped off the network, so nothing it does
// (heartbeats, results) reaches the API. Agent.Stop alone is a clean
// shutdown, in which the agent still reports its interrupted run.
type partition struct{ cut atomic.Bool }

func (p *partition) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.cut.Load() {
		return nil, errors.New("test: the node is cut off the network")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// behind puts an agent behind the partition.
func (p *partition) behind(c *daemon.Config) { c.HTTPClient = &http.Client{Transport: p} }

// importRelease imports a release and creates a deployment of it.
func importRelease(t *testing.T, st *testenv.Stack, yaml, deployment, release string) {
	t.Helper()
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(yaml), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	if deployment != "" {
		status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": deployment, "release": release}, nil)
		require.Equal(t, http.StatusCreated, status, "%s", body)
	}
}

// bootstrapID is the ID of a node's NodeBootstrap workflow.
func bootstrapID(t *testing.T, st *testenv.Stack, short string) string {
	t.Helper()
	node, err := st.Store.Node(t.Context(), nodeName(short))
	require.NoError(t, err)
	return contract.NodeBootstrapWorkflowID(st.TaskQueue, node.Name, node.ID)
}

// bootstrapped waits for a node's NodeBootstrap workflow and returns what
// it bound.
func bootstrapped(t *testing.T, st *testenv.Stack, short string) contract.BootstrapResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var res contract.BootstrapResult
	id := bootstrapID(t, st, short)
	require.NoError(t, st.Temporal.GetWorkflow(ctx, id, "").Get(ctx, &res), "bootstrap of %s", short)
	return res
}

// commitAll is bindAll returning the task uuid of the deploy-changes
// transaction the commit started (it provisions the nodes that moved in),
// "" if none.
func commitAll(t *testing.T, st *testenv.Stack, deployment string, bindings ...string) string {
	t.Helper()
	id, _ := bindAll(t, st, deployment, bindings...).DeployChanges["task_uuid"].(string)
	return id
}

// waitState waits for a noderole to reach a state and returns it with its
// last run.
func waitState(t *testing.T, st *testenv.Stack, id int64, state string, within time.Duration) crowbar.NodeRole {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		nr := getNodeRole(t, st, id)
		if nr.State == state {
			return nr
		}
		if time.Now().After(deadline) {
			t.Fatalf("noderole %d (%s@%s) not %s after %s: it is %s after %d runs, last run %+v",
				id, nr.RoleName, nr.NodeName, state, within, nr.State, nr.RunCount, nr.LastRun)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// neverRan asserts that a noderole is in state and has not run.
func neverRan(t *testing.T, st *testenv.Stack, id int64, state string) {
	t.Helper()
	nr := getNodeRole(t, st, id)
	assert.Equal(t, state, nr.State, "%s@%s", nr.RoleName, nr.NodeName)
	assert.Zero(t, nr.RunCount, "%s@%s ran", nr.RoleName, nr.NodeName)
	assert.Nil(t, nr.LastRun, "%s@%s has a run", nr.RoleName, nr.NodeName)
}

// lostRelease: slow sleeps on its first run (remembered in a marker file
// outside the agent's work directory, so that it survives the node's
// agent) and returns at once on the next; after requires it.
const lostRelease = `
name: lost
version: "1"
roles_metadata:
  slow:
    script: |
      test -f '%[1]s' || { touch '%[1]s'; sleep 30; }
      printf '{"slow": {"ok": true}}' > "$ANNEAL_ATTRS_OUT"
  after:
    requires: [slow]
    script: echo after slow
`

// TestAnnealerAgentLostMidRun: a node that drops off the network while its
// noderole runs (no result, no heartbeat) fails that noderole by the
// heartbeat timeout, not after the run's 10-minute timeout, and its child
// stays blocked; the agent back (same credential) and a retry bring both
// to active, without the child having run before.
func TestAnnealerAgentLostMidRun(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 3})
	marker := filepath.Join(t.TempDir(), "first-run")
	importRelease(t, st, fmt.Sprintf(lostRelease, marker), "lost", "lost")
	link := &partition{}
	agent := st.StartAgent(t, nodeName("l1"), link.behind)
	bootstrapped(t, st, "l1")
	commitAll(t, st, "lost", "slow@l1", "after@l1")
	nrs := noderoles(t, st, "lost")
	slowID, afterID := nrs["slow@l1"].ID, nrs["after@l1"].ID
	assert.Equal(t, []int64{slowID}, nrs["after@l1"].Parents)

	// The first run is under way on the node: the script sleeps.
	slow := waitState(t, st, slowID, contract.NodeRoleTransition, 60*time.Second)
	require.Eventually(t, func() bool {
		_, err := os.Stat(marker)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the first run never started on the node")
	slow = getNodeRole(t, st, slowID)
	require.NotNil(t, slow.LastRun)
	assert.Equal(t, contract.RunRunning, slow.LastRun.State)
	assert.Equal(t, 1, slow.LastRun.Position, "run 1")

	// The node dies: off the network, then its agent stops (killing the
	// script) without being able to tell anyone.
	link.cut.Store(true)
	killed := time.Now()
	agent.Stop()
	slow = waitState(t, st, slowID, contract.NodeRoleError, 30*time.Second)
	took := time.Since(killed)
	t.Logf("noderole in error %s after the node died", took.Round(time.Millisecond))
	assert.Less(t, took, 20*time.Second, "failed by the heartbeat timeout (3s), not the run's timeout")
	require.NotNil(t, slow.LastRun)
	assert.Equal(t, contract.RunFailed, slow.LastRun.State)
	assert.Contains(t, slow.LastRun.Error, "no result from the node's agent")
	assert.Equal(t, 1, slow.RunCount)
	neverRan(t, st, afterID, contract.NodeRoleBlocked)

	// The node comes back: its agent with the credential it stored (a new
	// registration under the same name is refused), nothing else changed.
	back := st.StartAgent(t, nodeName("l1"), func(c *daemon.Config) {
		cred, err := os.ReadFile(filepath.Join(agent.WorkDir, daemon.CredentialFile))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(c.WorkDir, daemon.CredentialFile), cred, 0o600))
	})
	assert.Equal(t, agent.Token(t), back.Token(t))
	neverRan(t, st, afterID, contract.NodeRoleBlocked)

	var retried crowbar.NodeRole
	status, body := st.Do(t, http.MethodPost, fmt.Sprintf("/api/v1/noderoles/%d/retry", slowID), nil, &retried)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Contains(t, []string{contract.NodeRoleTodo, contract.NodeRoleTransition}, retried.State)

	waitActive(t, st, "lost", "slow@l1", "after@l1")
	slow = getNodeRole(t, st, slowID)
	after := getNodeRole(t, st, afterID)
	assert.Equal(t, 2, slow.RunCount)
	require.NotNil(t, slow.LastRun)
	assert.Equal(t, 2, slow.LastRun.Position, "the retry is run 2")
	assert.Equal(t, contract.RunSucceeded, slow.LastRun.State)
	assert.Equal(t, map[string]any{"slow": map[string]any{"ok": true}}, slow.Wall)
	assert.Equal(t, 1, after.RunCount, "the child ran once, after the retry")
	before(t, slow, after)
	assert.Equal(t, map[string]any{"ok": true}, dig(after.LastRun.AttrsIn, "slow"), "the child saw its parent's wall")
}

// goneRelease: first waits for the test's go-ahead (a file in the agent's
// work directory), then hands back {"done": true}; second requires it.
const goneRelease = `
name: gone
version: "1"
roles_metadata:
  first:
    script: |
      touch started
      for i in $(seq 300); do test -f go-ahead && break; sleep 0.1; done
      test -f go-ahead || { echo "no go-ahead" >&2; exit 1; }
      printf '{"done": true}' > "$ANNEAL_ATTRS_OUT"
  second:
    requires: [first]
    script: echo second
`

// TestAnnealerWorkerGoneMidRun: the worker going away while a noderole
// runs on its node loses nothing: the agent's result waits in Temporal, the
// noderole stays in transition, and a new worker finishes it (active, its
// wall stored, run once) and runs its child after it.
//
// Not parallel, as TestWorkerGoneMidRun: it stops and starts a worker.
func TestAnnealerWorkerGoneMidRun(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{HeartbeatTimeoutSec: 20})
	importRelease(t, st, goneRelease, "gone", "gone")
	agent := st.StartAgent(t, nodeName("g1"))
	bootstrapped(t, st, "g1")
	commitAll(t, st, "gone", "first@g1", "second@g1")
	nrs := noderoles(t, st, "gone")
	firstID, secondID := nrs["first@g1"].ID, nrs["second@g1"].ID

	waitState(t, st, firstID, contract.NodeRoleTransition, 60*time.Second)
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(agent.WorkDir, "started"))
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the run never started on the node")
	st.StopWorker()

	// The run finishes and is reported while no worker runs: the result is
	// stored, but nothing can finish the noderole.
	require.NoError(t, os.WriteFile(filepath.Join(agent.WorkDir, "go-ahead"), nil, 0o644))
	var first crowbar.NodeRole
	require.Eventually(t, func() bool {
		first = getNodeRole(t, st, firstID)
		return first.LastRun != nil && first.LastRun.State == contract.RunSucceeded
	}, 30*time.Second, 50*time.Millisecond, "the agent's result was not stored without a worker")
	assert.Equal(t, map[string]any{"done": true}, first.LastRun.AttrsOut)
	time.Sleep(time.Second)
	first = getNodeRole(t, st, firstID)
	assert.Equal(t, contract.NodeRoleTransition, first.State, "no worker, no finish")
	assert.Equal(t, 0, first.RunCount)
	neverRan(t, st, secondID, contract.NodeRoleBlocked)

	st.StartWorker(t)
	waitActive(t, st, "gone", "first@g1", "second@g1")
	first = getNodeRole(t, st, firstID)
	second := getNodeRole(t, st, secondID)
	assert.Equal(t, map[string]any{"done": true}, first.Wall, "the wall of the run reported while the worker was gone")
	assert.Equal(t, 1, first.RunCount, "not run again")
	require.NotNil(t, first.LastRun)
	assert.Equal(t, 1, first.LastRun.Position)
	assert.Equal(t, 1, second.RunCount)
	before(t, first, second)
	assert.Equal(t, true, dig(second.LastRun.AttrsIn, "done"), "the child saw the wall")
}

// bootRelease: two bootstrap roles (admin-api requires admin-base; by
// name it would come first), a discovery role, and a discovery role on a
// jig that is not active.
const bootRelease = `
name: boot
version: "1"
roles_metadata:
  admin-api:
    flags: [bootstrap]
    requires: [admin-base]
    script: sleep 0.2; echo api up
  admin-base:
    flags: [bootstrap]
    script: |
      sleep 0.2
      printf '{"admin": {"base": "ready"}}' > "$ANNEAL_ATTRS_OUT"
  discovered:
    flags: [discovery]
    script: echo discovered
  probe:
    flags: [discovery]
    jig: puppet
`

// TestAdminNodeBootstrap: an agent registering as an admin node gets the
// bootstrap roles, and only them, in the system deployment, bound in
// dependency order by its NodeBootstrap workflow, and the annealer runs
// them in that order; another node gets the discovery roles whose jig is
// active.
func TestAdminNodeBootstrap(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	importRelease(t, st, bootRelease, "", "")
	st.StartAgent(t, nodeName("admin"), func(c *daemon.Config) { c.Admin = true })
	st.StartAgent(t, nodeName("n1"))

	var node models.Node
	status, body := st.Do(t, http.MethodGet, "/api/v1/nodes/"+nodeName("admin"), nil, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.True(t, node.Admin)

	adminRes := bootstrapped(t, st, "admin")
	require.Equal(t, models.FlagBootstrap, adminRes.Flag)
	require.Equal(t, []string{"admin-base", "admin-api"}, adminRes.Roles, "dependency order")
	n1Res := bootstrapped(t, st, "n1")
	require.Equal(t, models.FlagDiscovery, n1Res.Flag)
	require.Equal(t, []string{"discovered"}, n1Res.Roles, "the discovery role on an inactive jig is left out")
	for _, short := range []string{"admin", "n1"} {
		desc, err := st.Temporal.DescribeWorkflowExecution(t.Context(), bootstrapID(t, st, short), "")
		require.NoError(t, err)
		assert.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus(), short)
		assert.Equal(t, contract.NodeBootstrapWorkflow, desc.GetWorkflowExecutionInfo().GetType().GetName())
	}

	nrs := waitActive(t, st, models.SystemDeployment, "admin-base@admin", "admin-api@admin", "discovered@n1")
	assert.ElementsMatch(t, []string{"admin-base@admin", "admin-api@admin", "discovered@n1"}, keys(nrs),
		"the admin node has no discovery role, the other no bootstrap role")
	base := getNodeRole(t, st, nrs["admin-base@admin"].ID)
	api := getNodeRole(t, st, nrs["admin-api@admin"].ID)
	assert.Equal(t, []int64{base.ID, api.ID}, adminRes.NodeRoles)
	assert.Less(t, base.ID, api.ID, "bound in dependency order")
	assert.Equal(t, []int64{base.ID}, api.Parents, "admin-api's parent is admin-base on the same node")
	assert.Equal(t, []int64{nrs["discovered@n1"].ID}, n1Res.NodeRoles)
	before(t, base, api)
	assert.Equal(t, "ready", dig(api.LastRun.AttrsIn, "admin", "base"), "admin-api saw admin-base's wall")
	for _, nr := range []crowbar.NodeRole{base, api} {
		assert.Equal(t, 1, nr.RunCount, nr.RoleName)
	}
}

// skipRelease has one role with a quick script.
const skipRelease = `
name: skip
version: "1"
roles_metadata:
  work:
    script: echo work on $ANNEAL_NODE
`

// TestAnnealerSkipsNodesNotAliveOrUnavailable: the annealer gives nothing
// to a node that is not available or not alive, while it runs the same
// role on another node; making the node available, or its agent's
// heartbeat bringing it back alive, wakes the annealer, which then runs it.
func TestAnnealerSkipsNodesNotAliveOrUnavailable(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	importRelease(t, st, skipRelease, "skip", "skip")
	link := &partition{}
	st.StartAgent(t, nodeName("s1"))
	st.StartAgent(t, nodeName("s2"))
	st.StartAgent(t, nodeName("s3"), link.behind)
	for _, n := range []string{"s1", "s2", "s3"} {
		bootstrapped(t, st, n)
	}

	// s1 is not available; s3 falls silent and, as the server's liveness
	// watcher would after 30 s, is marked not alive.
	var node models.Node
	status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("s1"), map[string]any{"available": false}, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.False(t, node.Available)
	link.cut.Store(true)
	require.Eventually(t, func() bool {
		n, err := st.Store.Node(t.Context(), nodeName("s3"))
		require.NoError(t, err)
		return n.LastSeenAt != nil && time.Since(*n.LastSeenAt) > 2*time.Second
	}, 30*time.Second, 100*time.Millisecond, "s3 is not silent")
	require.NoError(t, st.Store.DB.Exec("UPDATE nodes SET alive = false WHERE name = ?", nodeName("s3")).Error)

	// The commit provisions s2 (the others are left out too); its end
	// wakes the annealer, so it must be over before the waiting starts.
	if deployChanges := commitAll(t, st, "skip", "work@s1", "work@s2", "work@s3"); deployChanges != "" {
		waitDone(t, st, deployChanges, 60*time.Second)
	}
	nrs := waitActive(t, st, "skip", "work@s2")
	// Every kick so far (the commit, s2's run, the provisioning) has been
	// served, and the two others were passed over.
	time.Sleep(2 * time.Second)
	neverRan(t, st, nrs["work@s1"].ID, contract.NodeRoleTodo)
	neverRan(t, st, nrs["work@s3"].ID, contract.NodeRoleTodo)

	// Available again: the PATCH wakes the annealer (nothing else would
	// for 5 minutes).
	status, body = st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName("s1"), map[string]any{"available": true}, &node)
	require.Equal(t, http.StatusOK, status, "%s", body)
	waitState(t, st, nrs["work@s1"].ID, contract.NodeRoleActive, 30*time.Second)
	// s1's finish woke the annealer too; s3 is still passed over.
	time.Sleep(2 * time.Second)
	neverRan(t, st, nrs["work@s3"].ID, contract.NodeRoleTodo)
	s3, err := st.Store.Node(t.Context(), nodeName("s3"))
	require.NoError(t, err)
	require.False(t, s3.Alive)

	// s3 back on the network: its next heartbeat (every second in tests)
	// makes it alive and wakes the annealer.
	link.cut.Store(false)
	waitState(t, st, nrs["work@s3"].ID, contract.NodeRoleActive, 30*time.Second)
	s3, err = st.Store.Node(t.Context(), nodeName("s3"))
	require.NoError(t, err)
	assert.True(t, s3.Alive)
	for _, k := range []string{"work@s1", "work@s2", "work@s3"} {
		nr := getNodeRole(t, st, nrs[k].ID)
		assert.Equal(t, 1, nr.RunCount, k)
		assert.Contains(t, nr.LastRun.StdoutTail, "work on "+nr.NodeName, k)
	}
}
