package devenv_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// TestSearchAttributesRegistered: a dev server started with anneal's search
// attributes lists them and takes queries on them; registering again adds
// nothing; a clash of type or with a system attribute is an error naming it.
func TestSearchAttributesRegistered(t *testing.T) {
	needTemporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tmp, err := devenv.EnsureTemporal(ctx, devenv.TemporalOptions{
		StateDir: t.TempDir(), UIPort: devenv.HeadlessUI, Ephemeral: true,
		SearchAttributes: contract.SearchAttributes(),
	}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tmp.Close() })
	c, err := client.DialContext(ctx, client.Options{HostPort: tmp.Address, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	require.NoError(t, err)
	defer c.Close()

	list, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: "default"})
	require.NoError(t, err)
	want := map[string]enumspb.IndexedValueType{
		"Deployment": enumspb.INDEXED_VALUE_TYPE_KEYWORD, "GraphType": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"Node": enumspb.INDEXED_VALUE_TYPE_KEYWORD, "Transaction": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"AnnealStatus": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
	assert.Equal(t, want, contract.SearchAttributes())
	for name, typ := range want {
		assert.Equal(t, typ, list.GetCustomAttributes()[name], name)
		assert.NotContains(t, list.GetSystemAttributes(), name, "collides with a built-in")
	}
	_, err = c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Namespace: "default", Query: `Deployment = "sample" AND ExecutionStatus = "Failed"`,
	})
	require.NoError(t, err, "the visibility store takes a query on them")

	added, err := devenv.RegisterSearchAttributes(ctx, c, "default", contract.SearchAttributes())
	require.NoError(t, err)
	assert.Empty(t, added, "idempotent")

	_, err = devenv.RegisterSearchAttributes(ctx, c, "default", map[string]enumspb.IndexedValueType{"Node": enumspb.INDEXED_VALUE_TYPE_INT})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Node is registered as Keyword")
	_, err = devenv.RegisterSearchAttributes(ctx, c, "default", map[string]enumspb.IndexedValueType{"ExecutionStatus": enumspb.INDEXED_VALUE_TYPE_KEYWORD})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ExecutionStatus is a Temporal system attribute")

	added, err = devenv.RegisterSearchAttributes(ctx, c, "default", map[string]enumspb.IndexedValueType{"AnnealExtra": enumspb.INDEXED_VALUE_TYPE_INT})
	require.NoError(t, err)
	assert.Equal(t, []string{"AnnealExtra"}, added)
}
