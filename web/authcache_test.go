package web

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
)

// An agent's credential is trusted for agentAuthTTL without asking the
// database again, an operator token for authTTL only; a forgotten one is
// asked for at once.
func TestAuthCacheTrustsAgentsLonger(t *testing.T) {
	now := time.Now()
	cache := &authCache{now: func() time.Time { return now }}
	principals := map[string]models.Principal{
		"agt_one": {NodeID: 1, Name: "n1.anneal.test"},
		"ann_op":  {Scope: "admin", Name: "op"},
	}
	asked := map[string]int{}
	verify := func(_ context.Context, token string) (models.Principal, error) {
		asked[token]++
		return principals[token], nil
	}
	auth := func(token string) {
		t.Helper()
		p, err := cache.authenticate(context.Background(), token, verify)
		require.NoError(t, err)
		assert.Equal(t, principals[token], p)
	}

	auth("agt_one")
	auth("ann_op")
	now = now.Add(authTTL + time.Second)
	auth("agt_one")
	auth("ann_op")
	assert.Equal(t, map[string]int{"agt_one": 1, "ann_op": 2}, asked, "the agent's credential still trusted, the operator's asked for again")

	now = now.Add(agentAuthTTL)
	auth("agt_one")
	assert.Equal(t, 2, asked["agt_one"], "asked for again after agentAuthTTL")
	cache.forget(models.HashSecret("agt_one"))
	auth("agt_one")
	assert.Equal(t, 3, asked["agt_one"], "a forgotten credential is asked for at once")
}

// A verification that began before a credential was dropped is not kept
// (it may have read the credential before it stopped working), and an
// announcement that some were missed drops them all.
func TestAuthCacheDropsRevokedCredentials(t *testing.T) {
	cache := &authCache{}
	p := models.Principal{NodeID: 1, Name: "n1.anneal.test"}
	asked := 0
	verify := func(context.Context, string) (models.Principal, error) {
		asked++
		return p, nil
	}
	racing := func(context.Context, string) (models.Principal, error) {
		asked++
		cache.revoked(models.HashSecret("agt_one")) // deleted meanwhile
		return p, nil
	}
	_, err := cache.authenticate(context.Background(), "agt_one", racing)
	require.NoError(t, err)
	_, err = cache.authenticate(context.Background(), "agt_one", verify)
	require.NoError(t, err)
	assert.Equal(t, 2, asked, "what the racing verification read was not kept")
	_, err = cache.authenticate(context.Background(), "agt_one", verify)
	require.NoError(t, err)
	assert.Equal(t, 2, asked, "kept from then on")
	cache.revoked("")
	_, err = cache.authenticate(context.Background(), "agt_one", verify)
	require.NoError(t, err)
	assert.Equal(t, 3, asked, "all dropped when some announcements may have been missed")
}
