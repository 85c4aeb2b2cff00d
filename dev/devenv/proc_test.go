package devenv_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/devenv"
)

func TestPeakRSSOfSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("PeakRSS reads /proc: Linux only")
	}
	rss, err := devenv.PeakRSS(os.Getpid())
	require.NoError(t, err)
	assert.Greater(t, rss, int64(1<<20), "a Go test binary peaks above 1 MiB")

	_, err = devenv.PeakRSS(1 << 30)
	assert.Error(t, err)
}

func TestFreePort(t *testing.T) {
	p, err := devenv.FreePort()
	require.NoError(t, err)
	assert.Greater(t, p, 0)
	assert.Less(t, p, 65536)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// startTree starts sh with a grandchild sleep (which ignores SIGTERM if
// stubborn) and returns the proc and the grandchild's pid.
func startTree(t *testing.T, stubborn bool) (*devenv.Proc, int, string) {
	t.Helper()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild.pid")
	logFile := filepath.Join(dir, "logs", "tree.log")
	trap := ""
	if stubborn {
		trap = `trap "" TERM; `
	}
	script := fmt.Sprintf(`echo hello from the tree; (%sexec sleep 300) & echo $! > %s.tmp; mv %s.tmp %s; wait`,
		trap, pidFile, pidFile, pidFile)
	p, err := devenv.StartProc("tree", exec.Command("/bin/sh", "-c", script), logFile)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(time.Second) })

	var grandchild int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		grandchild, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	require.True(t, alive(grandchild))
	assert.Nil(t, p.Err(), "still running")
	return p, grandchild, logFile
}

func TestProcStopKillsGroup(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inspects /proc")
	}
	p, grandchild, logFile := startTree(t, false)
	assert.Greater(t, p.Pid(), 0)

	start := time.Now()
	require.NoError(t, p.Stop(5*time.Second))
	assert.Less(t, time.Since(start), 4*time.Second, "SIGTERM should have been enough")
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	assert.Error(t, p.Err(), "killed by a signal")
	assert.False(t, alive(grandchild), "grandchild %d survived", grandchild)
	require.NoError(t, p.Stop(time.Second), "second Stop")

	b, err := os.ReadFile(logFile)
	require.NoError(t, err)
	assert.Contains(t, string(b), "=== ")
	assert.Contains(t, string(b), "starting tree")
	assert.Contains(t, string(b), "hello from the tree")
	assert.Contains(t, p.LogTail(10), "hello from the tree")
}

func TestProcStopKillsStubbornGrandchild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inspects /proc")
	}
	p, grandchild, _ := startTree(t, true)
	start := time.Now()
	require.NoError(t, p.Stop(300*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "needed the SIGKILL")
	assert.False(t, alive(grandchild), "grandchild %d survived SIGKILL", grandchild)
}

func TestProcExitsByItself(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "exit.log")
	p, err := devenv.StartProc("exit3", exec.Command("/bin/sh", "-c", "echo bye; exit 3"), logFile)
	require.NoError(t, err)
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("process did not exit")
	}
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Err(), &exitErr)
	assert.Equal(t, 3, exitErr.ExitCode())
	require.NoError(t, p.Stop(time.Second))

	// The log is appended to, and LogTail only shows this run.
	p2, err := devenv.StartProc("again", exec.Command("/bin/sh", "-c", "echo second"), logFile)
	require.NoError(t, err)
	<-p2.Done()
	tail := p2.LogTail(10)
	assert.Contains(t, tail, "second")
	assert.NotContains(t, tail, "bye")
	b, err := os.ReadFile(logFile)
	require.NoError(t, err)
	assert.Contains(t, string(b), "bye")
}

func TestStartProcMissingBinary(t *testing.T) {
	_, err := devenv.StartProc("nope", exec.Command("/nonexistent/anneal-binary"), filepath.Join(t.TempDir(), "x.log"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nope")
}

func TestProcKill(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inspects /proc")
	}
	p, grandchild, _ := startTree(t, true) // ignores SIGTERM: Kill must not need it
	start := time.Now()
	require.NoError(t, p.Kill())
	assert.Less(t, time.Since(start), 2*time.Second, "SIGKILL at once, no grace")
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Kill")
	}
	require.Error(t, p.Err())
	assert.Contains(t, p.Err().Error(), "killed")
	assert.False(t, alive(grandchild), "grandchild %d survived", grandchild)
	require.NoError(t, p.Stop(time.Second), "Stop after Kill")
}
