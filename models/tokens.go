package models

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Principal is who a bearer token belongs to: an operator token (of one of
// Scopes) or one node's agent.
type Principal struct {
	Scope   string // one of Scopes, or "" for an agent
	NodeID  int64  // set for an agent
	TokenID int64  // set for an operator token
	Name    string // token name or node name, for logs
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
	_, secret, err := s.CreateToken(ctx, name, scope)
	return secret, err
}

// maxTokenName bounds a token's name, which is only a label.
const maxTokenName = 200

// CreateToken stores a new operator token of a scope and returns it with its
// secret, which is shown once (only its hash is kept).
func (s *Store) CreateToken(ctx context.Context, name, scope string) (*APIToken, string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return nil, "", Invalid("name", "is required: say what the token is for, e.g. \"ci\" or \"rack-3 pxe\"")
	}
	if len(name) > maxTokenName {
		return nil, "", Invalid("name", "is %d characters long; at most %d", len(name), maxTokenName)
	}
	if !slices.Contains(Scopes, scope) {
		return nil, "", Invalid("scope", "%q is not one of %s", scope, strings.Join(Scopes, ", "))
	}
	secret := NewSecret("ann_")
	tok := APIToken{Name: name, Scope: scope, TokenHash: HashSecret(secret)}
	if err := s.DB.WithContext(ctx).Create(&tok).Error; err != nil {
		return nil, "", fmt.Errorf("create api token %q: %w", name, err)
	}
	return &tok, secret, nil
}

// Tokens lists the operator tokens, newest first (keyset on id), never
// their secrets. next is the cursor of the following page, "" at the end.
func (s *Store) Tokens(ctx context.Context, page Page) (items []APIToken, next string, err error) {
	q := s.DB.WithContext(ctx).Order("id DESC").Limit(page.PageLimit() + 1)
	if page.Cursor != "" {
		var after int64
		if err := DecodeCursor(page.Cursor, &after); err != nil {
			return nil, "", err
		}
		q = q.Where("id < ?", after)
	}
	if err := q.Find(&items).Error; err != nil {
		return nil, "", fmt.Errorf("list api tokens: %w", err)
	}
	if len(items) > page.PageLimit() {
		items = items[:page.PageLimit()]
		next = EncodeCursor(items[len(items)-1].ID)
	}
	return items, next, nil
}

// RevokeToken deletes an operator token and returns it (its hash lets the
// caller forget it from caches).
func (s *Store) RevokeToken(ctx context.Context, id int64) (*APIToken, error) {
	var tok APIToken
	res := s.DB.WithContext(ctx).Clauses(clause.Returning{}).Where("id = ?", id).Delete(&tok)
	if res.Error != nil {
		return nil, fmt.Errorf("revoke api token %d: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return nil, NotFound("token", id)
	}
	return &tok, nil
}

// BootstrapAdminToken stores secret as an admin token named name if no
// admin token exists yet, so that a fresh install can be driven without
// writing to the database by hand; it reports whether it did. Servers
// starting together agree through an advisory lock: one stores it.
func (s *Store) BootstrapAdminToken(ctx context.Context, name, secret string) (bool, error) {
	if !strings.HasPrefix(secret, "ann_") || len(secret) < 24 {
		return false, Invalid("bootstrap token", "must start with \"ann_\" and be at least 24 characters long (e.g. ann_ and 32 random base64url characters)")
	}
	created := false
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(hashtext('anneal bootstrap token'))").Error; err != nil {
			return fmt.Errorf("lock for the bootstrap token: %w", err)
		}
		var n int64
		if err := tx.Model(&APIToken{}).Where("scope = ?", ScopeAdmin).Count(&n).Error; err != nil {
			return fmt.Errorf("count admin tokens: %w", err)
		}
		if n > 0 {
			return nil
		}
		tok := APIToken{Name: name, Scope: ScopeAdmin, TokenHash: HashSecret(secret)}
		if err := tx.Create(&tok).Error; err != nil {
			return fmt.Errorf("store the bootstrap token: %w", err)
		}
		created = true
		return nil
	})
	return created, err
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
		// Callers cache a verified token for a few seconds, so this write
		// happens at most that often per token and server.
		if err := db.Model(&tok).UpdateColumn("last_used_at", Now()).Error; err != nil {
			return Principal{}, fmt.Errorf("authenticate: record the token's use: %w", err)
		}
		return Principal{Scope: tok.Scope, Name: tok.Name, TokenID: tok.ID}, nil
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
