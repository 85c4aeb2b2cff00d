package fuel_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/storetest"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// outcome is how a simulated agent ends a run.
type outcome struct {
	exit    int
	outputs map[string]string
}

// deploy runs graph 0 of a new transaction as its workflow would, without
// Temporal: it plans it, then in plan order hands each pending run whose
// parents ended well to DispatchRun (which may skip it), reports it with
// outcomes[label] (success without outputs by default), and leaves runs
// under a failure pending. It returns the runs by label as planned and as
// they ended.
func deploy(t *testing.T, f *storetest.Fixture, in fuel.ExecuteInput, outcomes map[string]outcome) (planned, ended map[string]models.TaskRun) {
	t.Helper()
	txn := f.Execute(t, in)
	_, err := f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	planned = f.RunsByLabel(t, txn)
	byPos := make([]models.TaskRun, 0, len(planned))
	for _, r := range planned {
		byPos = append(byPos, r)
	}
	slices.SortFunc(byPos, func(a, b models.TaskRun) int { return a.Position - b.Position })
	var edges []models.RunEdge
	require.NoError(t, f.Store.DB.Raw(`SELECT e.* FROM run_edges e JOIN task_runs r ON r.id = e.child_id
		WHERE r.transaction_id = ?`, txn.ID).Scan(&edges).Error)
	state := map[int64]string{}
	for _, r := range byPos {
		state[r.ID] = r.State
	}
	for _, r := range byPos {
		if r.State != contract.RunPending {
			continue
		}
		ready := true
		for _, e := range edges {
			if e.ChildID == r.ID && state[e.ParentID] != contract.RunSucceeded && state[e.ParentID] != contract.RunSkipped {
				ready = false
			}
		}
		if !ready {
			continue
		}
		label := r.TaskName + "@" + r.NodeName
		switch r.Spec.Jig {
		case fuel.JigNone:
			require.NoError(t, f.Store.SucceedNoOp(f.Ctx, r.ID))
			state[r.ID] = contract.RunSucceeded
			continue
		case fuel.JigOrchestrator:
			run, node, err := f.Store.StartLocalRun(f.Ctx, r.ID)
			require.NoError(t, err)
			if run.State == contract.RunSkipped {
				state[r.ID] = run.State
				continue
			}
			if r.TaskType == fuel.TaskMoveToBootstrap {
				require.NoError(t, f.Store.MoveToBootstrap(f.Ctx, node.ID))
			}
			r = *run
		default:
			run, err := f.Store.DispatchRun(f.Ctx, r.ID, []byte("token"))
			require.NoError(t, err)
			if run.State == contract.RunSkipped {
				state[r.ID] = run.State
				continue
			}
			require.Equal(t, contract.RunRunning, run.State, label)
			r.Attempt = run.Attempt
		}
		o := outcomes[label]
		rec, err := f.Store.RecordRunResult(f.Ctx, r.NodeID, r.ID, protocol.RunResult{Attempt: r.Attempt, ExitCode: o.exit, Outputs: o.outputs})
		require.NoError(t, err)
		state[r.ID] = rec.Run.State
	}
	return planned, f.RunsByLabel(t, txn)
}

// states picks the state of each labelled run.
func states(runs map[string]models.TaskRun) map[string]string {
	out := map[string]string{}
	for label, r := range runs {
		out[label] = r.State
	}
	return out
}

// Labels of the fixture's deployment graph:
// setup@ctl -> db@ctl, setup@cmp -> nova@cmp, db@ctl -> nova@cmp.
var (
	setupCtl = "setup@" + storetest.CtlName
	dbCtl    = "db@" + storetest.CtlName
	setupCmp = "setup@" + storetest.CmpName
	novaCmp  = "nova@" + storetest.CmpName
)

// dbURL is what db hands nova unless a case says otherwise.
var dbURL = map[string]outcome{dbCtl: {outputs: map[string]string{"url": "db://a"}}}

// TestLCM: a task is skipped only when the last finished run of it on its
// node succeeded with the same inputs: its definition, its node's merged
// data and the outputs of the runs it depends on. Each case deploys once
// (everything runs), changes something, deploys again and checks what ran
// ("skipped" at plan or at dispatch, "succeeded" when it ran).
func TestLCM(t *testing.T) {
	allSkipped := map[string]string{setupCtl: contract.RunSkipped, dbCtl: contract.RunSkipped, setupCmp: contract.RunSkipped, novaCmp: contract.RunSkipped}
	for _, tc := range []struct {
		name string
		// change runs between the first deployment and the checked one.
		change func(t *testing.T, f *storetest.Fixture)
		// outcomes of the checked deployment (default: db hands over dbURL).
		outcomes map[string]outcome
		want     map[string]string
		// plannedPending are the runs the plan cannot skip yet but dispatch
		// does (a run they depend on executes and hands over the same outputs).
		plannedPending []string
	}{{
		name: "nothing changed: everything is skipped at plan time",
		want: allSkipped,
	}, {
		name: "a changed definition runs that task; its child sees the same outputs and is skipped at dispatch",
		change: func(t *testing.T, f *storetest.Fixture) {
			spec := storetest.ReleaseSpec(t)
			g := spec.Graphs["deployment"]
			g.Tasks[1].Parameters.Cmd = "echo db v2"
			spec.Graphs["deployment"] = g
			_, err := f.Store.ImportRelease(f.Ctx, spec)
			require.NoError(t, err)
		},
		want:           map[string]string{setupCtl: contract.RunSkipped, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSkipped, novaCmp: contract.RunSkipped},
		plannedPending: []string{novaCmp},
	}, {
		name: "a task whose upstream outputs change runs",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, err := f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Attributes: map[string]any{"db_size": 10}})
			require.NoError(t, err)
		},
		outcomes: map[string]outcome{dbCtl: {outputs: map[string]string{"url": "db://b"}}},
		want:     map[string]string{setupCtl: contract.RunSucceeded, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSkipped, novaCmp: contract.RunSucceeded},
	}, {
		name: "a node attribute re-runs the tasks of that node only",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, err := f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Attributes: map[string]any{"db_size": 10}})
			require.NoError(t, err)
		},
		want:           map[string]string{setupCtl: contract.RunSucceeded, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSkipped, novaCmp: contract.RunSkipped},
		plannedPending: []string{novaCmp},
	}, {
		name: "a deployment role's data re-runs the tasks of the nodes with that role",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, _, err := f.Store.SetDeploymentRole(f.Ctx, f.Dep.Name, "compute", map[string]any{"cpu_ratio": 4})
			require.NoError(t, err)
		},
		want: map[string]string{setupCtl: contract.RunSkipped, dbCtl: contract.RunSkipped, setupCmp: contract.RunSucceeded, novaCmp: contract.RunSucceeded},
	}, {
		name: "the deployment's attributes re-run every task",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, err := f.Store.SetDeploymentAttributes(f.Ctx, f.Dep.Name, map[string]any{"region": "north"})
			require.NoError(t, err)
		},
		want: map[string]string{setupCtl: contract.RunSucceeded, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSucceeded, novaCmp: contract.RunSucceeded},
	}, {
		name: "a failed forced run runs again at the next deployment",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, ended := deploy(t, f, fuel.ExecuteInput{Force: true}, map[string]outcome{dbCtl: {exit: 1}})
			require.Equal(t, contract.RunFailed, ended[dbCtl].State)
			require.Equal(t, contract.RunPending, ended[novaCmp].State, "never reached: its last finished run is the first deployment's")
		},
		want:           map[string]string{setupCtl: contract.RunSkipped, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSkipped, novaCmp: contract.RunSkipped},
		plannedPending: []string{novaCmp},
	}, {
		name: "a failed run runs again even with the same inputs",
		change: func(t *testing.T, f *storetest.Fixture) {
			// Same inputs as the first deployment, but db now fails there.
			_, err := f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Attributes: map[string]any{"db_size": 10}})
			require.NoError(t, err)
			_, ended := deploy(t, f, fuel.ExecuteInput{}, map[string]outcome{dbCtl: {exit: 3}})
			require.Equal(t, contract.RunFailed, ended[dbCtl].State)
			_, err = f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Attributes: map[string]any{"db_size": nil}})
			require.NoError(t, err)
			_, ended = deploy(t, f, fuel.ExecuteInput{}, map[string]outcome{dbCtl: {exit: 3}})
			require.Equal(t, contract.RunFailed, ended[dbCtl].State, "inputs as in the first deployment, but its last run failed")
		},
		want: map[string]string{setupCtl: contract.RunSkipped, dbCtl: contract.RunSucceeded, setupCmp: contract.RunSkipped, novaCmp: contract.RunSkipped},
		// setup@ctl ran again when db_size was set and again when it was
		// removed: its last finished run has the first deployment's inputs.
		plannedPending: []string{novaCmp},
	}, {
		name: "force runs everything",
		change: func(t *testing.T, f *storetest.Fixture) {
			_, ended := deploy(t, f, fuel.ExecuteInput{Force: true}, dbURL)
			for label, r := range ended {
				require.Equal(t, contract.RunSucceeded, r.State, "forced: %s runs", label)
			}
		},
		want: allSkipped,
	}, {
		name: "a dry run shows what LCM skips, and does not count as a run",
		change: func(t *testing.T, f *storetest.Fixture) {
			planned, _ := deploy(t, f, fuel.ExecuteInput{DryRun: true}, nil)
			assert.Equal(t, allSkipped, states(planned))
			_, err := f.Store.SetDeploymentAttributes(f.Ctx, f.Dep.Name, map[string]any{"region": "north"})
			require.NoError(t, err)
			planned, _ = deploy(t, f, fuel.ExecuteInput{DryRun: true}, nil)
			assert.Equal(t, contract.RunPlanned, planned[setupCtl].State)
			_, err = f.Store.SetDeploymentAttributes(f.Ctx, f.Dep.Name, map[string]any{})
			require.NoError(t, err)
		},
		want: allSkipped,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := storetest.NewFixture(t)
			_, first := deploy(t, f, fuel.ExecuteInput{}, dbURL)
			for label, r := range first {
				require.Equal(t, contract.RunSucceeded, r.State, "first deployment: %s runs", label)
				require.NotEmpty(t, r.InputsHash, "%s: hash recorded", label)
			}
			if tc.change != nil {
				tc.change(t, f)
			}
			outcomes := tc.outcomes
			if outcomes == nil {
				outcomes = dbURL
			}
			planned, ended := deploy(t, f, fuel.ExecuteInput{}, outcomes)
			assert.Equal(t, tc.want, states(ended))
			for _, label := range tc.plannedPending {
				assert.Equal(t, contract.RunPending, planned[label].State, "%s cannot be skipped at plan time", label)
				assert.Empty(t, planned[label].InputsHash, "%s: hash known at dispatch", label)
			}
			for label, r := range ended {
				if r.State == contract.RunSkipped {
					assert.Equal(t, first[label].InputsHash, r.InputsHash, "%s: skipped with the inputs of the run it stands for", label)
					assert.Equal(t, first[label].Outputs, r.Outputs, "%s: carries the outputs of the run it stands for", label)
					assert.NotNil(t, r.FinishedAt, label)
				} else if r.State == contract.RunSucceeded {
					assert.NotEmpty(t, r.InputsHash, label)
				}
			}
		})
	}
}

// TestNodeInputs: a graph task is sent its node's merged data: the
// deployment's attributes, then the deployment's data of each of the
// node's roles, then the node's attributes, with the node, its roles and
// its tags under "anneal".
func TestNodeInputs(t *testing.T) {
	f := storetest.NewFixture(t)
	_, err := f.Store.SetDeploymentAttributes(f.Ctx, f.Dep.Name, map[string]any{
		"region": "north", "ntp": map[string]any{"server": "ntp.dep", "iburst": true}, "size": "s"})
	require.NoError(t, err)
	_, _, err = f.Store.SetDeploymentRole(f.Ctx, f.Dep.Name, "controller", map[string]any{"ntp": map[string]any{"server": "ntp.role"}, "size": "m"})
	require.NoError(t, err)
	_, err = f.Store.UpdateNode(f.Ctx, storetest.CtlName, models.NodeUpdate{Attributes: map[string]any{"size": "l"}})
	require.NoError(t, err)
	planned, _ := deploy(t, f, fuel.ExecuteInput{DryRun: true}, nil)
	db := planned[dbCtl]
	assert.Equal(t, "north", db.AttrsIn["region"])
	assert.Equal(t, map[string]any{"server": "ntp.role", "iburst": true}, db.AttrsIn["ntp"], "role data over the deployment's, deep")
	assert.Equal(t, "l", db.AttrsIn["size"], "the node's own attributes win")
	anneal := db.AttrsIn["anneal"].(map[string]any)
	assert.Equal(t, storetest.CtlName, anneal["node"])
	assert.Equal(t, []any{"controller"}, anneal["roles"])
	assert.Subset(t, anneal["tags"], []any{"controller", "api", "db"})
	nova := planned[novaCmp]
	assert.Equal(t, "s", nova.AttrsIn["size"], "the compute node sees no controller data")
	assert.Equal(t, db.AttrsIn, planned[setupCtl].AttrsIn, "every task of a node sees the same data")
}

// TestLCMOutputsOfSkippedRuns: a run skipped by LCM hands its children the
// outputs of the run it stands for, so a task that runs again still reads
// them (ANNEAL_OUT_*, ANNEAL_CONTEXT).
func TestLCMOutputsOfSkippedRuns(t *testing.T) {
	f := storetest.NewFixture(t)
	deploy(t, f, fuel.ExecuteInput{}, dbURL)
	_, _, err := f.Store.SetDeploymentRole(f.Ctx, f.Dep.Name, "compute", map[string]any{"cpu_ratio": 4})
	require.NoError(t, err)
	txn := f.Execute(t, fuel.ExecuteInput{})
	_, err = f.Store.PlanGraph(f.Ctx, txn.ID, 0)
	require.NoError(t, err)
	runs := f.RunsByLabel(t, txn)
	require.Equal(t, contract.RunSkipped, runs[dbCtl].State)
	nova := runs[novaCmp]
	require.Equal(t, contract.RunPending, nova.State)
	rc, err := f.Store.RunContext(f.Ctx, &nova)
	require.NoError(t, err)
	assert.Contains(t, rc.Outputs, models.RunOutputs{TaskName: "db", NodeName: storetest.CtlName, Outputs: map[string]string{"url": "db://a"}})
}

// TestLCMNeverSkips: the verification graph, and any graph after the node
// was wiped (erase_node, move_to_bootstrap), run again though nothing
// changed.
func TestLCMNeverSkips(t *testing.T) {
	for _, tc := range []struct {
		name  string
		graph string
		tasks string
		// wipe runs between the two deployments of graph.
		wipe string
	}{
		{name: "verification", graph: "verification", tasks: `[{"id": "check", "role": "*", "parameters": {"cmd": "true"}}]`},
		{name: "after erase_node", graph: "provision", wipe: `[{"id": "erase", "type": "erase_node", "role": "*"}]`},
		{name: "after move_to_bootstrap", graph: "provision", wipe: `[{"id": "back", "type": "move_to_bootstrap", "role": "*"}]`},
		{name: "control: provision unchanged is skipped", graph: "provision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := storetest.NewFixture(t)
			owner := fuel.GraphOwner{Kind: fuel.OwnerDeployment, Ref: f.Dep.Name}
			addGraph := func(typ, tasks string) {
				var in fuel.GraphInput
				require.NoError(t, json.Unmarshal([]byte(`{"tasks": `+tasks+`}`), &in))
				_, err := f.Store.CreateGraph(f.Ctx, owner, typ, in)
				require.NoError(t, err)
			}
			if tc.tasks != "" {
				addGraph(tc.graph, tc.tasks)
			}
			graphs := []fuel.GraphRequest{{Type: tc.graph}}
			_, first := deploy(t, f, fuel.ExecuteInput{Graphs: graphs}, nil)
			if tc.wipe != "" {
				addGraph("wipe", tc.wipe)
				_, wiped := deploy(t, f, fuel.ExecuteInput{Graphs: []fuel.GraphRequest{{Type: "wipe"}}}, nil)
				for label, r := range wiped {
					require.Equal(t, contract.RunSucceeded, r.State, label)
				}
				// Back where it was (move_to_bootstrap took it to discovery).
				for _, n := range []*models.Node{f.Ctl, f.Cmp} {
					dep := f.Dep.Name
					_, err := f.Store.UpdateNode(f.Ctx, n.Name, models.NodeUpdate{Deployment: &dep, Roles: &n.Roles})
					require.NoError(t, err)
				}
			}
			_, again := deploy(t, f, fuel.ExecuteInput{Graphs: graphs}, nil)
			require.Len(t, again, len(first))
			want := contract.RunSucceeded
			if tc.tasks == "" && tc.wipe == "" {
				want = contract.RunSkipped
			}
			for label, r := range again {
				assert.Equal(t, want, r.State, label)
				assert.Equal(t, first[label].InputsHash, r.InputsHash, "%s: same inputs", label)
			}
		})
	}
}

// TestRoleWithoutTasks: a Crowbar-style role (no task selects it) runs as
// one task named after it, after its parent role's task on another node.
func TestRoleWithoutTasks(t *testing.T) {
	store, ctx := storetest.New(t)
	spec := models.ReleaseSpec{
		Name: "crowbar",
		RolesMetadata: map[string]models.RoleSpec{
			"dns":      {Script: "echo dns"},
			"ntp":      {},
			"database": {Requires: []string{"dns"}, Script: "echo db"},
		},
	}
	_, err := store.ImportRelease(ctx, spec)
	require.NoError(t, err)
	_, err = store.CreateDeployment(ctx, models.DeploymentInput{Name: "cb", Release: "crowbar"})
	require.NoError(t, err)
	for name, roles := range map[string][]string{"a.anneal.test": {"dns", "ntp"}, "b.anneal.test": {"database"}} {
		_, _, err := store.CreateNode(ctx, models.NodeInput{Name: name}, true)
		require.NoError(t, err)
		dep := "cb"
		_, err = store.UpdateNode(ctx, name, models.NodeUpdate{Deployment: &dep, Roles: &roles})
		require.NoError(t, err)
	}
	// The release has no graphs at all: its roles make the deployment graph.
	txn, err := store.CreateTransaction(ctx, fuel.ExecuteInput{Deployment: "cb", Graphs: []fuel.GraphRequest{{Type: "deployment"}}},
		func(*fuel.Transaction) error { return nil })
	require.NoError(t, err)
	_, err = store.PlanGraph(ctx, txn.ID, 0)
	require.NoError(t, err)
	runs, err := store.Runs(ctx, txn.ID, fuel.RunFilter{})
	require.NoError(t, err)
	got := map[string]models.TaskRun{}
	for _, r := range runs {
		got[r.TaskName+"@"+r.NodeName] = r
	}
	require.Len(t, got, 3)
	assert.Equal(t, "echo dns", got["dns@a.anneal.test"].Spec.Cmd)
	assert.Equal(t, "noop", got["ntp@a.anneal.test"].TaskType)
	db := got["database@b.anneal.test"]
	assert.Equal(t, "echo db", db.Spec.Cmd)
	plan, err := store.NodePlan(ctx, txn.ID, 0, db.NodeID)
	require.NoError(t, err)
	require.Len(t, plan.Runs, 1)
	assert.Equal(t, []int64{got["dns@a.anneal.test"].ID}, plan.Runs[0].Remote, "database waits for dns on the other node")
}
