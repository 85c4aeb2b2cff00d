package models

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models/secrets"
)

// Secret is a named secret of a deployment as the API shows it: its name
// and which key sealed it, never its value.
type Secret struct {
	DeploymentID int64     `json:"deployment_id"`
	Name         string    `json:"name"`
	KeyID        string    `json:"key_id"`
	Sealed       []byte    `json:"-"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// TableName is the secrets table.
func (Secret) TableName() string { return "secrets" }

// MaxSecretLen bounds a secret's value.
const MaxSecretLen = 64 << 10

// ErrNoSecretKey means the process has no secret key, so it can neither
// seal nor open secrets.
var ErrNoSecretKey = errors.New("this server has no secret key (-secret-key-file or ANNEAL_SECRET_KEY)")

// secretAAD binds a sealed value to its deployment and name.
func secretAAD(deploymentID int64, name string) []byte {
	return fmt.Appendf(nil, "anneal secret %d/%s", deploymentID, name)
}

// SetSecret seals value under name in the deployment ref, replacing a
// previous value. created says whether the name is new.
func (s *Store) SetSecret(ctx context.Context, ref, name, value string) (sec *Secret, created bool, err error) {
	if err := ValidName("name", "secret", name); err != nil {
		return nil, false, err
	}
	switch {
	case len(value) < secrets.MinLen:
		return nil, false, Invalid("value", "a secret must be at least %d characters (a shorter one could not be told apart from ordinary output when redacting)", secrets.MinLen)
	case len(value) > MaxSecretLen:
		return nil, false, Invalid("value", "a secret must be at most %d bytes, got %d", MaxSecretLen, len(value))
	case strings.ContainsRune(value, 0):
		return nil, false, Invalid("value", "must not contain NUL characters")
	case value != strings.TrimSpace(value):
		return nil, false, Invalid("value", "must not start or end with white space (outputs are trimmed, so it could not be redacted there)")
	}
	if s.Keys == nil {
		return nil, false, &InputError{Status: http.StatusServiceUnavailable, Field: "value", Reason: ErrNoSecretKey.Error()}
	}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := FindDeployment(tx, ref)
		if err != nil {
			return err
		}
		keyID, sealed, err := s.Keys.Seal([]byte(value), secretAAD(dep.ID, name))
		if err != nil {
			return err
		}
		var rows []struct {
			Inserted bool
		}
		err = tx.Raw(`INSERT INTO secrets (deployment_id, name, key_id, sealed) VALUES (?, ?, ?, ?)
ON CONFLICT (deployment_id, name) DO UPDATE SET key_id = EXCLUDED.key_id, sealed = EXCLUDED.sealed, updated_at = now()
RETURNING (xmax = 0) AS inserted`, dep.ID, name, keyID, sealed).Scan(&rows).Error
		if err != nil {
			return fmt.Errorf("store secret %s of deployment %s: %w", name, dep.Name, err)
		}
		created = len(rows) == 1 && rows[0].Inserted
		sec = &Secret{}
		return tx.Where("deployment_id = ? AND name = ?", dep.ID, name).Take(sec).Error
	})
	if err != nil {
		return nil, false, err
	}
	return sec, created, nil
}

// Secrets lists the secrets of deployment ref by name (no values).
func (s *Store) Secrets(ctx context.Context, ref string) ([]Secret, error) {
	dep, err := s.Deployment(ctx, ref)
	if err != nil {
		return nil, err
	}
	var out []Secret
	if err := s.DB.WithContext(ctx).Omit("sealed").Where("deployment_id = ?", dep.ID).Order("name").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list secrets of deployment %s: %w", dep.Name, err)
	}
	return out, nil
}

// DeleteSecret removes a secret; runs that reference it are refused at
// execute from then on.
func (s *Store) DeleteSecret(ctx context.Context, ref, name string) error {
	dep, err := s.Deployment(ctx, ref)
	if err != nil {
		return err
	}
	res := s.DB.WithContext(ctx).Where("deployment_id = ? AND name = ?", dep.ID, name).Delete(&Secret{})
	if res.Error != nil {
		return fmt.Errorf("delete secret %s: %w", name, res.Error)
	}
	if res.RowsAffected == 0 {
		return NotFound("secret", name)
	}
	return nil
}

// MissingSecrets returns which of names the deployment has no secret for,
// sorted.
func MissingSecrets(tx *gorm.DB, deploymentID int64, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var have []string
	if err := tx.Model(&Secret{}).Where("deployment_id = ? AND name IN ?", deploymentID, names).Pluck("name", &have).Error; err != nil {
		return nil, fmt.Errorf("look secrets up: %w", err)
	}
	var missing []string
	for _, n := range names {
		if !containsString(have, n) && !containsString(missing, n) {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	return missing, nil
}

func containsString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// MissingSecretsError is the 422 of an execute (or a software deployment)
// that references secrets its deployment does not have.
func MissingSecretsError(field, deployment string, missing []string) *InputError {
	return &InputError{Field: field, Reason: fmt.Sprintf("secret(s) %s referenced but not set in deployment %s (PUT /api/v1/deployments/%s/secrets/<name>)",
		strings.Join(missing, ", "), deployment, deployment), Details: map[string]any{"missing_secrets": missing}}
}

// openRows decrypts sealed secrets, by name.
func (s *Store) openRows(rows []Secret) (map[string]string, error) {
	out := make(map[string]string, len(rows))
	if len(rows) == 0 {
		return out, nil
	}
	if s.Keys == nil {
		return nil, ErrNoSecretKey
	}
	for _, r := range rows {
		plain, err := s.Keys.Open(r.KeyID, r.Sealed, secretAAD(r.DeploymentID, r.Name))
		if err != nil {
			return nil, fmt.Errorf("open secret %s: %w", r.Name, err)
		}
		out[r.Name] = string(plain)
	}
	return out, nil
}

// NodeSecrets decrypts the named secrets of a node's deployment, for the
// run of that node that needs them; a name not set there is an error
// naming it (it was deleted since the execute checked it).
func (s *Store) NodeSecrets(ctx context.Context, nodeID int64, names []string) (map[string]string, error) {
	if len(names) == 0 {
		return map[string]string{}, nil
	}
	// The node's deployment as a subquery: one round trip per run that
	// needs secrets, not two.
	var rows []Secret
	if err := s.DB.WithContext(ctx).Where("deployment_id = (SELECT deployment_id FROM nodes WHERE id = ?) AND name IN ?", nodeID, names).
		Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("load the secrets of node %d's deployment: %w", nodeID, err)
	}
	vals, err := s.openRows(rows)
	if err != nil {
		return nil, &SecretsUnavailableError{Reason: err.Error()}
	}
	var missing []string
	for _, n := range names {
		if _, ok := vals[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, &SecretsUnavailableError{Reason: fmt.Sprintf("secret(s) %s no longer set in the node's deployment", strings.Join(missing, ", "))}
	}
	return vals, nil
}

// SecretsUnavailableError means secrets a run needs cannot be had: deleted
// since the run was planned, or sealed with a key the server does not
// hold. The run cannot run; a database that cannot be read is another
// error, which passes.
type SecretsUnavailableError struct{ Reason string }

func (e *SecretsUnavailableError) Error() string { return e.Reason }

// NodeRedactor redacts every secret of a node's deployment: what the node
// reports (outputs, output tails, errors, attributes, signals) passes
// through it before it is stored, whatever the agent did.
func (s *Store) NodeRedactor(tx *gorm.DB, nodeID int64) (*secrets.Redactor, error) {
	// One round trip: it runs for every report.
	var rows []Secret
	if err := tx.Raw("SELECT s.* FROM secrets s JOIN nodes n ON n.deployment_id = s.deployment_id WHERE n.id = ?", nodeID).
		Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("load the secrets of node %d: %w", nodeID, err)
	}
	vals, err := s.openRows(rows)
	if err != nil {
		return nil, fmt.Errorf("redact the report of node %d: %w", nodeID, err)
	}
	all := make([]string, 0, len(vals))
	for _, v := range vals {
		all = append(all, v)
	}
	return secrets.NewRedactor(all...), nil
}

// Rotated counts what RotateSecrets sealed with the first key.
type Rotated struct {
	// Secrets is how many deployment secrets were sealed again.
	Secrets int
	// NodeKeys is how many node SSH keys were sealed again or, stored in
	// the clear from before keys were sealed, sealed for the first time.
	NodeKeys int
}

// RotateSecrets seals again, with the keyring's first key, every secret
// and node SSH key sealed with another key, seals the node keys still
// stored in the clear, and returns how many of each. Once it returns, the
// old keys can be dropped from the keyring (Temporal payloads sealed with
// them stay readable only while they are kept).
func (s *Store) RotateSecrets(ctx context.Context) (Rotated, error) {
	var out Rotated
	if s.Keys == nil {
		return out, ErrNoSecretKey
	}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var rows []Secret
		if err := tx.Raw("SELECT * FROM secrets WHERE key_id <> ? FOR UPDATE", s.Keys.PrimaryID()).Scan(&rows).Error; err != nil {
			return fmt.Errorf("load secrets to rotate: %w", err)
		}
		for _, r := range rows {
			aad := secretAAD(r.DeploymentID, r.Name)
			plain, err := s.Keys.Open(r.KeyID, r.Sealed, aad)
			if err != nil {
				return fmt.Errorf("open secret %s of deployment %d: %w", r.Name, r.DeploymentID, err)
			}
			id, sealed, err := s.Keys.Seal(plain, aad)
			if err != nil {
				return err
			}
			if err := tx.Exec("UPDATE secrets SET key_id = ?, sealed = ?, updated_at = now() WHERE deployment_id = ? AND name = ?",
				id, sealed, r.DeploymentID, r.Name).Error; err != nil {
				return fmt.Errorf("re-seal secret %s: %w", r.Name, err)
			}
			out.Secrets++
		}
		var err error
		out.NodeKeys, err = s.sealNodeKeys(tx, true)
		return err
	})
	if err != nil {
		return Rotated{}, err
	}
	return out, nil
}

// GetSecret is the key of a secret reference inside attributes and Heat
// input values: {"get_secret": "<name>"} stands for the value of the
// deployment's secret of that name, resolved only in what is sent to the
// node whose run needs it.
const GetSecret = "get_secret"

// SecretRefName recognises a secret reference, {"get_secret": "<name>"}
// with no other key.
func SecretRefName(v any) (string, bool) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return "", false
	}
	name, ok := m[GetSecret].(string)
	return name, ok
}

// SecretRefsIn lists the secrets referenced anywhere in a decoded JSON
// value, sorted, once each.
func SecretRefsIn(v any) []string {
	seen := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		if name, ok := SecretRefName(v); ok {
			seen[name] = true
			return
		}
		switch x := v.(type) {
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ResolveSecretRefs returns v (a copy where it changes) with every secret
// reference replaced by its value in vals; a reference missing from vals
// stays as it is.
func ResolveSecretRefs(v any, vals map[string]string) any {
	if name, ok := SecretRefName(v); ok {
		if val, ok := vals[name]; ok {
			return val
		}
		return v
	}
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = ResolveSecretRefs(e, vals)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = ResolveSecretRefs(e, vals)
		}
		return out
	}
	return v
}

// RestoreSecretRefs puts back, in the attributes a run handed back, the
// secret references of the attributes it was sent where the value came
// back redacted: the resolved value never returns, and a reference that
// merely went round trip is no change.
func RestoreSecretRefs(sent, back map[string]any) map[string]any {
	if back == nil {
		return nil
	}
	out := make(map[string]any, len(back))
	for k, b := range back {
		s, had := sent[k]
		if !had {
			out[k] = b
			continue
		}
		if _, ref := SecretRefName(s); ref && b == secrets.Redacted {
			out[k] = s
			continue
		}
		sm, ok1 := s.(map[string]any)
		bm, ok2 := b.(map[string]any)
		if ok1 && ok2 {
			out[k] = RestoreSecretRefs(sm, bm)
			continue
		}
		out[k] = b
	}
	return out
}
