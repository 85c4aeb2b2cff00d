package testenv

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// Environment variables of the ssh jig's tests, set by `go run ./dev test`.
const (
	EnvSSHD        = "ANNEAL_TEST_SSHD"         // path of OpenSSH's sshd
	EnvSSHDMissing = "ANNEAL_TEST_SSHD_MISSING" // why there is none: what to install
)

// SSHD is a real OpenSSH server started for one test on 127.0.0.1 and a
// free port, with a throwaway host key and one authorized client key; it
// logs in the user running the test.
type SSHD struct {
	Host string
	Port int
	User string
	// HostKey is the server's public host key; KnownHostsLine is it as a
	// known_hosts line.
	HostKey        ssh.PublicKey
	KnownHostsLine string
	// ClientKey is the authorized client's private key (OpenSSH PEM).
	ClientKey string
	cmd       *exec.Cmd
	exited    chan struct{}
}

// StartSSHD starts sshd (`sshd -D -f <config> -e`) and waits until it
// accepts connections; it is stopped when the test ends.
func StartSSHD(t testing.TB) *SSHD {
	t.Helper()
	path := os.Getenv(EnvSSHD)
	if path == "" {
		if why := os.Getenv(EnvSSHDMissing); why != "" {
			t.Fatalf("no sshd for the ssh jig's tests: %s", why)
		}
		path = need(t, EnvSSHD)
	}
	dir := t.TempDir()
	hostPub, hostPEM := newKey(t)
	clientPub, clientPEM := newKey(t)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	hostKeyPath := write("host_key", hostPEM)
	authKeys := write("authorized_keys", string(ssh.MarshalAuthorizedKey(clientPub)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	u, err := user.Current()
	require.NoError(t, err)
	config := write("sshd_config", fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s
PidFile %s
AuthorizedKeysFile %s
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers %s
LogLevel VERBOSE
`, port, hostKeyPath, filepath.Join(dir, "sshd.pid"), authKeys, u.Username))
	if os.Geteuid() == 0 {
		// sshd's privilege separation directory (Debian's package
		// creates it at boot, which a container never has).
		require.NoError(t, os.MkdirAll("/run/sshd", 0o755))
	}
	s := &SSHD{Host: "127.0.0.1", Port: port, User: u.Username, HostKey: hostPub, ClientKey: clientPEM, exited: make(chan struct{})}
	s.KnownHostsLine = fmt.Sprintf("[127.0.0.1]:%d %s", port, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(hostPub))))
	s.cmd = exec.Command(path, "-D", "-f", config, "-e")
	w := &testWriter{t: t}
	t.Cleanup(func() { w.done.Store(true) })
	s.cmd.Stdout, s.cmd.Stderr = w, w
	require.NoError(t, s.cmd.Start(), "start %s", path)
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.Kill)
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 15*time.Second, 50*time.Millisecond, "sshd did not listen on %s", s.Addr())
	return s
}

// Addr is host:port.
func (s *SSHD) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Kill SIGKILLs the server and every process it started (the connections'
// sessions and their commands), like a machine dying.
func (s *SSHD) Kill() {
	s.signalAll(syscall.SIGKILL)
	<-s.exited
}

// Freeze SIGSTOPs the server and its sessions: connections stay open but
// nothing answers, like a machine hung or cut off by a network partition.
func (s *SSHD) Freeze() { s.signalAll(syscall.SIGSTOP) }

// Thaw resumes a frozen server.
func (s *SSHD) Thaw() { s.signalAll(syscall.SIGCONT) }

func (s *SSHD) signalAll(sig syscall.Signal) {
	if s.cmd.Process == nil {
		return
	}
	for _, pid := range descendants(s.cmd.Process.Pid) {
		_ = syscall.Kill(pid, sig)
	}
	_ = syscall.Kill(s.cmd.Process.Pid, sig)
}

// descendants lists the processes below pid, from /proc.
func descendants(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		i := strings.LastIndexByte(string(data), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			parent[p] = pp
		}
	}
	var out []int
	frontier := []int{pid}
	for len(frontier) > 0 {
		next := []int{}
		for p, pp := range parent {
			for _, f := range frontier {
				if pp == f {
					out = append(out, p)
					next = append(next, p)
				}
			}
		}
		frontier = next
	}
	return out
}

// newKey makes an ed25519 key pair: the public key and the private key in
// OpenSSH PEM.
func newKey(t testing.TB) (ssh.PublicKey, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return sp, string(pem.EncodeToMemory(block))
}

// NewSSHKey makes a throwaway ed25519 key pair (public key, private key in
// OpenSSH PEM), e.g. a host key that is not the server's.
func NewSSHKey(t testing.TB) (ssh.PublicKey, string) { return newKey(t) }
