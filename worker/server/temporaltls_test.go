package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTemporalTLSConfig: no flag is a plain connection; an API key or any
// TLS flag turns TLS on; a half mTLS pair and a file without a certificate
// are refused naming the flag.
func TestTemporalTLSConfig(t *testing.T) {
	cfg, err := TemporalTLS{}.config()
	require.NoError(t, err)
	assert.Nil(t, cfg, "plain by default")

	cfg, err = TemporalTLS{APIKey: "k"}.config()
	require.NoError(t, err)
	require.NotNil(t, cfg, "an API key implies TLS")
	assert.Nil(t, cfg.RootCAs, "the system's roots")

	cfg, err = TemporalTLS{ServerName: "temporal.example"}.config()
	require.NoError(t, err)
	assert.Equal(t, "temporal.example", cfg.ServerName)

	_, err = TemporalTLS{CertFile: "c.pem"}.config()
	assert.ErrorContains(t, err, "-temporal-tls-key")

	bad := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate"), 0o600))
	_, err = TemporalTLS{CAFile: bad}.config()
	assert.ErrorContains(t, err, "-temporal-tls-ca")
}
