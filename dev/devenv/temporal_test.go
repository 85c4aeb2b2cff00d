package devenv_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/devenv"
)

// needTemporal skips the test unless the Temporal CLI is at hand or building
// it was asked for (ANNEAL_DEV_BUILD_TEMPORAL=1): a test must not start an
// 8-minute build by surprise.
func needTemporal(t *testing.T) {
	t.Helper()
	t.Setenv(devenv.EnvTemporalAddress, "")
	if os.Getenv("ANNEAL_DEV_BUILD_TEMPORAL") != "" {
		return
	}
	ctx := context.Background()
	if path, err := exec.LookPath("temporal"); err == nil && devenv.IsWantedTemporal(ctx, path) {
		return
	}
	dir, err := devenv.TemporalCacheDir()
	require.NoError(t, err)
	if devenv.IsWantedTemporal(ctx, filepath.Join(dir, "temporal")) {
		return
	}
	t.Skipf("the Temporal CLI v%s is not built yet (in %s); set ANNEAL_DEV_BUILD_TEMPORAL=1 to build it (about 8 minutes)",
		devenv.TemporalCLIVersion, dir)
}

func TestTemporalBinary(t *testing.T) {
	needTemporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := devenv.TemporalBinary(ctx, testLogger(t))
	require.NoError(t, err)
	assert.True(t, devenv.IsWantedTemporal(ctx, bin))
}

func TestEnsureTemporalEphemeral(t *testing.T) {
	needTemporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	stateDir := t.TempDir()
	tmp, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{
		StateDir:  stateDir,
		UIPort:    devenv.HeadlessUI,
		Ephemeral: true,
	}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tmp.Close() })

	assert.Equal(t, devenv.TemporalStarted, tmp.Source)
	assert.Empty(t, tmp.UIURL, "headless")
	assert.Equal(t, filepath.Join(stateDir, "temporal.log"), tmp.LogFile)
	assert.NoFileExists(t, filepath.Join(stateDir, "temporal.db"), "ephemeral: in memory")
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, devenv.CheckTemporal(hctx, tmp.Address))
	hcancel()
	if rss, err := devenv.PeakRSS(tmp.Pid()); err == nil {
		t.Logf("Temporal dev server peak RSS: %d MiB", rss>>20)
		assert.Greater(t, rss, int64(0))
	}

	require.NoError(t, tmp.Close())
	require.NoError(t, tmp.Close(), "second Close")
	c, err := net.DialTimeout("tcp", tmp.Address, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s still answers after Close", tmp.Address)
	}
}

func TestEnsureTemporalReuseAndUI(t *testing.T) {
	needTemporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	stateDir := t.TempDir()
	log := testLogger(t)
	// Persistent (SQLite file, WAL) with a UI on a free port.
	first, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{StateDir: stateDir}, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	assert.FileExists(t, filepath.Join(stateDir, "temporal.db"))
	require.NotEmpty(t, first.UIURL)
	require.Eventually(t, func() bool {
		resp, err := http.Get(first.UIURL)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 200*time.Millisecond, "Web UI at %s", first.UIURL)

	_, portStr, err := net.SplitHostPort(first.Address)
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	_, uiPortStr, err := net.SplitHostPort(first.UIURL[len("http://"):])
	require.NoError(t, err)
	uiPort, err := strconv.Atoi(uiPortStr)
	require.NoError(t, err)

	second, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{StateDir: t.TempDir(), Port: port, UIPort: uiPort}, log)
	require.NoError(t, err)
	assert.Equal(t, devenv.TemporalExisting, second.Source)
	assert.Equal(t, first.Address, second.Address)
	assert.Equal(t, first.UIURL, second.UIURL)
	assert.Zero(t, second.Pid())
	require.NoError(t, second.Close())
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	require.NoError(t, devenv.CheckTemporal(hctx, first.Address), "closing a reused server leaves it running")

	// TEMPORAL_ADDRESS wins over everything.
	t.Setenv(devenv.EnvTemporalAddress, first.Address)
	third, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{}, log)
	require.NoError(t, err)
	assert.Equal(t, devenv.TemporalFromEnv, third.Source)
	require.NoError(t, third.Close())
}

func TestEnsureTemporalCrashShowsLog(t *testing.T) {
	needTemporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	_, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{
		StateDir:  t.TempDir(),
		UIPort:    devenv.HeadlessUI,
		Ephemeral: true,
		ExtraArgs: []string{"--no-such-flag-for-anneal"},
	}, testLogger(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exited before it was healthy")
	assert.Contains(t, err.Error(), "no-such-flag-for-anneal", "the log tail is in the error")
}

func TestEnsureTemporalPortTakenByStranger(t *testing.T) {
	needTemporal(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = devenv.EnsureTemporal(ctx, devenv.TemporalOptions{StateDir: t.TempDir(), Port: port, UIPort: devenv.HeadlessUI}, testLogger(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not answer as a Temporal frontend")
}

// TestTemporalBinaryBuildsOnce runs the build path with a fake `go` that
// "installs" a script answering --version like the real CLI.
func TestTemporalBinaryBuildsOnce(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("os.UserCacheDir honours XDG_CACHE_HOME on Linux only")
	}
	fakeBin := t.TempDir()
	cache := t.TempDir()
	count := filepath.Join(t.TempDir(), "builds")
	fakeGo := `#!/bin/sh
echo "fake go $*"
echo x >> ` + count + `
sleep 1
printf '#!/bin/sh\necho "temporal version ` + devenv.TemporalCLIVersion + ` (Server 1.29.1, UI 2.42.1)"\n' > "$GOBIN/temporal"
chmod +x "$GOBIN/temporal"
`
	require.NoError(t, os.WriteFile(filepath.Join(fakeBin, "go"), []byte(fakeGo), 0o755))
	t.Setenv("PATH", fakeBin+":/usr/bin:/bin")
	t.Setenv("XDG_CACHE_HOME", cache)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	paths := make([]string, 3)
	errs := make([]error, 3)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = devenv.TemporalBinary(ctx, testLogger(t))
		}()
	}
	wg.Wait()
	want := filepath.Join(cache, "anneal", "temporal-v"+devenv.TemporalCLIVersion, "temporal")
	for i := range paths {
		require.NoError(t, errs[i])
		assert.Equal(t, want, paths[i])
	}
	b, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, "x\n", string(b), "built exactly once")
	entries, err := os.ReadDir(filepath.Dir(want))
	require.NoError(t, err)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), ".build-", "temporary GOBIN removed")
	}
	logb, err := os.ReadFile(filepath.Join(filepath.Dir(want), "build.log"))
	require.NoError(t, err)
	assert.Contains(t, string(logb), "fake go install github.com/temporalio/cli/cmd/temporal@v"+devenv.TemporalCLIVersion)
}
