package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// EnvChromium names a Chromium or Chrome binary to use instead of looking
// for one.
const EnvChromium = "ANNEAL_CHROMIUM"

// chromiumNames are the browser binaries FindChromium looks for, in order.
var chromiumNames = []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// ChromiumHelp says exactly what to install when no browser is found.
func ChromiumHelp() string {
	switch {
	case runtime.GOOS == "darwin":
		return "install Chromium (brew install --cask chromium) or Google Chrome, or set " + EnvChromium + " to the browser's binary"
	case fileExists("/etc/debian_version") && !isUbuntu():
		return "install Debian's chromium package (as root: apt-get update && apt-get install chromium), or set " + EnvChromium + " to a Chromium or Chrome binary"
	case isUbuntu():
		return "install Chromium (as root: apt-get update && apt-get install chromium-browser, which is a snap on Ubuntu), or set " + EnvChromium + " to a Chromium or Chrome binary"
	}
	return "install Chromium or Google Chrome with your system's package manager, or set " + EnvChromium + " to the browser's binary"
}

// FindChromium returns the path of a Chromium or Chrome binary: the one
// $ANNEAL_CHROMIUM names, else the first of /usr/bin/chromium, chromium,
// chromium-browser, google-chrome on PATH.
func FindChromium() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
		return "", fmt.Errorf("%s=%s is not an executable", EnvChromium, p)
	}
	for _, name := range chromiumNames {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no Chromium found (looked for %s on PATH and $%s): %s", strings.Join(chromiumNames, ", "), EnvChromium, ChromiumHelp())
}

// EnsureChromium finds Chromium (FindChromium) or, when running as root on
// a system with apt-get, installs Debian's chromium package (apt-get update
// first). Otherwise its error says exactly what to install.
func EnsureChromium(ctx context.Context, log *slog.Logger) (string, error) {
	path, err := FindChromium()
	if err == nil || os.Getenv(EnvChromium) != "" {
		return path, err
	}
	aptGet, aptErr := exec.LookPath("apt-get")
	if os.Geteuid() != 0 || aptErr != nil || !fileExists("/etc/debian_version") || isUbuntu() {
		return "", err
	}
	log.Info("no Chromium found; installing Debian's chromium package with apt-get (a few minutes, once)")
	start := time.Now()
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "chromium"}} {
		cmd := exec.CommandContext(ctx, aptGet, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, runErr := cmd.CombinedOutput(); runErr != nil {
			return "", fmt.Errorf("apt-get %s: %w\n%s\n%s", strings.Join(args, " "), runErr, tail(string(out), 15), ChromiumHelp())
		}
	}
	path, err = FindChromium()
	if err != nil {
		return "", errors.New("apt-get installed chromium but it is not on PATH: " + ChromiumHelp())
	}
	log.Info("installed Chromium", "path", path, "took", time.Since(start).Round(time.Second))
	return path, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// isUbuntu reports an Ubuntu system, whose chromium package is a snap
// wrapper that headless tests cannot rely on.
func isUbuntu() bool {
	b, err := os.ReadFile("/etc/os-release")
	return err == nil && strings.Contains(strings.ToLower(string(b)), "id=ubuntu")
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
