package models_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// releaseYAML is a small release in Fuel's shape: a controller that brings
// the api and db tags, a compute that requires it, and two graphs. On a
// controller and a compute node the deployment graph plans
//
//	setup@ctl -> db@ctl, setup@cmp -> nova@cmp, db@ctl -> nova@cmp
const releaseYAML = `
name: openstack
version: "1.0"
roles_metadata:
  controller:
    name: Controller
    tags: [api, db]
    template: {port: 5000}
  compute:
    name: Compute
    requires: [controller]
    tags: [hypervisor]
tags_metadata:
  db: {name: db, has_primary: true}
graphs:
  deployment:
    name: deploy
    metadata: {on_success: {status: deployed}, owner: release}
    tasks:
      - id: setup
        tags: [controller, compute]
        parameters: {cmd: "echo setup", timeout: 30, retries: 2}
      - id: db
        tags: [db]
        requires: [setup]
        parameters: {cmd: "echo db"}
      - id: nova
        tags: [hypervisor]
        requires: [setup]
        cross_depends:
          - name: db
        parameters: {cmd: "echo nova"}
  provision:
    tasks:
      - id: image
        type: noop
        role: "*"
`

// Node names of the fixture; "cmp" sorts before "ctl".
const (
	ctlName = "ctl.anneal.test"
	cmpName = "cmp.anneal.test"
)

func releaseSpec(t *testing.T) models.ReleaseSpec {
	t.Helper()
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(releaseYAML), &spec))
	return spec
}

// newStore is a fresh, migrated database; integration tests run in parallel.
func newStore(t *testing.T) (*models.Store, context.Context) {
	t.Helper()
	t.Parallel()
	store, _ := testenv.Store(t)
	return store, context.Background()
}

// fixture is a deployment "prod" of the release with two alive nodes: ctl
// (role controller) and cmp (role compute).
type fixture struct {
	store    *models.Store
	ctx      context.Context
	release  *models.Release
	dep      *models.Deployment
	ctl, cmp *models.Node
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	store, ctx := newStore(t)
	f := &fixture{store: store, ctx: ctx}
	var err error
	f.release, err = store.ImportRelease(ctx, releaseSpec(t))
	require.NoError(t, err)
	f.dep, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: "openstack@1.0"})
	require.NoError(t, err)
	f.ctl = f.addNode(t, ctlName, "controller")
	f.cmp = f.addNode(t, cmpName, "compute")
	return f
}

// addNode registers an alive node (with an agent credential) and moves it
// into the fixture's deployment with the given roles.
func (f *fixture) addNode(t *testing.T, name string, roles ...string) *models.Node {
	t.Helper()
	_, _, err := f.store.CreateNode(f.ctx, models.NodeInput{Name: name}, true)
	require.NoError(t, err)
	dep := f.dep.Name
	node, err := f.store.UpdateNode(f.ctx, name, models.NodeUpdate{Deployment: &dep, Roles: &roles})
	require.NoError(t, err)
	return node
}

// execute creates a transaction on the fixture's deployment.
func (f *fixture) execute(t *testing.T, in fuel.ExecuteInput) *fuel.Transaction {
	t.Helper()
	if in.Deployment == "" {
		in.Deployment = f.dep.Name
	}
	if in.Graphs == nil {
		in.Graphs = []fuel.GraphRequest{{Type: "deployment"}}
	}
	txn, err := f.store.CreateTransaction(f.ctx, in, func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	return txn
}

// plan creates a deployment transaction and plans its graph.
func (f *fixture) plan(t *testing.T) (*fuel.Transaction, *contract.GraphPlan) {
	t.Helper()
	txn := f.execute(t, fuel.ExecuteInput{Force: true}) // independent of earlier runs (LCM)
	gp, err := f.store.PlanGraph(f.ctx, txn.ID, 0)
	require.NoError(t, err)
	return txn, gp
}

// runsByLabel loads a transaction's runs keyed by "task@node".
func (f *fixture) runsByLabel(t *testing.T, txn *fuel.Transaction) map[string]models.TaskRun {
	t.Helper()
	runs, err := f.store.Runs(f.ctx, txn.ID, fuel.RunFilter{})
	require.NoError(t, err)
	out := map[string]models.TaskRun{}
	for _, r := range runs {
		out[r.TaskName+"@"+r.NodeName] = r
	}
	return out
}

// count counts rows of a model's table, optionally filtered.
func count(t *testing.T, store *models.Store, model any, where ...any) int64 {
	t.Helper()
	var n int64
	q := store.DB.Model(model)
	if len(where) > 0 {
		q = q.Where(where[0], where[1:]...)
	}
	require.NoError(t, q.Count(&n).Error)
	return n
}

// requireInput asserts err is an *models.InputError on field.
func requireInput(t *testing.T, err error, field string) *models.InputError {
	t.Helper()
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, field, ie.Field, "reason: %s", ie.Reason)
	return ie
}

// requireConflict asserts err is a *models.ConflictError.
func requireConflict(t *testing.T, err error) *models.ConflictError {
	t.Helper()
	var ce *models.ConflictError
	require.ErrorAs(t, err, &ce)
	return ce
}
