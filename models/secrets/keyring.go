// Package secrets holds what anneal needs to keep secret values secret: a
// keyring of AES-256-GCM keys that seals values at rest (and, through
// secrets/codec, every Temporal payload), and a Redactor that replaces known
// secret values in text with Redacted. It imports only the standard library,
// so that the agent binary can redact with it too.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of an AES-256 key in bytes.
const KeySize = 32

// EnvKey names the environment variable holding the keys when no key file
// is given: base64 keys separated by commas or white space, the first one
// encrypting.
const EnvKey = "ANNEAL_SECRET_KEY"

// Key is one AES-256-GCM key and its id. The id is derived from the key
// (a hash), so that operators never have to name keys and a ciphertext
// always says which key sealed it.
type Key struct {
	ID   string
	aead cipher.AEAD
}

// Keyring holds the keys a process knows: the first one seals, every one
// opens (rotation: put the new key first, keep the old ones until
// everything was re-sealed with the new one).
type Keyring struct {
	keys []Key
}

// NewKeyring makes a keyring of raw 32-byte keys, the first one sealing.
func NewKeyring(raw ...[]byte) (*Keyring, error) {
	if len(raw) == 0 {
		return nil, errors.New("no secret key")
	}
	k := &Keyring{}
	seen := map[string]bool{}
	for i, r := range raw {
		if len(r) != KeySize {
			return nil, fmt.Errorf("secret key %d is %d bytes; it must be %d (base64 of 32 random bytes: head -c32 /dev/urandom | base64)", i+1, len(r), KeySize)
		}
		block, err := aes.NewCipher(r)
		if err != nil {
			return nil, fmt.Errorf("secret key %d: %w", i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("secret key %d: %w", i+1, err)
		}
		id := KeyID(r)
		if seen[id] {
			continue
		}
		seen[id] = true
		k.keys = append(k.keys, Key{ID: id, aead: aead})
	}
	return k, nil
}

// KeyID derives the id of a raw key: the first 8 bytes of a SHA-256 over a
// fixed label and the key, in hex. It reveals nothing usable about the key.
func KeyID(raw []byte) string {
	sum := sha256.Sum256(append([]byte("anneal secret key id\x00"), raw...))
	return hex.EncodeToString(sum[:8])
}

// ParseKeys reads keys written as base64 (standard or URL encoding),
// separated by commas, spaces or newlines; lines starting with # are
// comments. The first key seals.
func ParseKeys(text string) (*Keyring, error) {
	var raw [][]byte
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, f := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			b, err := decodeKey(f)
			if err != nil {
				return nil, fmt.Errorf("secret key %d: %w", len(raw)+1, err)
			}
			raw = append(raw, b)
		}
	}
	return NewKeyring(raw...)
}

func decodeKey(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

// Load reads the keyring from file when it is not empty, else from the
// environment variable EnvKey. Neither set is an error saying how to set
// one.
func Load(file string) (*Keyring, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("secret key file: %w", err)
		}
		k, err := ParseKeys(string(b))
		if err != nil {
			return nil, fmt.Errorf("secret key file %s: %w", file, err)
		}
		return k, nil
	}
	if v := os.Getenv(EnvKey); v != "" {
		k, err := ParseKeys(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvKey, err)
		}
		return k, nil
	}
	return nil, fmt.Errorf("no secret key: give -secret-key-file FILE or set %s to base64 of 32 random bytes (head -c32 /dev/urandom | base64)", EnvKey)
}

// GenerateKey returns a fresh random key in base64, as ParseKeys reads it.
func GenerateKey() string {
	b := make([]byte, KeySize)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on supported systems
	}
	return base64.StdEncoding.EncodeToString(b)
}

// PrimaryID is the id of the key that seals.
func (k *Keyring) PrimaryID() string { return k.keys[0].ID }

// IDs lists the ids of the keys, the sealing one first.
func (k *Keyring) IDs() []string {
	out := make([]string, len(k.keys))
	for i, key := range k.keys {
		out[i] = key.ID
	}
	return out
}

// Seal encrypts plaintext with the first key; aad binds the ciphertext to
// its place (e.g. the deployment and name of a secret), so that it cannot
// be moved to another. The result is the nonce followed by the ciphertext.
func (k *Keyring) Seal(plaintext, aad []byte) (keyID string, sealed []byte, err error) {
	key := k.keys[0]
	nonce := make([]byte, key.aead.NonceSize(), key.aead.NonceSize()+len(plaintext)+key.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, fmt.Errorf("nonce: %w", err)
	}
	return key.ID, key.aead.Seal(nonce, nonce, plaintext, aad), nil
}

// ErrUnknownKey means a ciphertext was sealed with a key this keyring does
// not hold.
var ErrUnknownKey = errors.New("sealed with a key this process does not have")

// Open decrypts what Seal returned, with the key of id keyID.
func (k *Keyring) Open(keyID string, sealed, aad []byte) ([]byte, error) {
	for _, key := range k.keys {
		if key.ID != keyID {
			continue
		}
		n := key.aead.NonceSize()
		if len(sealed) < n+key.aead.Overhead() {
			return nil, errors.New("ciphertext too short")
		}
		out, err := key.aead.Open(nil, sealed[:n], sealed[n:], aad)
		if err != nil {
			return nil, fmt.Errorf("decrypt with key %s: %w", keyID, err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("key %s: %w (known: %s)", keyID, ErrUnknownKey, strings.Join(k.IDs(), ", "))
}
