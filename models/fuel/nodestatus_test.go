package fuel

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

func TestNodeAttributeUpdates(t *testing.T) {
	node := &models.Node{Attributes: map[string]any{"rack": "r1"}}
	cases := []struct {
		name  string
		attrs map[string]any
		want  map[string]any
	}{
		{"nothing", nil, map[string]any{}},
		{"stored status", map[string]any{"status": "provisioned"}, map[string]any{"status": "provisioned"}},
		{"fuel's ready is deployed", map[string]any{"status": "ready"}, map[string]any{"status": "deployed"}},
		{"transient statuses are computed, not stored", map[string]any{"status": "error", "error_type": "deploy"},
			map[string]any{"error_type": "deploy"}},
		{"null error_type clears it", map[string]any{"error_type": nil}, map[string]any{"error_type": nil}},
		{"progress belongs to the framework", map[string]any{"progress": 3}, map[string]any{}},
		{"other keys are attributes", map[string]any{"owner": "ops"},
			map[string]any{"attributes": map[string]any{"rack": "r1", "owner": "ops"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, nodeAttributeUpdates(node, tc.attrs))
			assert.Equal(t, map[string]any{"rack": "r1"}, node.Attributes, "the node is not changed in place")
		})
	}
}

func TestCallbackAttributes(t *testing.T) {
	meta := map[string]any{
		"on_success": map[string]any{"node_attributes": map[string]any{"status": "ready"}},
		"on_stop":    nil,
	}
	assert.Equal(t, map[string]any{"status": "ready"}, callbackAttributes(meta, contract.OutcomeSuccess))
	assert.Nil(t, callbackAttributes(meta, contract.OutcomeStop))
	assert.Nil(t, callbackAttributes(meta, contract.OutcomeError))
}
