// Package storetest gives the stores' tests a fresh migrated database and
// every store over it (the kernel's and each seed's, on one value, as the
// API server holds them), plus a small release in Fuel's shape and a
// deployment fixture. Only tests import it.
package storetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey"
	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// The seeds' stores under names of their own, so that Stores can embed
// them all (each is a type named Store).
type (
	// Fuel is fuel.Store.
	Fuel = fuel.Store
	// Crowbar is crowbar.Store.
	Crowbar = crowbar.Store
	// Heat is heat.Store.
	Heat = heat.Store
	// Audrey is audrey.Store.
	Audrey = audrey.Store
)

// Stores is every store over one database: a method of the kernel or of
// any seed is called on it directly.
type Stores struct {
	*models.Store
	*Fuel
	*Crowbar
	*Heat
	*Audrey
}

// Wrap puts every seed's store over the kernel store s.
func Wrap(s *models.Store) *Stores {
	return &Stores{Store: s, Fuel: fuel.New(s), Crowbar: crowbar.New(s), Heat: heat.New(s), Audrey: audrey.New(s)}
}

// Open is a fresh, migrated database (see testenv.Store) with every store
// over it, and its URL.
func Open(t *testing.T) (*Stores, string) {
	t.Helper()
	s, url := testenv.Store(t)
	return Wrap(s), url
}

// New is Open for a test that runs in parallel with the others.
func New(t *testing.T) (*Stores, context.Context) {
	t.Helper()
	t.Parallel()
	s, _ := Open(t)
	return s, context.Background()
}

// ReleaseYAML is a small release in Fuel's shape: a controller that brings
// the api and db tags, a compute that requires it, and two graphs. On a
// controller and a compute node the deployment graph plans
//
//	setup@ctl -> db@ctl, setup@cmp -> nova@cmp, db@ctl -> nova@cmp
const ReleaseYAML = `
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
	CtlName = "ctl.anneal.test"
	CmpName = "cmp.anneal.test"
)

// ReleaseSpec is ReleaseYAML parsed.
func ReleaseSpec(t *testing.T) models.ReleaseSpec {
	t.Helper()
	var spec models.ReleaseSpec
	require.NoError(t, yaml.Unmarshal([]byte(ReleaseYAML), &spec))
	return spec
}

// Fixture is a deployment "prod" of the release with two alive nodes: Ctl
// (role controller) and Cmp (role compute).
type Fixture struct {
	Store    *Stores
	Ctx      context.Context
	Release  *models.Release
	Dep      *models.Deployment
	Ctl, Cmp *models.Node
}

// NewFixture builds the fixture on a fresh database (in parallel).
func NewFixture(t *testing.T) *Fixture {
	t.Helper()
	store, ctx := New(t)
	f := &Fixture{Store: store, Ctx: ctx}
	var err error
	f.Release, err = store.ImportRelease(ctx, ReleaseSpec(t))
	require.NoError(t, err)
	f.Dep, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "prod", Release: "openstack@1.0"})
	require.NoError(t, err)
	f.Ctl = f.AddNode(t, CtlName, "controller")
	f.Cmp = f.AddNode(t, CmpName, "compute")
	return f
}

// AddNode registers an alive node (with an agent credential) and moves it
// into the fixture's deployment with the given roles.
func (f *Fixture) AddNode(t *testing.T, name string, roles ...string) *models.Node {
	t.Helper()
	_, _, err := f.Store.CreateNode(f.Ctx, models.NodeInput{Name: name}, true)
	require.NoError(t, err)
	dep := f.Dep.Name
	node, err := f.Store.UpdateNode(f.Ctx, name, models.NodeUpdate{Deployment: &dep, Roles: &roles})
	require.NoError(t, err)
	return node
}

// Execute creates a transaction on the fixture's deployment.
func (f *Fixture) Execute(t *testing.T, in fuel.ExecuteInput) *fuel.Transaction {
	t.Helper()
	if in.Deployment == "" {
		in.Deployment = f.Dep.Name
	}
	if in.Graphs == nil {
		in.Graphs = []fuel.GraphRequest{{Type: "deployment"}}
	}
	txn, err := f.Store.CreateTransaction(f.Ctx, in, func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	return txn
}

// Plan creates a deployment transaction and plans its graph.
func (f *Fixture) Plan(t *testing.T) (*fuel.Transaction, *contract.GraphPlan) {
	t.Helper()
	txn := f.Execute(t, fuel.ExecuteInput{Force: true}) // independent of earlier runs (LCM)
	gp, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	return txn, gp
}

// RunsByLabel loads a transaction's runs keyed by "task@node".
func (f *Fixture) RunsByLabel(t *testing.T, txn *fuel.Transaction) map[string]models.TaskRun {
	t.Helper()
	runs, err := f.Store.Runs(f.Ctx, txn.ID, fuel.RunFilter{})
	require.NoError(t, err)
	out := map[string]models.TaskRun{}
	for _, r := range runs {
		out[r.TaskName+"@"+r.NodeName] = r
	}
	return out
}

// Count counts rows of a model's table, optionally filtered.
func Count(t *testing.T, store *Stores, model any, where ...any) int64 {
	t.Helper()
	var n int64
	q := store.DB.Model(model)
	if len(where) > 0 {
		q = q.Where(where[0], where[1:]...)
	}
	require.NoError(t, q.Count(&n).Error)
	return n
}

// RequireInput asserts err is an *models.InputError on field.
func RequireInput(t *testing.T, err error, field string) *models.InputError {
	t.Helper()
	var ie *models.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, field, ie.Field, "reason: %s", ie.Reason)
	return ie
}

// RequireConflict asserts err is a *models.ConflictError.
func RequireConflict(t *testing.T, err error) *models.ConflictError {
	t.Helper()
	var ce *models.ConflictError
	require.ErrorAs(t, err, &ce)
	return ce
}

// Listen opens a connection to the database at url that listens on a
// NOTIFY channel, closed when the test ends.
func Listen(t *testing.T, url, channel string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)
	return conn
}

// ExplainGeneric returns the lines of explain (EXPLAIN with its options)
// for the generic plan Postgres makes of sql, whose placeholders $1.. have
// the types params (such as "(bigint, int)"), executed with args (literals:
// EXPLAIN takes no parameters, such as "(1, 2)"). It runs on one
// connection with settings (SET statements) first, and leaves it as it
// found it: the plan a statement run through queryGenericPlan, or cached
// by the driver after a few runs, gets.
func ExplainGeneric(t *testing.T, db *gorm.DB, explain, sql, params, args string, settings ...string) []string {
	t.Helper()
	var plan []string
	err := db.Connection(func(tx *gorm.DB) error {
		defer tx.Exec("RESET ALL")
		for _, stmt := range append(settings, "SET plan_cache_mode = force_generic_plan", "PREPARE explained"+params+" AS "+sql) {
			if err := tx.Exec(stmt).Error; err != nil {
				return err
			}
		}
		defer tx.Exec("DEALLOCATE explained")
		return tx.Raw(explain + " EXECUTE explained" + args).Scan(&plan).Error
	})
	require.NoError(t, err)
	return plan
}
