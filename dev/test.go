package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// testTemplate names the migrated database every integration test clones.
const testTemplate = "anneal_test"

// test prepares Postgres (a freshly migrated template database) and a
// headless, in-memory Temporal dev server, then runs go test -race on the
// whole module (or on the packages and flags given).
func test(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	pg, err := devenv.EnsurePostgres(ctx, state, log)
	if err != nil {
		return err
	}
	defer pg.Close()
	// A template of its own per run, so two runs at once do not collide.
	template := fmt.Sprintf("%s_%d", testTemplate, os.Getpid())
	tplURL, err := pg.ResetDatabase(ctx, template)
	if err != nil {
		return err
	}
	defer pg.DropDatabase(context.Background(), template)
	if err := migrateOnce(ctx, tplURL); err != nil {
		return err
	}
	opts := devenv.DefaultTemporalOptions(state)
	opts.Port = 0 // a free port: never collide with a running `dev up`
	opts.UIPort = devenv.HeadlessUI
	opts.Ephemeral = true
	opts.LogFile = state + "/test-temporal.log"
	tmp, err := devenv.EnsureTemporal(ctx, opts, log)
	if err != nil {
		return err
	}
	defer tmp.Close()

	// The ssh jig's tests start a real sshd; without one they fail saying
	// what to install (FindSSHD's error, in ANNEAL_TEST_SSHD_MISSING).
	sshdEnv := testenv.EnvSSHD + "="
	if sshd, err := devenv.FindSSHD(ctx, log); err != nil {
		log.Warn("the ssh jig's tests will fail", "error", err)
		sshdEnv = testenv.EnvSSHDMissing + "=" + err.Error()
	} else {
		sshdEnv += sshd
	}

	goArgs := []string{"test", "-race", "-count=1", "-timeout=30m"}
	if len(args) == 0 {
		args = []string{"./..."}
	}
	// The dashboard's test drives a real headless Chromium: find it, or
	// install it when that is possible, for runs that include package web.
	var browserEnv []string
	if mayTestDashboard(args) {
		if path, err := devenv.EnsureChromium(ctx, log); err != nil {
			log.Warn("the dashboard test will fail without a browser", "error", err)
			browserEnv = append(browserEnv, testenv.EnvChromiumError+"="+err.Error())
		} else {
			browserEnv = append(browserEnv, testenv.EnvChromium+"="+path)
		}
	}
	goArgs = append(goArgs, args...)
	log.Info("running tests", "postgres", pg.Source, "temporal", tmp.Address, "cmd", "go "+fmt.Sprint(goArgs))
	cmd := exec.CommandContext(ctx, "go", goArgs...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		testenv.EnvDatabaseURL+"="+pg.URL,
		testenv.EnvTemplate+"="+template,
		testenv.EnvTemporal+"="+tmp.Address,
		testenv.EnvRequire+"=1",
		sshdEnv,
	)
	cmd.Env = append(cmd.Env, browserEnv...)
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return &exitError{code: exit.ExitCode()}
		}
		return fmt.Errorf("go test: %w", err)
	}
	return nil
}

// mayTestDashboard reports whether the packages of a `dev test` run may
// include web (the dashboard's browser test): no package named, ./..., or
// one naming web.
func mayTestDashboard(args []string) bool {
	named := false
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		named = true
		if a == "./..." || a == "..." || strings.Contains(a, "web") {
			return true
		}
	}
	return !named
}

// migrateOnce migrates a database and closes the connection (a template
// must have no sessions when it is cloned).
func migrateOnce(ctx context.Context, url string) error {
	_, done, err := models.OpenMigrated(ctx, url)
	if err != nil {
		return err
	}
	done()
	return nil
}
