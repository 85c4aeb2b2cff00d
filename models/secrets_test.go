package models_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/models/storetest"
)

// Secrets are sealed under their deployment and name, listed without
// values, opened for a node of their deployment, and re-sealed with the
// first key by a rotation, after which the old key can go.
// rotate re-seals with newKey while oldKey still opens what it sealed, as
// "worker secrets rotate" does, checks that a second rotation finds nothing
// left, and leaves s with newKey alone. It returns what the first rotated.
func rotate(t *testing.T, s *storetest.Stores, newKey, oldKey string) models.Rotated {
	t.Helper()
	var err error
	s.Keys, err = secrets.ParseKeys(newKey + "," + oldKey)
	require.NoError(t, err)
	rot, err := s.RotateSecrets(context.Background())
	require.NoError(t, err)
	again, err := s.RotateSecrets(context.Background())
	require.NoError(t, err)
	assert.Zero(t, again, "nothing left to re-seal")
	s.Keys, err = secrets.ParseKeys(newKey)
	require.NoError(t, err)
	return rot
}

// sealingStore is a store whose keyring holds oldKey alone (newKey is for
// a rotation: see rotate), with a deployment "prod".
func sealingStore(t *testing.T) (s *storetest.Stores, ctx context.Context, oldKey, newKey string) {
	t.Helper()
	s, ctx = storetest.New(t)
	oldKey, newKey = secrets.GenerateKey(), secrets.GenerateKey()
	var err error
	s.Keys, err = secrets.ParseKeys(oldKey)
	require.NoError(t, err)
	_, err = s.CreateDeployment(ctx, models.DeploymentInput{Name: "prod"})
	require.NoError(t, err)
	return s, ctx, oldKey, newKey
}

func TestSecretsSealListOpenRotate(t *testing.T) {
	s, ctx, oldKey, newKey := sealingStore(t)
	node, _, err := s.CreateNode(ctx, models.NodeInput{Name: "n1.anneal.test", Deployment: "prod"}, true)
	require.NoError(t, err)

	sec, created, err := s.SetSecret(ctx, "prod", "db-password", "hunter22-prod")
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, s.Keys.PrimaryID(), sec.KeyID)
	_, _, err = s.SetSecret(ctx, "prod", "bad name", "hunter22-prod")
	assert.ErrorContains(t, err, "name")
	_, _, err = s.SetSecret(ctx, "prod", "x", " padded-value ")
	assert.ErrorContains(t, err, "white space")

	var sealed []byte
	require.NoError(t, s.DB.Raw("SELECT sealed FROM secrets WHERE name = 'db-password'").Row().Scan(&sealed))
	assert.NotContains(t, string(sealed), "hunter22-prod")

	list, err := s.Secrets(ctx, "prod")
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Nil(t, list[0].Sealed)

	vals, err := s.NodeSecrets(ctx, node.ID, []string{"db-password"})
	require.NoError(t, err)
	assert.Equal(t, "hunter22-prod", vals["db-password"])
	_, err = s.NodeSecrets(ctx, node.ID, []string{"nope"})
	assert.ErrorContains(t, err, "nope")
	var unavailable *models.SecretsUnavailableError
	assert.ErrorAs(t, err, &unavailable, "the run cannot run: it fails")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.NodeSecrets(gone, node.ID, []string{"db-password"})
	require.Error(t, err)
	assert.False(t, errors.As(err, &unavailable), "a database that cannot be read does not fail the run: %v", err)
	red, err := s.NodeRedactor(s.DB, node.ID)
	require.NoError(t, err)
	assert.Equal(t, "pw=***", red.String("pw=hunter22-prod"))

	// Rotation: the new key first, the old one still there.
	assert.Equal(t, models.Rotated{Secrets: 1}, rotate(t, s, newKey, oldKey))
	vals, err = s.NodeSecrets(ctx, node.ID, []string{"db-password"})
	require.NoError(t, err, "readable with the new key alone")
	assert.Equal(t, "hunter22-prod", vals["db-password"])

	require.NoError(t, s.DeleteSecret(ctx, "prod", "db-password"))
	assert.ErrorIs(t, s.DeleteSecret(ctx, "prod", "db-password"), models.ErrNotFound)
}
