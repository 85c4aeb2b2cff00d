package workflows_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// softwareFake answers the software activities: prepares returns the
// successive answers of PrepareSoftwareRound, ends records
// FinishSoftwareRound.
type softwareFake struct {
	mu       sync.Mutex
	prepares []contract.SoftwarePrepared
	calls    int
	ends     []contract.SoftwareEnd
}

func newSoftwareEnv(t *testing.T, f *softwareFake) *testsuite.TestWorkflowEnvironment {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	workflows.Register(env)
	a := &activities.Activities{}
	env.OnActivity(a.PrepareSoftwareRound, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.SoftwareRound) (*contract.SoftwarePrepared, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			p := f.prepares[min(f.calls, len(f.prepares)-1)]
			f.calls++
			return &p, nil
		})
	env.OnActivity(a.FinishSoftwareRound, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.SoftwareEnd) (bool, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ends = append(f.ends, in)
			return true, nil
		})
	t.Cleanup(func() { env.AssertExpectations(t) })
	return env
}

var readyRound = contract.SoftwarePrepared{Ready: true, Status: contract.SoftwareInProgress, TimeoutSec: 600,
	ErrorOutputs: []string{"err"}, Node: "n1"}

func runSoftware(t *testing.T, env *testsuite.TestWorkflowEnvironment) contract.SoftwareResult {
	env.ExecuteWorkflow(contract.SoftwareDeploymentWorkflow, contract.SoftwareInput{DeploymentID: 7, Round: 2, Action: "DEPLOY"})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res contract.SoftwareResult
	require.NoError(t, env.GetWorkflowResult(&res))
	return res
}

// The agent's signal completes the round; a signal of another round is
// ignored, and later signals change nothing.
func TestSoftwareSignalCompletes(t *testing.T) {
	f := &softwareFake{prepares: []contract.SoftwarePrepared{readyRound}}
	env := newSoftwareEnv(t, f)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 1, StatusCode: 5})
	}, time.Minute)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 2, Present: map[string]string{"v": "x"}})
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 2, StatusCode: 1})
	}, 2*time.Minute)
	res := runSoftware(t, env)
	assert.Equal(t, contract.SoftwareComplete, res.Status)
	require.Len(t, f.ends, 1)
	assert.Equal(t, contract.SoftwareEnd{SoftwareRound: contract.SoftwareRound{DeploymentID: 7, Round: 2}, Status: contract.SoftwareComplete}, f.ends[0])
}

// No signal within the timeout fails the round.
func TestSoftwareTimeoutFails(t *testing.T) {
	p := readyRound
	p.TimeoutSec = 30
	f := &softwareFake{prepares: []contract.SoftwarePrepared{p}}
	env := newSoftwareEnv(t, f)
	res := runSoftware(t, env)
	assert.Equal(t, contract.SoftwareFailed, res.Status)
	assert.Contains(t, res.Reason, "timed out after 30s")
	require.Len(t, f.ends, 1)
	assert.Equal(t, contract.SoftwareFailed, f.ends[0].Status)
}

// A value for an error output fails the round, naming the output; so does
// a non-zero status code.
func TestSoftwareErrorOutputFails(t *testing.T) {
	f := &softwareFake{prepares: []contract.SoftwarePrepared{readyRound}}
	env := newSoftwareEnv(t, f)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 2, Present: map[string]string{"err": "disk full", "ok": "1"}})
	}, time.Second)
	res := runSoftware(t, env)
	assert.Equal(t, contract.SoftwareFailed, res.Status)
	assert.Contains(t, res.Reason, `err="disk full"`)

	// A summary of today names the output only: its value is not sent.
	status, reason := workflows.EvaluateSoftwareSignal([]string{"err"}, contract.SoftwareSignalSummary{Present: map[string]string{"err": contract.Redacted, "ok": contract.Redacted}})
	assert.Equal(t, contract.SoftwareFailed, status)
	assert.Equal(t, "error output signalled: err", reason)

	status, reason = workflows.EvaluateSoftwareSignal(nil, contract.SoftwareSignalSummary{StatusCode: 127, StatusReason: `unknown group "puppet"`})
	assert.Equal(t, contract.SoftwareFailed, status)
	assert.Equal(t, `deploy_status_code 127: unknown group "puppet"`, reason)
}

// A round whose inputs reference an unfinished deployment waits for it,
// polling, and starts once it is COMPLETE; a reference that FAILED fails it.
func TestSoftwareWaitsForReferences(t *testing.T) {
	waiting := contract.SoftwarePrepared{Status: contract.SoftwareWaiting, TimeoutSec: 600, WaitingFor: []int64{3}}
	f := &softwareFake{prepares: []contract.SoftwarePrepared{waiting, waiting, readyRound}}
	env := newSoftwareEnv(t, f)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 2})
	}, time.Minute)
	res := runSoftware(t, env)
	assert.Equal(t, contract.SoftwareComplete, res.Status)
	assert.Equal(t, 3, f.calls)

	f = &softwareFake{prepares: []contract.SoftwarePrepared{{Failed: "input who: get_attr refers to software deployment 3, which FAILED"}}}
	env = newSoftwareEnv(t, f)
	res = runSoftware(t, env)
	assert.Equal(t, contract.SoftwareFailed, res.Status)
	assert.Contains(t, res.Reason, "deployment 3")

	waiting.TimeoutSec = 10
	f = &softwareFake{prepares: []contract.SoftwarePrepared{waiting}}
	env = newSoftwareEnv(t, f)
	res = runSoftware(t, env)
	assert.Equal(t, contract.SoftwareFailed, res.Status)
	assert.Contains(t, res.Reason, "waiting for software deployment(s) 3")
}

// deleteFake answers the activities of a delete's UNDEPLOY round: it
// records both FinishSoftwareRound and RemoveSoftwareDeployment, whichever
// the workflow calls.
func newDeleteEnv(f *softwareFake, removals *[]contract.SoftwareRemoval) *testsuite.TestWorkflowEnvironment {
	var ts testsuite.WorkflowTestSuite
	env := loadedEnv(&ts)
	workflows.Register(env)
	a := &activities.Activities{}
	env.OnActivity(a.PrepareSoftwareRound, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.SoftwareRound) (*contract.SoftwarePrepared, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			p := f.prepares[min(f.calls, len(f.prepares)-1)]
			f.calls++
			return &p, nil
		})
	env.OnActivity(a.FinishSoftwareRound, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.SoftwareEnd) (bool, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ends = append(f.ends, in)
			return true, nil
		}).Maybe()
	env.OnActivity(a.RemoveSoftwareDeployment, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in contract.SoftwareRemoval) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			*removals = append(*removals, in)
			return nil
		}).Maybe()
	return env
}

func runDelete(t *testing.T, env *testsuite.TestWorkflowEnvironment) contract.SoftwareResult {
	env.ExecuteWorkflow(contract.SoftwareDeploymentWorkflow, contract.SoftwareInput{DeploymentID: 7, Round: 3, Action: contract.ActionUndeploy, Delete: true})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res contract.SoftwareResult
	require.NoError(t, env.GetWorkflowResult(&res))
	return res
}

// A delete's UNDEPLOY round removes the deployment once the agent signals
// success, or once the round times out (saying so); a failed UNDEPLOY keeps
// it, FAILED, with a reason that says how to go on.
func TestSoftwareDeleteRemovesAfterUndeploy(t *testing.T) {
	var removals []contract.SoftwareRemoval
	f := &softwareFake{prepares: []contract.SoftwarePrepared{readyRound}}
	env := newDeleteEnv(f, &removals)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 3})
	}, time.Minute)
	res := runDelete(t, env)
	assert.Equal(t, "DELETED", res.Status)
	require.Len(t, removals, 1)
	assert.Equal(t, contract.SoftwareRound{DeploymentID: 7, Round: 3}, removals[0].SoftwareRound)
	assert.False(t, removals[0].TimedOut)
	assert.Empty(t, f.ends, "a removed deployment has no end to record")

	// No signal: removed anyway at the timeout.
	removals = nil
	p := readyRound
	p.TimeoutSec = 30
	f = &softwareFake{prepares: []contract.SoftwarePrepared{p}}
	env = newDeleteEnv(f, &removals)
	res = runDelete(t, env)
	assert.Equal(t, "DELETED", res.Status)
	require.Len(t, removals, 1)
	assert.True(t, removals[0].TimedOut)
	assert.Contains(t, removals[0].Reason, "timed out after 30s")

	// A failed UNDEPLOY keeps the deployment, FAILED.
	removals = nil
	f = &softwareFake{prepares: []contract.SoftwarePrepared{readyRound}}
	env = newDeleteEnv(f, &removals)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(contract.SignalSoftware, contract.SoftwareSignalSummary{Round: 3, StatusCode: 2})
	}, time.Second)
	res = runDelete(t, env)
	assert.Equal(t, contract.SoftwareFailed, res.Status)
	assert.Empty(t, removals)
	require.Len(t, f.ends, 1)
	assert.Contains(t, f.ends[0].Reason, "UNDEPLOY failed")
	assert.Contains(t, f.ends[0].Reason, "force=true")
}
