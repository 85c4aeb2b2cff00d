package secrets

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeyringSealOpenAndRotation(t *testing.T) {
	oldKey, newKey := GenerateKey(), GenerateKey()
	old, err := ParseKeys(oldKey)
	require.NoError(t, err)
	id, sealed, err := old.Seal([]byte("hunter22"), []byte("dep 1/db"))
	require.NoError(t, err)
	assert.Equal(t, old.PrimaryID(), id)
	assert.NotContains(t, string(sealed), "hunter22")

	// The wrong place (aad) does not open.
	_, err = old.Open(id, sealed, []byte("dep 2/db"))
	require.Error(t, err)

	// Rotated: the new key seals, the old one still opens.
	rotated, err := ParseKeys("# new first\n" + newKey + "\n" + oldKey + "\n")
	require.NoError(t, err)
	assert.Equal(t, []string{KeyID(mustB64(t, newKey)), id}, rotated.IDs())
	plain, err := rotated.Open(id, sealed, []byte("dep 1/db"))
	require.NoError(t, err)
	assert.Equal(t, "hunter22", string(plain))
	id2, _, err := rotated.Seal([]byte("x"), nil)
	require.NoError(t, err)
	assert.NotEqual(t, id, id2)

	// Without the old key it cannot.
	only, err := ParseKeys(newKey)
	require.NoError(t, err)
	_, err = only.Open(id, sealed, []byte("dep 1/db"))
	assert.True(t, errors.Is(err, ErrUnknownKey), "%v", err)
}

func TestParseKeysRefusesBadKeys(t *testing.T) {
	_, err := ParseKeys("")
	assert.ErrorContains(t, err, "no secret key")
	_, err = ParseKeys(base64.StdEncoding.EncodeToString([]byte("short")))
	assert.ErrorContains(t, err, "must be 32")
	_, err = ParseKeys("!!!")
	assert.ErrorContains(t, err, "not base64")
	t.Setenv(EnvKey, "")
	_, err = Load("")
	assert.ErrorContains(t, err, "-secret-key-file")
}

func TestRedactor(t *testing.T) {
	r := NewRedactor("s3cret-pass", "s3cret", "")
	assert.Equal(t, "a *** b *** c", r.String("a s3cret-pass b s3cret c"))
	assert.True(t, r.Contains("xx s3cret"))
	assert.Equal(t, map[string]any{"k": []any{"***", 1.0}, "***": "ok"},
		r.Value(map[string]any{"k": []any{"s3cret", 1.0}, "s3cret": "ok"}))
	var none *Redactor
	assert.Equal(t, "s3cret", none.String("s3cret"))
	assert.True(t, NewRedactor("").Empty())
	assert.False(t, strings.Contains(r.String(strings.Repeat("s3cret", 3)), "s3cret"))
}

func mustB64(t *testing.T, s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	return b
}
