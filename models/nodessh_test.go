package models_test

import (
	"bytes"
	"encoding/pem"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/storetest"
)

// nodeKeyRow is a node_ssh row as stored.
type nodeKeyRow struct {
	PrivateKey string
	KeyID      string
	SealedKey  []byte
}

func loadNodeKeyRow(t *testing.T, s *storetest.Stores, nodeID int64) nodeKeyRow {
	t.Helper()
	var r nodeKeyRow
	require.NoError(t, s.DB.Raw("SELECT private_key, key_id, sealed_key FROM node_ssh WHERE node_id = ?", nodeID).
		Row().Scan(&r.PrivateKey, &r.KeyID, &r.SealedKey))
	return r
}

// A node's SSH key is sealed at rest with the secret keyring, bound to its
// node; only NodeSSH opens it. Plain keys from before keys were sealed are
// read, then sealed at start-up and by a rotation, which also re-seals the
// keys of an old key. A server without a key refuses a key naming it.
func TestNodeSSHKeySealedAtRest(t *testing.T) {
	s, ctx, oldKey, newKey := sealingStore(t)
	var nodes []*models.Node
	for _, name := range []string{"sealed", "legacy", "nokey"} {
		n, _, err := s.CreateNode(ctx, models.NodeInput{Name: name + ".anneal.test", Deployment: "prod"}, true)
		require.NoError(t, err)
		nodes = append(nodes, n)
	}
	sealedNode, legacyNode, noKeyNode := nodes[0], nodes[1], nodes[2]
	_, key := testenv.NewSSHKey(t)
	_, legacyKey := testenv.NewSSHKey(t)
	block, _ := pem.Decode([]byte(key))
	require.NotNil(t, block)

	view, err := s.SetNodeSSH(ctx, sealedNode.Name, models.NodeSSHInput{PrivateKey: &key})
	require.NoError(t, err)
	assert.Equal(t, models.Redacted, view.PrivateKey)
	row := loadNodeKeyRow(t, s, sealedNode.ID)
	assert.Empty(t, row.PrivateKey, "no plain key")
	assert.Equal(t, s.Keys.PrimaryID(), row.KeyID)
	require.NotEmpty(t, row.SealedKey)
	assert.False(t, bytes.Contains(row.SealedKey, block.Bytes), "the key's bytes are not in sealed_key")
	for _, line := range strings.Split(key, "\n")[1:] {
		if len(line) > 20 {
			assert.NotContains(t, string(row.SealedKey), line)
		}
	}
	got, err := s.NodeSSH(ctx, sealedNode.ID)
	require.NoError(t, err)
	assert.Equal(t, key, got.PrivateKey)
	view, err = s.NodeSSHSettings(ctx, sealedNode.Name)
	require.NoError(t, err)
	assert.Equal(t, models.Redacted, view.PrivateKey)
	port := 2222
	view, err = s.SetNodeSSH(ctx, sealedNode.Name, models.NodeSSHInput{Port: &port})
	require.NoError(t, err)
	assert.Equal(t, models.Redacted, view.PrivateKey, "a PUT without the key keeps it")
	assert.Equal(t, row, loadNodeKeyRow(t, s, sealedNode.ID))

	// A sealed key moved to another node's row does not open there.
	require.NoError(t, s.DB.Exec("INSERT INTO node_ssh (node_id, key_id, sealed_key) VALUES (?, ?, ?)", noKeyNode.ID, row.KeyID, row.SealedKey).Error)
	_, err = s.NodeSSH(ctx, noKeyNode.ID)
	assert.ErrorIs(t, err, models.ErrSSHKeyUnreadable)
	empty := ""
	_, err = s.SetNodeSSH(ctx, noKeyNode.Name, models.NodeSSHInput{PrivateKey: &empty})
	require.NoError(t, err)
	assert.Equal(t, nodeKeyRow{}, loadNodeKeyRow(t, s, noKeyNode.ID), "an empty key clears all three columns")

	// A plain key written before keys were sealed is read as it is.
	require.NoError(t, s.DB.Exec("INSERT INTO node_ssh (node_id, private_key) VALUES (?, ?)", legacyNode.ID, legacyKey).Error)
	got, err = s.NodeSSH(ctx, legacyNode.ID)
	require.NoError(t, err)
	assert.Equal(t, legacyKey, got.PrivateKey)
	view, err = s.NodeSSHSettings(ctx, legacyNode.Name)
	require.NoError(t, err)
	assert.Equal(t, models.Redacted, view.PrivateKey)
	var withKey []int64
	require.NoError(t, s.DB.Model(&models.NodeSSH{}).Scopes(models.WithSSHKey).Order("node_id").Pluck("node_id", &withKey).Error)
	assert.Equal(t, []int64{sealedNode.ID, legacyNode.ID}, withKey, "sealed and plain keys count, a cleared one does not")

	// The server's start seals it.
	n, err := s.SealPlainNodeKeys(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	row = loadNodeKeyRow(t, s, legacyNode.ID)
	assert.Empty(t, row.PrivateKey)
	assert.Equal(t, s.Keys.PrimaryID(), row.KeyID)
	assert.NotContains(t, string(row.SealedKey), strings.Split(legacyKey, "\n")[2])
	got, err = s.NodeSSH(ctx, legacyNode.ID)
	require.NoError(t, err)
	assert.Equal(t, legacyKey, got.PrivateKey)
	n, err = s.SealPlainNodeKeys(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left in the clear")

	// Rotation: both sealed keys move to the new key, and a plain one
	// (written by a server that had not restarted yet) is sealed too.
	require.NoError(t, s.DB.Exec("UPDATE node_ssh SET private_key = ? WHERE node_id = ?", legacyKey, noKeyNode.ID).Error)
	assert.Equal(t, models.Rotated{NodeKeys: 3}, rotate(t, s, newKey, oldKey))
	for _, tc := range []struct {
		node *models.Node
		want string
	}{{sealedNode, key}, {legacyNode, legacyKey}, {noKeyNode, legacyKey}} {
		row := loadNodeKeyRow(t, s, tc.node.ID)
		assert.Empty(t, row.PrivateKey, tc.node.Name)
		assert.Equal(t, s.Keys.PrimaryID(), row.KeyID, tc.node.Name)
		got, err := s.NodeSSH(ctx, tc.node.ID)
		require.NoError(t, err, "%s readable with the new key alone", tc.node.Name)
		assert.Equal(t, tc.want, got.PrivateKey, tc.node.Name)
	}

	// A server without a secret key refuses a key, naming the field, and
	// cannot open one; other settings still change.
	noKeys := *s.Store
	noKeys.Keys = nil
	_, err = noKeys.SetNodeSSH(ctx, sealedNode.Name, models.NodeSSHInput{PrivateKey: &key})
	var ie *models.InputError
	require.True(t, errors.As(err, &ie), "want an InputError, got %v", err)
	assert.Equal(t, http.StatusServiceUnavailable, ie.Status)
	assert.Equal(t, "private_key", ie.Field)
	_, err = noKeys.SetNodeSSH(ctx, sealedNode.Name, models.NodeSSHInput{Port: &port})
	require.NoError(t, err)
	_, err = noKeys.NodeSSH(ctx, sealedNode.ID)
	assert.ErrorIs(t, err, models.ErrSSHKeyUnreadable)
	assert.ErrorIs(t, err, models.ErrNoSecretKey)
}
