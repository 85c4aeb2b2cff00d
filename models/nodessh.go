package models

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Redacted stands for a secret in API answers.
const Redacted = "***"

// Defaults of a node's SSH settings.
const (
	DefaultSSHUser = "root"
	DefaultSSHPort = 22
)

// NodeSSH is how the worker reaches a node over SSH (the ssh jig): user,
// port, host, private key and the pinned host keys. The private key is a
// secret: it is stored sealed with the secret keyring (KeyID, SealedKey),
// leaves the store in the clear only for the worker (NodeSSH fills
// PrivateKey), and never in an API answer (NodeSSHView).
type NodeSSH struct {
	NodeID int64  `json:"node_id" gorm:"primaryKey;autoIncrement:false"`
	User   string `json:"user" gorm:"column:ssh_user"`
	Port   int    `json:"port"`
	Host   string `json:"host"`
	// PrivateKey is the key in the clear, in memory only: NodeSSH opens it
	// for the worker, SetNodeSSH seals it.
	PrivateKey string `json:"-" gorm:"-"`
	// KeyID names the key of the keyring that sealed SealedKey.
	KeyID string `json:"-"`
	// SealedKey is the private key sealed under nodeKeyAAD (nil: none).
	SealedKey []byte `json:"-"`
	// PlainKey is node_ssh.private_key, a key stored in the clear before
	// keys were sealed (migration 0023); SealPlainNodeKeys seals it.
	PlainKey   string    `json:"-" gorm:"column:private_key"`
	KnownHosts string    `json:"known_hosts"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// HasKey reports whether the settings hold a private key, sealed, plain or
// in memory.
func (s *NodeSSH) HasKey() bool {
	return len(s.SealedKey) > 0 || s.PlainKey != "" || s.PrivateKey != ""
}

// WithSSHKey narrows a query on node_ssh to the nodes that have a private
// key (sealed, or plain from before keys were sealed): the nodes the
// worker reaches over SSH. Use it as a gorm scope.
func WithSSHKey(db *gorm.DB) *gorm.DB {
	return db.Where("(node_ssh.sealed_key IS NOT NULL OR node_ssh.private_key <> '')")
}

// ErrSSHKeyUnreadable means a node's sealed SSH key cannot be opened: this
// process lacks the key that sealed it, or it was tampered with. Retrying
// does not help.
var ErrSSHKeyUnreadable = errors.New("its SSH key cannot be opened")

// nodeKeyAAD binds a sealed SSH key to its node, so that it cannot be
// copied to another node's row.
func nodeKeyAAD(nodeID int64) []byte {
	return fmt.Appendf(nil, "anneal ssh key node %d", nodeID)
}

// TableName is node_ssh.
func (NodeSSH) TableName() string { return "node_ssh" }

// NodeSSHInput is PUT /nodes/:id/ssh: a field left out keeps its current
// value (or its default on the first PUT), so the host keys can be changed
// without sending the key again. An empty known_hosts forgets the pinned
// keys: the next connection records the key it meets (first use).
type NodeSSHInput struct {
	User       *string `json:"user"`
	Port       *int    `json:"port"`
	Host       *string `json:"host"`
	PrivateKey *string `json:"private_key"`
	KnownHosts *string `json:"known_hosts"`
}

// NodeSSHView is a node's SSH settings as the API shows them: the private
// key only as "***" when set, the pinned keys with their SHA-256
// fingerprints.
type NodeSSHView struct {
	Node         string    `json:"node"`
	User         string    `json:"user"`
	Port         int       `json:"port"`
	Host         string    `json:"host"`
	PrivateKey   string    `json:"private_key"`
	KnownHosts   string    `json:"known_hosts"`
	Fingerprints []string  `json:"fingerprints"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// View redacts s for the API.
func (s *NodeSSH) View(node string) *NodeSSHView {
	v := &NodeSSHView{Node: node, User: s.User, Port: s.Port, Host: s.Host, KnownHosts: s.KnownHosts, UpdatedAt: s.UpdatedAt, Fingerprints: []string{}}
	if s.HasKey() {
		v.PrivateKey = Redacted
	}
	keys, _ := ParseKnownHosts(s.KnownHosts)
	for _, k := range keys {
		v.Fingerprints = append(v.Fingerprints, k.Type()+" "+ssh.FingerprintSHA256(k))
	}
	return v
}

// ParseKnownHosts reads the host keys of known_hosts lines (OpenSSH's
// format: "host[,host...] keytype base64 [comment]"; blank lines and #
// comments skipped). The host patterns are not matched: the lines are the
// node's own, whatever name or address they were recorded under.
func ParseKnownHosts(text string) ([]ssh.PublicKey, error) {
	var keys []ssh.PublicKey
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		marker, _, key, _, _, err := ssh.ParseKnownHosts([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", i+1, err)
		}
		if marker == "@revoked" {
			continue
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// validateSSH checks the settings after the input was applied; the private
// key only when one was given (a stored one was checked when it was set).
func validateSSH(s *NodeSSH) error {
	if err := ValidLine("user", s.User, 255); err != nil {
		return err
	}
	if strings.TrimSpace(s.User) == "" || strings.ContainsAny(s.User, " \t") {
		return Invalid("user", "must be a user name without blanks, got %q", Clip(s.User))
	}
	if err := InRange("port", int64(s.Port), 1, 65535); err != nil {
		return err
	}
	if err := ValidLine("host", s.Host, 253); err != nil {
		return err
	}
	if strings.ContainsAny(s.Host, " \t/") {
		return Invalid("host", "must be a host name or address, got %q", Clip(s.Host))
	}
	if err := ValidText("private_key", s.PrivateKey, 64<<10); err != nil {
		return err
	}
	if s.PrivateKey != "" {
		if _, err := ssh.ParsePrivateKey([]byte(s.PrivateKey)); err != nil {
			var pp *ssh.PassphraseMissingError
			if errors.As(err, &pp) {
				return Invalid("private_key", "is protected by a passphrase; give an unencrypted key (it is stored as a secret)")
			}
			return Invalid("private_key", "is not a private key anneal can read (PEM or OpenSSH format): %v", err)
		}
	}
	if err := ValidText("known_hosts", s.KnownHosts, 256<<10); err != nil {
		return err
	}
	if _, err := ParseKnownHosts(s.KnownHosts); err != nil {
		return Invalid("known_hosts", "is not in OpenSSH's known_hosts format: %v", err)
	}
	return nil
}

// SetNodeSSH stores a node's SSH settings (PUT /nodes/:id/ssh) and answers
// them redacted. A new private key is sealed with the secret keyring (a
// 503 naming private_key when the server has none) and replaces a plain
// one; an empty one removes the key.
func (s *Store) SetNodeSSH(ctx context.Context, ref string, in NodeSSHInput) (*NodeSSHView, error) {
	var out *NodeSSHView
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, err := FindNode(tx, ref)
		if err != nil {
			return err
		}
		cur := NodeSSH{NodeID: node.ID, User: DefaultSSHUser, Port: DefaultSSHPort}
		err = tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&cur, "node_id = ?", node.ID).Error
		if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("load ssh settings of %s: %w", node.Name, err)
		}
		if in.User != nil {
			cur.User = *in.User
		}
		if in.Port != nil {
			cur.Port = *in.Port
		}
		if in.Host != nil {
			cur.Host = *in.Host
		}
		if in.PrivateKey != nil {
			cur.PrivateKey = *in.PrivateKey
		}
		if in.KnownHosts != nil {
			cur.KnownHosts = *in.KnownHosts
		}
		if err := validateSSH(&cur); err != nil {
			return err
		}
		if in.PrivateKey != nil {
			cur.KeyID, cur.SealedKey, cur.PlainKey = "", nil, ""
			if cur.PrivateKey != "" {
				if s.Keys == nil {
					return &InputError{Status: http.StatusServiceUnavailable, Field: "private_key", Reason: ErrNoSecretKey.Error()}
				}
				if cur.KeyID, cur.SealedKey, err = s.Keys.Seal([]byte(cur.PrivateKey), nodeKeyAAD(node.ID)); err != nil {
					return fmt.Errorf("seal the ssh key of %s: %w", node.Name, err)
				}
			}
		}
		cur.UpdatedAt = Now()
		if err := tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(&cur).Error; err != nil {
			return fmt.Errorf("store ssh settings of %s: %w", node.Name, err)
		}
		out = cur.View(node.Name)
		return nil
	})
	return out, err
}

// NodeSSHSettings answers GET /nodes/:id/ssh, redacted; a node without
// settings answers a 404 saying how to set them.
func (s *Store) NodeSSHSettings(ctx context.Context, ref string) (*NodeSSHView, error) {
	db := s.DB.WithContext(ctx)
	node, err := FindNode(db, ref)
	if err != nil {
		return nil, err
	}
	var cur NodeSSH
	err = db.Take(&cur, "node_id = ?", node.ID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("ssh settings of node", node.Name+" (set them with PUT /api/v1/nodes/"+node.Name+"/ssh)")
	}
	if err != nil {
		return nil, fmt.Errorf("load ssh settings of %s: %w", node.Name, err)
	}
	return cur.View(node.Name), nil
}

// NodeSSH returns a node's SSH settings with the private key opened into
// PrivateKey, for the worker's ssh jig; nil when the node has none. A key
// this process cannot open is an error wrapping ErrSSHKeyUnreadable.
func (s *Store) NodeSSH(ctx context.Context, nodeID int64) (*NodeSSH, error) {
	var cur NodeSSH
	err := s.DB.WithContext(ctx).Take(&cur, "node_id = ?", nodeID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load ssh settings of node %d: %w", nodeID, err)
	}
	key, err := s.openNodeKey(&cur)
	if err != nil {
		return nil, err
	}
	cur.PrivateKey = string(key)
	return &cur, nil
}

// openNodeKey returns the private key of row in the clear: the sealed one
// (SetNodeSSH clears the plain column when it seals, so it is the newer),
// else the plain one.
func (s *Store) openNodeKey(row *NodeSSH) ([]byte, error) {
	if len(row.SealedKey) == 0 {
		return []byte(row.PlainKey), nil
	}
	if s.Keys == nil {
		return nil, fmt.Errorf("node %d: %w: %w", row.NodeID, ErrSSHKeyUnreadable, ErrNoSecretKey)
	}
	key, err := s.Keys.Open(row.KeyID, row.SealedKey, nodeKeyAAD(row.NodeID))
	if err != nil {
		return nil, fmt.Errorf("node %d: %w: %w", row.NodeID, ErrSSHKeyUnreadable, err)
	}
	return key, nil
}

// sealNodeKeys seals with the keyring's first key every node key stored in
// the clear (clearing the plain column) and, when rotate is set, every one
// sealed with another key. It returns how many it sealed.
func (s *Store) sealNodeKeys(tx *gorm.DB, rotate bool) (int, error) {
	q, args := "SELECT * FROM node_ssh WHERE private_key <> ''", []any{}
	if rotate {
		q += " OR (sealed_key IS NOT NULL AND key_id <> ?)"
		args = append(args, s.Keys.PrimaryID())
	}
	var rows []NodeSSH
	if err := tx.Raw(q+" FOR UPDATE", args...).Scan(&rows).Error; err != nil {
		return 0, fmt.Errorf("load node ssh keys to seal: %w", err)
	}
	for _, r := range rows {
		key, err := s.openNodeKey(&r)
		if err != nil {
			return 0, err
		}
		id, sealed, err := s.Keys.Seal(key, nodeKeyAAD(r.NodeID))
		if err != nil {
			return 0, fmt.Errorf("seal the ssh key of node %d: %w", r.NodeID, err)
		}
		// updated_at stays: the settings did not change, only how the key
		// is kept.
		if err := tx.Exec("UPDATE node_ssh SET key_id = ?, sealed_key = ?, private_key = '' WHERE node_id = ?",
			id, sealed, r.NodeID).Error; err != nil {
			return 0, fmt.Errorf("store the sealed ssh key of node %d: %w", r.NodeID, err)
		}
	}
	return len(rows), nil
}

// SealPlainNodeKeys seals with the keyring's first key the node SSH keys
// stored in the clear before keys were sealed (migration 0023), and
// returns how many. The server calls it when it starts, so that an
// upgraded install keeps no plain key.
func (s *Store) SealPlainNodeKeys(ctx context.Context) (int, error) {
	if s.Keys == nil {
		return 0, ErrNoSecretKey
	}
	n := 0
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		n, err = s.sealNodeKeys(tx, false)
		return err
	})
	return n, err
}

// PinSSHHostKey records line as a node's known_hosts on first use: only
// when it has none, so two first connections cannot both pin. It returns
// the node's known_hosts after the call (the pinned line, or what another
// connection pinned first).
func (s *Store) PinSSHHostKey(ctx context.Context, nodeID int64, line string) (string, error) {
	db := s.DB.WithContext(ctx)
	if err := db.Model(&NodeSSH{}).Where("node_id = ? AND known_hosts = ''", nodeID).
		Updates(map[string]any{"known_hosts": line + "\n", "updated_at": Now()}).Error; err != nil {
		return "", fmt.Errorf("pin the host key of node %d: %w", nodeID, err)
	}
	var cur NodeSSH
	if err := db.Select("known_hosts").Take(&cur, "node_id = ?", nodeID).Error; err != nil {
		return "", fmt.Errorf("read the host keys of node %d: %w", nodeID, err)
	}
	return cur.KnownHosts, nil
}
