package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
)

// sshdPaths are where OpenSSH's server is looked for first.
var sshdPaths = []string{"/usr/sbin/sshd", "/usr/local/sbin/sshd"}

// ErrNoSSHD says that no sshd was found and none could be installed; its
// text says what to install.
var ErrNoSSHD = errors.New("OpenSSH's sshd was not found (the ssh jig's tests start one): install it, e.g. `apt-get install openssh-server` on Debian or Ubuntu, `dnf install openssh-server` on Fedora")

// FindSSHD returns the path of OpenSSH's sshd: /usr/sbin/sshd, else the
// one on PATH. When there is none and the process is root on a system with
// apt-get (Debian, Ubuntu), it installs Debian's openssh-server (apt-get
// update first); otherwise it returns ErrNoSSHD, which says what to install.
func FindSSHD(ctx context.Context, log *slog.Logger) (string, error) {
	if p := lookSSHD(); p != "" {
		return p, nil
	}
	apt, err := exec.LookPath("apt-get")
	if err != nil || os.Geteuid() != 0 {
		return "", ErrNoSSHD
	}
	log.Info("sshd not found: installing openssh-server with apt-get (once)")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", "openssh-server"}} {
		cmd := exec.CommandContext(ctx, apt, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get %s: %v: %s (%w)", args[0], err, lastLines(out), ErrNoSSHD)
		}
	}
	if p := lookSSHD(); p != "" {
		return p, nil
	}
	return "", ErrNoSSHD
}

func lookSSHD() string {
	for _, p := range sshdPaths {
		if isExecutable(p) {
			return p
		}
	}
	if p, err := exec.LookPath("sshd"); err == nil {
		return p
	}
	return ""
}

// lastLines keeps the end of a command's output for an error.
func lastLines(out []byte) string {
	if len(out) > 400 {
		out = out[len(out)-400:]
	}
	return string(out)
}
