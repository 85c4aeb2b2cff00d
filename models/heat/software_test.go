package heat_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

func noStart(*heat.SoftwareDeployment) error { return nil }

// Every change of a node's software deployments wakes its agent's software
// long poll ("s:<node id>" on the work channel), which looks at the
// database again only when woken: a deployment created, given a new round,
// or removed.
func TestSoftwareChangesWakeTheNode(t *testing.T) {
	store, url := storetest.Open(t)
	ctx := context.Background()
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "wake.anneal.test"}, true)
	require.NoError(t, err)
	cfg, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{Name: "c", Config: "true"})
	require.NoError(t, err)
	conn := storetest.Listen(t, url, models.WorkChannel)
	woken := func(what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err, "no wake-up after %s", what)
		assert.Equal(t, fmt.Sprintf("%s:%d", models.WakeSoftware, node.ID), n.Payload, what)
	}

	d, err := store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{ConfigID: cfg.ID, Server: node.Name}, noStart)
	require.NoError(t, err)
	woken("a deployment created")
	_, _, err = store.StartSoftwareDelete(ctx, d.ID, 0, noStart)
	require.NoError(t, err)
	woken("a new round")
	require.NoError(t, store.DB.Exec("DELETE FROM software_deployments WHERE id = ?", d.ID).Error)
	woken("a deployment removed")
}

// A round goes WAITING → IN_PROGRESS (references resolved, defaults
// filled) → COMPLETE with the signalled outputs; a repeated signal changes
// nothing; a deployment referencing an unfinished one waits for it.
func TestSoftwareRoundLifecycle(t *testing.T) {
	store, _ := storetest.Open(t)
	ctx := context.Background()
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "s1.anneal.test"}, true)
	require.NoError(t, err)
	cfg, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{
		Name: "c", Config: "true",
		Inputs:  []heat.SoftwareIODef{{Name: "a", Default: "dflt"}, {Name: "b", Type: "Number"}},
		Outputs: []heat.SoftwareIODef{{Name: "out"}, {Name: "err", ErrorOutput: true}},
	})
	require.NoError(t, err)
	assert.Equal(t, "script", cfg.Group)
	assert.Equal(t, "Number", cfg.Inputs[1].Type)
	assert.Equal(t, []string{"err"}, cfg.ErrorOutputs())

	first, err := store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{
		ConfigID: cfg.ID, Server: node.Name, InputValues: map[string]any{"b": 2.0},
	}, noStart)
	require.NoError(t, err)
	assert.Equal(t, contract.SoftwareWaiting, first.Status)
	assert.Equal(t, contract.ActionDeploy, first.Action)
	assert.Equal(t, heat.DefaultSoftwareTimeoutSec, first.TimeoutSec)

	second, err := store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{
		ConfigID: cfg.ID, Server: node.Name, InputValues: map[string]any{"a": map[string]any{"get_attr": []any{float64(first.ID), "out"}}},
	}, noStart)
	require.NoError(t, err)
	_, err = store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{
		ConfigID: cfg.ID, Server: node.Name, InputValues: map[string]any{"a": map[string]any{"get_attr": []any{float64(first.ID), "nope"}}},
	}, noStart)
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "input_values.a", ie.Field)

	p, err := store.PrepareSoftwareRound(ctx, second.ID, 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{first.ID}, p.WaitingFor)
	assert.False(t, p.Ready)

	p, err = store.PrepareSoftwareRound(ctx, first.ID, 1)
	require.NoError(t, err)
	assert.True(t, p.Ready)
	got, err := store.SoftwareDeployment(ctx, first.ID)
	require.NoError(t, err)
	assert.Equal(t, contract.SoftwareInProgress, got.Status)
	assert.Equal(t, map[string]any{"a": "dflt", "b": 2.0}, got.ResolvedInputs)
	pending, err := store.AgentSoftwareDeployments(ctx, node.ID)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	v1, err := store.AgentSoftwareVersion(ctx, node.ID)
	require.NoError(t, err)

	_, err = store.RecordSoftwareSignal(ctx, node.ID+1, first.ID, protocol.SoftwareSignal{})
	assert.True(t, errors.Is(err, models.ErrForbidden))
	rec, err := store.RecordSoftwareSignal(ctx, node.ID, first.ID, protocol.SoftwareSignal{Outputs: map[string]any{"out": "42", "err": ""}, Stdout: "hi"})
	require.NoError(t, err)
	assert.True(t, rec.Fresh)
	assert.Equal(t, map[string]string{"out": contract.Redacted}, rec.Summary.Present, "empty values are not present; values never go to the workflow")
	rec, err = store.RecordSoftwareSignal(ctx, node.ID, first.ID, protocol.SoftwareSignal{Outputs: map[string]any{"out": "other"}})
	require.NoError(t, err)
	assert.False(t, rec.Fresh)
	pending, err = store.AgentSoftwareDeployments(ctx, node.ID)
	require.NoError(t, err)
	assert.Empty(t, pending, "a signalled round is not handed out again")

	changed, err := store.FinishSoftwareRound(ctx, first.ID, 1, contract.SoftwareComplete, "")
	require.NoError(t, err)
	assert.True(t, changed)
	changed, err = store.FinishSoftwareRound(ctx, first.ID, 1, contract.SoftwareFailed, "late")
	require.NoError(t, err)
	assert.False(t, changed)
	got, err = store.SoftwareDeployment(ctx, first.ID)
	require.NoError(t, err)
	assert.Equal(t, contract.SoftwareComplete, got.Status)
	assert.Equal(t, "42", got.OutputValues["out"])
	assert.Equal(t, "hi", got.OutputValues["deploy_stdout"])
	v2, err := store.AgentSoftwareVersion(ctx, node.ID)
	require.NoError(t, err)
	assert.Greater(t, v2, v1)

	p, err = store.PrepareSoftwareRound(ctx, second.ID, 1)
	require.NoError(t, err)
	assert.True(t, p.Ready)
	got, err = store.SoftwareDeployment(ctx, second.ID)
	require.NoError(t, err)
	assert.Equal(t, "42", got.ResolvedInputs["a"])

	// Actions are matched exactly, as documented: "undeploy" is not UNDEPLOY.
	_, err = store.UpdateSoftwareDeployment(ctx, first.ID, heat.SoftwareDeploymentUpdate{Action: "undeploy"}, noStart)
	ie = nil
	require.True(t, errors.As(err, &ie), "%v", err)
	assert.Equal(t, "action", ie.Field)

	// A new round; the old round's signals are refused.
	up, err := store.UpdateSoftwareDeployment(ctx, first.ID, heat.SoftwareDeploymentUpdate{Action: "UNDEPLOY"}, noStart)
	require.NoError(t, err)
	assert.Equal(t, 2, up.Round)
	assert.Equal(t, contract.ActionUndeploy, up.Action)
	_, err = store.RecordSoftwareSignal(ctx, node.ID, first.ID, protocol.SoftwareSignal{Round: 1})
	var ce *models.ConflictError
	assert.ErrorAs(t, err, &ce)
	p, err = store.PrepareSoftwareRound(ctx, first.ID, 1)
	require.NoError(t, err)
	assert.True(t, p.Stale)

	// A config in use cannot be deleted; an unused one can.
	assert.ErrorAs(t, store.DeleteSoftwareConfig(ctx, cfg.ID), &ce)
	unused, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{Name: "unused"})
	require.NoError(t, err)
	require.NoError(t, store.DeleteSoftwareConfig(ctx, unused.ID))
}

// The deployments-by-server index reads deployments and configs in one
// query.
func TestSoftwareIndexOneQuery(t *testing.T) {
	store, _ := storetest.Open(t)
	ctx := context.Background()
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "s2.anneal.test"}, false)
	require.NoError(t, err)
	for _, name := range []string{"one", "two", "three"} {
		cfg, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{Name: name, Group: "ansible", Config: name})
		require.NoError(t, err)
		_, err = store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{ConfigID: cfg.ID, Server: node.Name}, noStart)
		require.NoError(t, err)
	}
	var queries atomic.Int64
	count := func(db *gorm.DB) { queries.Add(1) }
	require.NoError(t, store.DB.Callback().Query().After("gorm:query").Register("test:count", count))
	require.NoError(t, store.DB.Callback().Row().After("gorm:row").Register("test:count_row", count))
	require.NoError(t, store.DB.Callback().Raw().After("gorm:raw").Register("test:count_raw", count))
	for _, ref := range []string{node.Name, "1"} {
		queries.Store(0)
		ds, err := store.ServerSoftwareDeployments(ctx, ref)
		require.NoError(t, err)
		require.Len(t, ds, 3)
		assert.Equal(t, "two", ds[1].Config.Name)
		assert.Equal(t, "ansible", ds[1].Config.Group)
		assert.Equal(t, "two", ds[1].Config.Config)
		assert.Equal(t, node.Name, ds[1].ServerName)
		assert.EqualValues(t, 1, queries.Load(), "index of %s", ref)
	}
	_, err = store.ServerSoftwareDeployments(ctx, "nobody.anneal.test")
	assert.True(t, errors.Is(err, models.ErrNotFound))
}

// Validation names the field; the deployment policy refuses a node of
// another deployment unless it accepts foreign configs.
func TestSoftwarePolicy(t *testing.T) {
	store, _ := storetest.Open(t)
	ctx := context.Background()
	_, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{Name: "x", Inputs: []heat.SoftwareIODef{{Name: "a"}, {Name: "a"}}})
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "inputs[1].name", ie.Field)

	for _, name := range []string{"red", "blue"} {
		_, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: name})
		require.NoError(t, err)
	}
	node, _, err := store.CreateNode(ctx, models.NodeInput{Name: "r1.anneal.test", Deployment: "red"}, false)
	require.NoError(t, err)
	blue, err := store.CreateSoftwareConfig(ctx, heat.SoftwareConfigInput{Name: "b", Deployment: "blue"})
	require.NoError(t, err)
	_, err = store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{ConfigID: blue.ID, Server: node.Name}, noStart)
	require.True(t, errors.Is(err, models.ErrForbidden), "%v", err)
	assert.True(t, strings.Contains(err.Error(), `"red"`) && strings.Contains(err.Error(), `"blue"`), err.Error())

	_, err = store.SetAcceptForeignConfigs(ctx, node.Name, true)
	require.NoError(t, err)
	d, err := store.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{ConfigID: blue.ID, Server: node.Name}, noStart)
	require.NoError(t, err)
	assert.NotNil(t, d.DeploymentID)
}
