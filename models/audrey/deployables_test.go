package audrey_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/audrey"
	"github.com/anneal-dev/anneal/models/storetest"
)

const pairYAML = `
templates:
  - name: t
    services:
      - name: s
        parameters:
          - {name: in}
          - {name: out, provided: true}
assemblies:
  - name: source
    template: t
  - name: sink
    template: t
    services:
      - name: s
        parameters:
          - {name: in, reference: {assembly_type: source, match_type: first, provided_parameter: out}}
deployable:
  name: Pair_One
  assemblies:
    - {name: Src_A, type: source}
    - {name: src-b, type: source}
    - {name: sink, type: sink}
`

func TestImportDeployableStore(t *testing.T) {
	ctx := context.Background()
	store, _ := storetest.Open(t)

	// A node already holding an instance's name: the import is refused
	// and leaves nothing behind (one transaction).
	_, _, err := store.CreateNode(ctx, models.NodeInput{Name: "sink.pair-one." + store.Domain}, false)
	require.NoError(t, err)
	_, err = store.ImportDeployable(ctx, []byte(pairYAML), "yaml", "")
	var ce *models.ConflictError
	require.True(t, errors.As(err, &ce), "%v", err)
	list, err := store.Deployables(ctx)
	require.NoError(t, err)
	assert.Empty(t, list)
	nodes, err := store.Nodes(ctx, 0)
	require.NoError(t, err)
	assert.Len(t, nodes, 1)

	// Rename the deployable: it imports, names made DNS labels.
	body := []byte(replaceOnce(pairYAML, "name: Pair_One", "name: Pair_Two"))
	imp, err := store.ImportDeployable(ctx, body, "yaml", "")
	require.NoError(t, err)
	require.Len(t, imp.Instances, 3)
	node, err := store.Node(ctx, "src-a.pair-two."+store.Domain)
	require.NoError(t, err)
	assert.Equal(t, *imp.Instances[0].NodeID, node.ID)
	assert.Equal(t, "yaml", imp.Deployable.Format)

	src, srcB, sink := imp.Instances[0], imp.Instances[1], imp.Instances[2]
	_, status, err := store.FetchConfig(ctx, sink.UUID)
	require.NoError(t, err)
	assert.Equal(t, http.StatusNoContent, status)

	// A reply before the instance fetched its config is out of turn: not
	// found (the seed's 404), and nothing is stored.
	_, err = store.StoreReply(ctx, srcB.UUID, map[string]string{"out": "early"}, []string{"out"})
	require.ErrorIs(t, err, models.ErrNotFound)
	for _, in := range []audrey.DeployableInstance{src, srcB} {
		_, status, err := store.FetchConfig(ctx, in.UUID)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	}

	// match-type first: the earliest report wins and stays even when
	// another source reports later or the first one reports again.
	_, err = store.StoreReply(ctx, srcB.UUID, map[string]string{"out": "b"}, []string{"out"})
	require.NoError(t, err)
	_, err = store.StoreReply(ctx, src.UUID, map[string]string{"out": "a"}, []string{"out"})
	require.NoError(t, err)
	_, err = store.StoreReply(ctx, srcB.UUID, map[string]string{"out": "b2"}, []string{"out"})
	require.NoError(t, err)
	res, status, err := store.FetchConfig(ctx, sink.UUID)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, []string{"b2"}, res.Services[0].Params[0].Values)

	_, err = store.StoreReply(ctx, src.UUID, map[string]string{"nope": "x"}, []string{"nope"})
	var ie *models.InputError
	require.True(t, errors.As(err, &ie))
	assert.Equal(t, http.StatusBadRequest, ie.Status)

	d, insts, err := store.Deployable(ctx, "Pair_Two")
	require.NoError(t, err)
	view, err := store.ViewDeployable(ctx, d, insts, nil)
	require.NoError(t, err)
	assert.Equal(t, audrey.InstanceComplete, view.Instances[0].Status)
	// sink has its config but has not reported its own "out"
	assert.Equal(t, audrey.InstanceConfigured, view.Instances[2].Status)
	assert.Equal(t, []string{"out"}, view.Instances[2].PendingProvided)
	assert.Len(t, view.Edges, 2)
}

func replaceOnce(s, from, to string) string {
	for i := 0; i+len(from) <= len(s); i++ {
		if s[i:i+len(from)] == from {
			return s[:i] + to + s[i+len(from):]
		}
	}
	return s
}
