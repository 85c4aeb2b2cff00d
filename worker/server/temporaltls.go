package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TemporalTLS says how the server connects to an external Temporal
// cluster: plain TLS, mutual TLS with a client certificate, a private CA,
// and/or an API key (Temporal Cloud). The zero value is a plain connection.
type TemporalTLS struct {
	// Enabled connects with TLS (implied by every other field).
	Enabled bool
	// CertFile and KeyFile are the client certificate and key (PEM) for
	// mutual TLS; both or neither.
	CertFile, KeyFile string
	// CAFile is the CA certificate (PEM) that signed the server's; empty:
	// the system's roots.
	CAFile string
	// ServerName is the name to verify the server's certificate against;
	// empty: the address's host.
	ServerName string
	// APIKey authenticates with an API key (it implies TLS).
	APIKey string
}

// config returns the TLS configuration, nil for a plain connection.
func (t TemporalTLS) config() (*tls.Config, error) {
	if !t.Enabled && t.CertFile == "" && t.KeyFile == "" && t.CAFile == "" && t.ServerName == "" && t.APIKey == "" {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	if t.CertFile != "" || t.KeyFile != "" {
		if t.CertFile == "" || t.KeyFile == "" {
			return nil, errors.New("-temporal-tls-cert and -temporal-tls-key go together")
		}
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("-temporal-tls-cert/-temporal-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("-temporal-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-temporal-tls-ca: no PEM certificate in %s", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
