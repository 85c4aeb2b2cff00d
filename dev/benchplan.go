package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/web"
	"github.com/anneal-dev/anneal/worker/server"
)

// benchPlan measures planning alone (`dev bench --plan-only`): the bench's
// release and deployment with the same nodes and roles, made through the
// stores rather than through agents and the API (no Temporal, no worker),
// then per round one transaction of the bench graph (forced, as the bench
// executes it) planned by the store's PlanGraph, the very call the
// PlanGraph activity makes. It prints each round and the median; with
// pprofDir, a CPU profile of the planning calls.
func benchPlan(ctx context.Context, state string, nodes, tasks, rounds int, crossNode bool, pprofDir string, log *slog.Logger) error {
	pg, err := devenv.EnsurePostgres(ctx, state, log)
	if err != nil {
		return err
	}
	defer pg.Close()
	// A database of its own, dropped at the end: two at once (another
	// checkout's) do not reset each other's.
	dbName := fmt.Sprintf("anneal_bench_plan_%d", os.Getpid())
	dbURL, err := pg.ResetDatabase(ctx, dbName)
	if err != nil {
		return err
	}
	defer pg.DropDatabase(context.WithoutCancel(ctx), dbName)
	db, done, err := models.OpenMigrated(ctx, dbURL)
	if err != nil {
		return err
	}
	defer done()
	store := &models.Store{DB: db, Domain: server.DefaultDomain}
	plans := fuel.New(store)
	fmt.Printf("creating %d nodes...\n", nodes)
	if err := benchPlanSetup(ctx, store, nodes, tasks, crossNode); err != nil {
		return err
	}
	var prof *os.File
	if pprofDir != "" {
		if err := os.MkdirAll(pprofDir, 0o755); err != nil {
			return err
		}
		if prof, err = os.Create(filepath.Join(pprofDir, "plan-cpu.pprof")); err != nil {
			return err
		}
		defer prof.Close()
		if err := pprof.StartCPUProfile(prof); err != nil {
			return err
		}
	}
	meter, err := newPGMeter(ctx, dbURL, dbName)
	if err != nil {
		fmt.Printf("Postgres CPU not measured: %v\n", err)
	}
	var times []time.Duration
	var cpus []float64
	runs := 0
	for round := 1; round <= rounds; round++ {
		id, err := executeBenchGraph(ctx, plans)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if meter != nil {
			meter.start()
		}
		self0, _, _, _ := procTimes(os.Getpid())
		start := time.Now()
		gp, err := plans.PlanGraph(ctx, id, 0)
		took := time.Since(start)
		self1, _, _, _ := procTimes(os.Getpid())
		var pgCPU float64
		if meter != nil {
			pgCPU, _, _ = meter.stop()
		}
		if err != nil {
			return fmt.Errorf("round %d: plan: %w", round, err)
		}
		runs = gp.Runs
		times = append(times, took)
		cpus = append(cpus, self1-self0+pgCPU)
		fmt.Printf("round %d: planned %d runs on %d nodes in %.3f s; CPU %.2f s here + %.2f s in Postgres\n",
			round, gp.Runs, len(gp.Nodes), took.Seconds(), self1-self0, pgCPU)
	}
	if prof != nil {
		pprof.StopCPUProfile()
		fmt.Printf("CPU profile of the planning calls (this process; Postgres not included): %s\n", prof.Name())
	}
	slices.Sort(times)
	slices.Sort(cpus)
	// CPU as well as time: on a loaded machine the wall time says as much
	// about the neighbours as about planning.
	target := ""
	if nodes == 1000 && tasks == 20 {
		target = "; target < 2 s (issue 14)"
	}
	fmt.Printf("\nplanning %d nodes x %d tasks (%d runs): median %.3f s over %d rounds (min %.3f s, max %.3f s%s); "+
		"median CPU %.2f s (this process and the database's backends)\n",
		nodes, tasks, runs, times[len(times)/2].Seconds(), len(times), times[0].Seconds(), times[len(times)-1].Seconds(), target, cpus[len(cpus)/2])
	return nil
}

// executeBenchGraph creates a transaction of the bench graph, forced as
// the bench executes it (every run runs, LCM skips nothing), without a
// workflow: the caller plans it (PlanGraph, as the activity does).
func executeBenchGraph(ctx context.Context, plans *fuel.Store) (uuid.UUID, error) {
	txn, err := plans.CreateTransaction(ctx, fuel.ExecuteInput{Deployment: "bench",
		Graphs: []fuel.GraphRequest{{Type: "bench"}}, Force: true}, func(*fuel.Transaction) error { return nil })
	if err != nil {
		return uuid.Nil, fmt.Errorf("execute: %w", err)
	}
	return txn.ID, nil
}

// benchPlanSetup imports the bench's release (with its cross-node
// dependency unless crossNode is false), creates its deployment and its
// nodes as its agents and PATCHes do: alive, with a credential, in
// deployment bench with role bench, the first one also anchor. A few at a
// time: this is setup, not what is measured.
func benchPlanSetup(ctx context.Context, store *models.Store, n, tasks int, crossNode bool) error {
	spec, err := web.ParseRelease([]byte(benchRelease(tasks, crossNode)), "application/yaml")
	if err != nil {
		return fmt.Errorf("bench release: %w", err)
	}
	if _, err := store.ImportRelease(ctx, *spec); err != nil {
		return fmt.Errorf("import the bench release: %w", err)
	}
	if _, err := store.CreateDeployment(ctx, models.DeploymentInput{Name: "bench", Release: "bench"}); err != nil {
		return fmt.Errorf("create the bench deployment: %w", err)
	}
	const workers = 4
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				name := fmt.Sprintf("bench-%03d.%s", i+1, server.DefaultDomain)
				if _, _, err := store.CreateNode(ctx, models.NodeInput{Name: name}, true); err != nil {
					errs <- fmt.Errorf("create node %s: %w", name, err)
					return
				}
				roles := []string{"bench"}
				if i == 0 {
					roles = append(roles, "anchor")
				}
				dep := "bench"
				if _, err := store.UpdateNode(ctx, name, models.NodeUpdate{Deployment: &dep, Roles: &roles}); err != nil {
					errs <- fmt.Errorf("place node %s: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
