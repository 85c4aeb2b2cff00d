package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows/codec"
)

// temporalConn holds the flags that say which Temporal namespace a command
// talks to: a running `dev up`, or an external cluster.
type temporalConn struct {
	address, namespace, taskQueue string
	apiKey                        string
	tls                           bool
	tlsCert, tlsKey, tlsCA        string
	tlsServerName                 string
	// secretKeyFile holds the installation's secret keys, which decode its
	// encrypted payloads.
	secretKeyFile string
	keys          *secrets.Keyring
}

// addFlags declares the connection flags on fs. The address defaults to
// TEMPORAL_ADDRESS, then the TEMPORAL_ADDRESS of .dev/env (a `dev up`),
// then 127.0.0.1:7233.
func (t *temporalConn) addFlags(fs *flag.FlagSet, state string, withQueue bool) {
	fs.StringVar(&t.address, "address", defaultTemporalAddress(state), "Temporal frontend host:port (default $TEMPORAL_ADDRESS, else .dev/env, else 127.0.0.1:7233)")
	fs.StringVar(&t.namespace, "namespace", envOr("TEMPORAL_NAMESPACE", client.DefaultNamespace), "Temporal namespace (default $TEMPORAL_NAMESPACE, else default)")
	if withQueue {
		fs.StringVar(&t.taskQueue, "task-queue", "anneal", `anneal's task queue: only this installation's executions ("" for the whole namespace)`)
	}
	fs.StringVar(&t.apiKey, "api-key", os.Getenv("TEMPORAL_API_KEY"), "API key (default $TEMPORAL_API_KEY; implies --tls)")
	fs.BoolVar(&t.tls, "tls", false, "connect with TLS")
	fs.StringVar(&t.tlsCert, "tls-cert", "", "client certificate for mTLS (PEM; implies --tls)")
	fs.StringVar(&t.tlsKey, "tls-key", "", "client key for mTLS (PEM)")
	fs.StringVar(&t.tlsCA, "tls-ca", "", "CA certificate to verify the server with (PEM; default: the system's)")
	fs.StringVar(&t.tlsServerName, "tls-server-name", "", "server name to verify (default: the address's host)")
	fs.StringVar(&t.secretKeyFile, "secret-key-file", defaultSecretKeyFile(state), "the installation's secret keys, to read its encrypted payloads (default $ANNEAL_SECRET_KEY, else .dev/secret.key)")
}

// defaultSecretKeyFile is .dev/secret.key when `dev up` wrote one and
// ANNEAL_SECRET_KEY is not set.
func defaultSecretKeyFile(state string) string {
	if os.Getenv(secrets.EnvKey) != "" {
		return ""
	}
	p := filepath.Join(state, devSecretKeyFile)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// dial connects to the namespace.
func (t *temporalConn) dial(ctx context.Context) (client.Client, error) {
	if t.secretKeyFile != "" || os.Getenv(secrets.EnvKey) != "" {
		keys, err := secrets.Load(t.secretKeyFile)
		if err != nil {
			return nil, err
		}
		t.keys = keys
	}
	opts := client.Options{
		HostPort: t.address, Namespace: t.namespace,
		Logger:        sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
		DataConverter: codec.DataConverter(t.keys), FailureConverter: codec.FailureConverter(t.keys),
	}
	if t.tls || t.apiKey != "" || t.tlsCert != "" || t.tlsCA != "" {
		cfg := &tls.Config{ServerName: t.tlsServerName, MinVersion: tls.VersionTLS12}
		if t.tlsCert != "" || t.tlsKey != "" {
			if t.tlsCert == "" || t.tlsKey == "" {
				return nil, errors.New("--tls-cert and --tls-key go together")
			}
			cert, err := tls.LoadX509KeyPair(t.tlsCert, t.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		if t.tlsCA != "" {
			pem, err := os.ReadFile(t.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca: no PEM certificate in %s", t.tlsCA)
			}
			cfg.RootCAs = pool
		}
		opts.ConnectionOptions.TLS = cfg
	}
	if t.apiKey != "" {
		opts.Credentials = client.NewAPIKeyStaticCredentials(t.apiKey)
	}
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s (namespace %s): %w", t.address, t.namespace, err)
	}
	return c, nil
}

// defaultTemporalAddress is TEMPORAL_ADDRESS, else the one `dev up` wrote
// to .dev/env, else the dev server's default.
func defaultTemporalAddress(state string) string {
	if v := os.Getenv(devenv.EnvTemporalAddress); v != "" {
		return v
	}
	if f, err := os.Open(filepath.Join(state, "env")); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimPrefix(sc.Text(), "export "), devenv.EnvTemporalAddress+"="); ok && v != "" {
				return strings.Trim(v, `'"`)
			}
		}
	}
	return fmt.Sprintf("127.0.0.1:%d", devenv.DefaultTemporalPort)
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// flagError turns a flag parsing error into the exit status: 0 for -h
// (the usage was printed), 2 otherwise (the error was printed).
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return &exitError{code: 0}
	}
	return &exitError{code: 2}
}
