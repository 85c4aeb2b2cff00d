package models

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Principal is who a bearer token belongs to: an operator token (admin or
// enroll scope) or one node's agent.
type Principal struct {
	Scope  string // ScopeAdmin, ScopeEnroll, or "" for an agent
	NodeID int64  // set for an agent
	Name   string // token name or node name, for logs
}

// IsAgent reports whether the principal is a node's agent.
func (p Principal) IsAgent() bool { return p.NodeID != 0 }

// NewSecret returns a fresh random token with a readable prefix.
func NewSecret(prefix string) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashSecret is how tokens are stored: a SHA-256 hex digest (tokens are long
// random strings, so a slow hash buys nothing).
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// CreateAPIToken stores a new operator token and returns its secret, which
// is shown once.
func (s *Store) CreateAPIToken(ctx context.Context, name, scope string) (string, error) {
	if scope != ScopeAdmin && scope != ScopeEnroll {
		return "", Invalid("scope", "must be %q or %q", ScopeAdmin, ScopeEnroll)
	}
	secret := NewSecret("ann_")
	tok := APIToken{Name: name, Scope: scope, TokenHash: HashSecret(secret)}
	if err := s.DB.WithContext(ctx).Create(&tok).Error; err != nil {
		return "", fmt.Errorf("create api token %q: %w", name, err)
	}
	return secret, nil
}

// ImportAPIToken stores a token whose secret the caller already has (the dev
// environment keeps its token across restarts). Importing twice is harmless.
func (s *Store) ImportAPIToken(ctx context.Context, name, scope, secret string) error {
	tok := APIToken{Name: name, Scope: scope, TokenHash: HashSecret(secret)}
	err := s.DB.WithContext(ctx).Where("token_hash = ?", tok.TokenHash).FirstOrCreate(&tok).Error
	if err != nil {
		return fmt.Errorf("import api token %q: %w", name, err)
	}
	return nil
}

// Authenticate resolves a bearer token to its principal.
func (s *Store) Authenticate(ctx context.Context, secret string) (Principal, error) {
	if secret == "" {
		return Principal{}, ErrForbidden
	}
	hash := HashSecret(secret)
	db := s.DB.WithContext(ctx)
	if strings.HasPrefix(secret, "ann_") {
		var tok APIToken
		err := db.Where("token_hash = ?", hash).Take(&tok).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return Principal{}, ErrForbidden
		}
		if err != nil {
			return Principal{}, fmt.Errorf("authenticate: %w", err)
		}
		return Principal{Scope: tok.Scope, Name: tok.Name}, nil
	}
	var node Node
	err := db.Select("id", "name").Where("agent_token_hash = ?", hash).Take(&node).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Principal{}, ErrForbidden
	}
	if err != nil {
		return Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	return Principal{NodeID: node.ID, Name: node.Name}, nil
}

func Now() time.Time { return time.Now().UTC() }

// ResetAgentCredential gives an existing node a new agent credential (the
// old one stops working) and returns it, for a machine re-provisioned
// without its credential file.
func (s *Store) ResetAgentCredential(ctx context.Context, name string) (*Node, string, error) {
	node, err := s.Node(ctx, name)
	if err != nil {
		return nil, "", err
	}
	secret := NewSecret("agt_")
	hash := HashSecret(secret)
	if err := s.DB.WithContext(ctx).Model(node).Update("agent_token_hash", hash).Error; err != nil {
		return nil, "", fmt.Errorf("reset the credential of node %s: %w", name, err)
	}
	return node, secret, nil
}
