package models

import (
	"context"
	"errors"
	"fmt"
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
// port, host, private key and the pinned host keys. PrivateKey is a
// secret: it leaves the store only for the worker (NodeSSH), never in an
// API answer (NodeSSHView), and node_ssh.private_key is the column the
// secrets work encrypts at rest.
type NodeSSH struct {
	NodeID     int64     `json:"node_id" gorm:"primaryKey;autoIncrement:false"`
	User       string    `json:"user" gorm:"column:ssh_user"`
	Port       int       `json:"port"`
	Host       string    `json:"host"`
	PrivateKey string    `json:"-"`
	KnownHosts string    `json:"known_hosts"`
	UpdatedAt  time.Time `json:"updated_at"`
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
	if s.PrivateKey != "" {
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

// validateSSH checks the settings after the input was applied.
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
// them redacted.
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

// NodeSSH returns a node's SSH settings with the private key, for the
// worker's ssh jig; nil when the node has none.
func (s *Store) NodeSSH(ctx context.Context, nodeID int64) (*NodeSSH, error) {
	var cur NodeSSH
	err := s.DB.WithContext(ctx).Take(&cur, "node_id = ?", nodeID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load ssh settings of node %d: %w", nodeID, err)
	}
	return &cur, nil
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
