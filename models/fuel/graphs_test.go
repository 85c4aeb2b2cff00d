package fuel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/models/storetest"
)

func strp(s string) *string { return &s }

// pluginOwner addresses a plugin's graphs.
func pluginOwner(p *fuel.Plugin) fuel.GraphOwner {
	return fuel.GraphOwner{Kind: fuel.OwnerPlugin, Ref: p.Name + "@" + p.Version}
}

func TestGraphMergeThreeLevels(t *testing.T) {
	f := storetest.NewFixture(t)
	s, ctx := f.Store, f.Ctx
	newPlugin := func(name string) *fuel.Plugin {
		p, err := s.CreatePlugin(ctx, fuel.PluginInput{Name: name, Version: "1.0", Title: name + " plugin"})
		require.NoError(t, err)
		return p
	}
	alpha, beta, gamma := newPlugin("alpha"), newPlugin("beta"), newPlugin("gamma")

	// alpha overrides the release's db and adds a monitor selected by the
	// legacy role field (Fuel plugins without tags); it also brings a graph
	// type of its own.
	_, err := s.CreateGraph(ctx, pluginOwner(alpha), "deployment", fuel.GraphInput{
		Name:     strp("alpha"),
		Metadata: map[string]any{"owner": "alpha", "alpha": true},
		Tasks: []plan.Task{
			{ID: "db", Tags: []string{"db"}, Requires: []string{"setup"}, Parameters: plan.Parameters{Cmd: "echo alpha-db"}},
			{ID: "monitor", Role: plan.StringList{"controller"}, Requires: []string{"db"}, Parameters: plan.Parameters{Cmd: "echo alpha-monitor"}},
		},
	})
	require.NoError(t, err)
	_, err = s.CreateGraph(ctx, pluginOwner(alpha), "alpha-check", fuel.GraphInput{
		Tasks: []plan.Task{{ID: "check", Role: plan.StringList{"*"}}},
	})
	require.NoError(t, err)
	// beta would replace setup and add a task, but ends up disabled.
	_, err = s.CreateGraph(ctx, pluginOwner(beta), "deployment", fuel.GraphInput{
		Metadata: map[string]any{"owner": "beta", "beta": true},
		Tasks: []plan.Task{
			{ID: "setup", Tags: []string{"controller", "compute"}, Parameters: plan.Parameters{Cmd: "echo beta-setup"}},
			{ID: "beta-task", Tags: []string{"api"}},
		},
	})
	require.NoError(t, err)
	_, err = s.CreateGraph(ctx, pluginOwner(beta), "beta-only", fuel.GraphInput{Tasks: []plan.Task{{ID: "b"}}})
	require.NoError(t, err)
	// gamma, a later plugin, replaces alpha's monitor.
	_, err = s.CreateGraph(ctx, pluginOwner(gamma), "deployment", fuel.GraphInput{
		Metadata: map[string]any{"owner": "gamma"},
		Tasks: []plan.Task{
			{ID: "monitor", Role: plan.StringList{"controller"}, Parameters: plan.Parameters{Cmd: "echo gamma-monitor"}},
		},
	})
	require.NoError(t, err)
	// The deployment replaces db once more.
	_, err = s.CreateGraph(ctx, fuel.GraphOwner{Kind: fuel.OwnerDeployment, Ref: "prod"}, "deployment", fuel.GraphInput{
		Metadata: map[string]any{"owner": "deployment"},
		Tasks: []plan.Task{
			{ID: "db", Tags: []string{"db"}, Requires: []string{"setup"}, Parameters: plan.Parameters{Cmd: "echo deployment-db"}},
		},
	})
	require.NoError(t, err)

	// Enabled in the "wrong" order: plugin id decides the merge order.
	require.NoError(t, s.EnablePlugin(ctx, "prod", "gamma"))
	require.NoError(t, s.EnablePlugin(ctx, "prod", "gamma"), "enabling twice changes nothing")
	require.NoError(t, s.EnablePlugin(ctx, "prod", "alpha@1.0"))
	require.NoError(t, s.EnablePlugin(ctx, "prod", "beta"))
	require.NoError(t, s.DisablePlugin(ctx, "prod", "beta"))
	assert.ErrorIs(t, s.DisablePlugin(ctx, "prod", "beta"), models.ErrNotFound, "not enabled any more")
	enabled, err := s.DeploymentPlugins(ctx, "prod")
	require.NoError(t, err)
	require.Len(t, enabled, 2)
	assert.Equal(t, []string{"alpha", "gamma"}, []string{enabled[0].Name, enabled[1].Name})

	g, err := s.ResolveGraph(ctx, f.Dep, "deployment")
	require.NoError(t, err)
	assert.Equal(t, []string{"setup", "db", "nova", "monitor"}, taskIDs(g.Tasks))
	assert.Equal(t, "echo setup", g.Tasks[0].Parameters.Cmd, "the disabled beta does not replace setup")
	assert.Equal(t, "echo deployment-db", g.Tasks[1].Parameters.Cmd, "the deployment wins over alpha")
	assert.Equal(t, "echo gamma-monitor", g.Tasks[3].Parameters.Cmd, "gamma (later id) wins over alpha")
	assert.Empty(t, g.Tasks[3].Requires, "a task is replaced whole")
	assert.Equal(t, "deployment", g.Metadata["owner"])
	assert.Equal(t, true, g.Metadata["alpha"])
	assert.NotContains(t, g.Metadata, "beta")
	assert.Contains(t, g.Metadata, "on_success")
	var sources []string
	for _, src := range g.Sources {
		sources = append(sources, src.OwnerKind)
	}
	assert.Equal(t, []string{"release", "plugin", "plugin", "deployment"}, sources)
	assert.Equal(t, alpha.ID, g.Sources[1].OwnerID)
	assert.Equal(t, gamma.ID, g.Sources[2].OwnerID)

	types, err := s.GraphTypes(ctx, f.Dep)
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha-check", "deployment", "provision"}, types)

	// Another deployment of the release without plugins sees the release only.
	other, err := s.CreateDeployment(ctx, models.DeploymentInput{Name: "other", Release: "openstack"})
	require.NoError(t, err)
	g, err = s.ResolveGraph(ctx, other, "deployment")
	require.NoError(t, err)
	assert.Equal(t, []string{"setup", "db", "nova"}, taskIDs(g.Tasks))
	assert.Equal(t, "echo db", g.Tasks[1].Parameters.Cmd)

	// Planning uses the merged graph: gamma's monitor runs on the controller
	// through its legacy role, after nothing but setup's successors.
	p, err := s.PlanPreview(ctx, f.Dep, "deployment", plan.Options{})
	require.NoError(t, err)
	labels := map[string]bool{}
	for _, r := range p.Runs {
		labels[r.Label()] = true
	}
	assert.Equal(t, map[string]bool{
		"setup@" + storetest.CtlName: true, "setup@" + storetest.CmpName: true, "db@" + storetest.CtlName: true,
		"nova@" + storetest.CmpName: true, "monitor@" + storetest.CtlName: true,
	}, labels)
	_, gp := f.Plan(t)
	assert.Equal(t, 5, gp.Runs, "execute plans the same merged graph")

	// The own graphs are unmerged.
	own, err := s.OwnGraph(ctx, pluginOwner(alpha), "deployment")
	require.NoError(t, err)
	assert.Equal(t, []string{"db", "monitor"}, taskIDs(own.Tasks))
	list, err := s.OwnGraphs(ctx, pluginOwner(alpha))
	require.NoError(t, err)
	assert.Equal(t, []fuel.GraphSummary{
		{Type: "alpha-check", Name: "", TaskCount: 1},
		{Type: "deployment", Name: "alpha", TaskCount: 2},
	}, list)
}

func TestGraphWrites(t *testing.T) {
	f := storetest.NewFixture(t)
	s, ctx := f.Store, f.Ctx
	rel := fuel.GraphOwner{Kind: fuel.OwnerRelease, Ref: "openstack@1.0"}
	dep := fuel.GraphOwner{Kind: fuel.OwnerDeployment, Ref: "prod"}
	graphs := func() int64 { return storetest.Count(t, s, &fuel.Graph{}) }
	start := graphs()

	// Bad input, before anything is written.
	_, err := s.CreateGraph(ctx, dep, "Bad Type", fuel.GraphInput{})
	storetest.RequireInput(t, err, "type")
	_, err = s.CreateGraph(ctx, dep, "custom", fuel.GraphInput{Type: "other"})
	storetest.RequireInput(t, err, "type")
	_, err = s.CreateGraph(ctx, dep, "custom", fuel.GraphInput{Tasks: []plan.Task{{ID: "a"}, {ID: "a"}}})
	ie := storetest.RequireInput(t, err, "tasks")
	assert.Contains(t, ie.Reason, "duplicate task id")
	_, err = s.CreateGraph(ctx, dep, "custom", fuel.GraphInput{Tasks: []plan.Task{{ID: "a", Tags: []string{"/[/"}}}})
	storetest.RequireInput(t, err, "tasks")
	// A release is the base level: it may name only its own tasks.
	_, err = s.CreateGraph(ctx, rel, "custom", fuel.GraphInput{Tasks: []plan.Task{{ID: "a", Requires: []string{"elsewhere"}}}})
	ie = storetest.RequireInput(t, err, "tasks")
	assert.Contains(t, ie.Reason, `unknown task "elsewhere"`)
	// A deployment may name the release's tasks, but not unknown ones.
	_, err = s.CreateGraph(ctx, dep, "deployment", fuel.GraphInput{Tasks: []plan.Task{{ID: "a", Requires: []string{"nowhere"}}}})
	ie = storetest.RequireInput(t, err, "tasks")
	assert.Contains(t, ie.Reason, `merged into graph "deployment" of deployment "prod"`)
	assert.Equal(t, "prod", ie.Details["deployment"])
	_, err = s.CreateGraph(ctx, fuel.GraphOwner{Kind: fuel.OwnerDeployment, Ref: "nope"}, "custom", fuel.GraphInput{})
	assert.ErrorIs(t, err, models.ErrNotFound)
	_, err = s.PatchGraph(ctx, dep, "deployment", fuel.GraphInput{Name: strp("x")})
	assert.ErrorIs(t, err, models.ErrNotFound)
	assert.ErrorIs(t, s.DeleteGraph(ctx, dep, "deployment"), models.ErrNotFound)
	assert.Equal(t, start, graphs(), "nothing written")

	// Create, conflict, patch, replace, delete.
	g, err := s.CreateGraph(ctx, dep, "deployment", fuel.GraphInput{
		Name: strp("local"), Metadata: map[string]any{"a": 1.0},
		Tasks: []plan.Task{{ID: "smoke", Tags: []string{"api"}, Requires: []string{"db"}}},
	})
	require.NoError(t, err)
	assert.Equal(t, "local", g.Name)
	_, err = s.CreateGraph(ctx, dep, "deployment", fuel.GraphInput{})
	storetest.RequireConflict(t, err)

	g, err = s.PatchGraph(ctx, dep, "deployment", fuel.GraphInput{
		Metadata: map[string]any{"b": "two"},
		Tasks: []plan.Task{
			{ID: "smoke", Tags: []string{"api"}, Requires: []string{"db"}, Parameters: plan.Parameters{Cmd: "echo smoke"}},
			{ID: "extra", Tags: []string{"db"}},
		},
	})
	require.NoError(t, err)
	assert.Equal(t, "local", g.Name, "name kept when not given")
	assert.Equal(t, map[string]any{"a": 1.0, "b": "two"}, g.Metadata)
	assert.Equal(t, []string{"smoke", "extra"}, taskIDs(g.Tasks))
	assert.Equal(t, "echo smoke", g.Tasks[0].Parameters.Cmd)
	_, err = s.PatchGraph(ctx, dep, "deployment", fuel.GraphInput{Tasks: []plan.Task{{ID: "extra", Requires: []string{"nowhere"}}}})
	storetest.RequireInput(t, err, "tasks")
	stored, err := s.OwnGraph(ctx, dep, "deployment")
	require.NoError(t, err)
	assert.Equal(t, g.Tasks, stored.Tasks, "a refused patch writes nothing")

	// The release cannot drop a task the deployment's graph needs.
	_, _, err = s.ReplaceGraph(ctx, rel, "deployment", fuel.GraphInput{Tasks: []plan.Task{{ID: "setup"}}})
	ie = storetest.RequireInput(t, err, "tasks")
	assert.Contains(t, ie.Reason, `unknown task "db"`)
	storetest.RequireConflict(t, s.DeleteGraph(ctx, rel, "deployment"))

	g, created, err := s.ReplaceGraph(ctx, dep, "deployment", fuel.GraphInput{Tasks: []plan.Task{{ID: "only"}}})
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, "", g.Name, "PUT replaces the whole graph")
	assert.Empty(t, g.Metadata)
	_, created, err = s.ReplaceGraph(ctx, dep, "custom", fuel.GraphInput{})
	require.NoError(t, err)
	assert.True(t, created)
	require.NoError(t, s.DeleteGraph(ctx, dep, "custom"))
	assert.ErrorIs(t, s.DeleteGraph(ctx, dep, "custom"), models.ErrNotFound)

	// Plugins: validation, conflicts, and enabling a plugin whose graph
	// does not fit the deployment.
	_, err = s.CreatePlugin(ctx, fuel.PluginInput{Version: "1"})
	storetest.RequireInput(t, err, "name")
	_, err = s.CreatePlugin(ctx, fuel.PluginInput{Name: "42", Version: "1"})
	storetest.RequireInput(t, err, "name")
	_, err = s.CreatePlugin(ctx, fuel.PluginInput{Name: "lma"})
	storetest.RequireInput(t, err, "version")
	p, err := s.CreatePlugin(ctx, fuel.PluginInput{Name: "lma", Version: "1"})
	require.NoError(t, err)
	_, err = s.CreatePlugin(ctx, fuel.PluginInput{Name: "lma", Version: "1"})
	storetest.RequireConflict(t, err)
	_, err = s.CreateGraph(ctx, pluginOwner(p), "deployment", fuel.GraphInput{
		Tasks: []plan.Task{{ID: "collector", Requires: []string{"not-in-release"}}},
	})
	require.NoError(t, err, "a plugin's references are checked where it is enabled")
	storetest.RequireConflict(t, s.EnablePlugin(ctx, "prod", "lma"))
	plugins, err := s.DeploymentPlugins(ctx, "prod")
	require.NoError(t, err)
	assert.Empty(t, plugins)
	assert.ErrorIs(t, s.EnablePlugin(ctx, "prod", "nope"), models.ErrNotFound)
	assert.ErrorIs(t, s.EnablePlugin(ctx, "nope", "lma"), models.ErrNotFound)
}
