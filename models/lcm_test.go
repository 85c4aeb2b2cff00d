package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// InputsBaseJSON must hash the very bytes inputsBase did: the hashes of
// runs already stored are what LCM compares new ones with.
func TestInputsBaseJSONAgreesWithInputsBase(t *testing.T) {
	type task struct {
		ID         string            `json:"id"`
		Type       string            `json:"type,omitempty"`
		Requires   []string          `json:"requires,omitempty"`
		Parameters map[string]any    `json:"parameters"`
		Env        map[string]string `json:"env,omitempty"`
	}
	definitions := []any{
		&task{ID: "t1", Parameters: map[string]any{"cmd": "true", "timeout": 60}},
		// HTML-escaped characters, quotes, non-ASCII and a nested map.
		&task{ID: "a<b>&c", Type: "shell", Requires: []string{"x\"y", "ü"},
			Parameters: map[string]any{"cmd": "echo '<&>' \u2028", "nested": map[string]any{"z": 1.5, "a": []any{nil, true}}},
			Env:        map[string]string{"B": "2", "A": "1"}},
		nil,
	}
	data := []map[string]any{
		nil,
		{},
		{"anneal": map[string]any{"node": "n1.anneal.test", "roles": []any{"bench"}, "tags": []any{}}, "x": "<y>"},
	}
	for i, def := range definitions {
		rawDef, err := json.Marshal(def)
		require.NoError(t, err)
		for j, d := range data {
			rawData, err := json.Marshal(d)
			require.NoError(t, err)
			for _, node := range []string{"n1.anneal.test", "we<ird>&\"node"} {
				want, err := inputsBase(def, node, d)
				require.NoError(t, err)
				assert.Equal(t, want, InputsBaseJSON(rawDef, node, rawData), "definition %d, data %d, node %q", i, j, node)
			}
		}
	}
}

// inputsBase is the first way the part of a run's inputs known at plan
// time was digested (its task's definition, its node and its merged data,
// encoded together): the hashes of runs stored then are what LCM compares
// new ones with, so InputsBaseJSON must agree with it.
func inputsBase(definition any, node string, data map[string]any) (string, error) {
	raw, err := json.Marshal(struct {
		Task any            `json:"task"`
		Node string         `json:"node"`
		Data map[string]any `json:"data"`
	}{definition, node, data})
	if err != nil {
		return "", fmt.Errorf("encode the inputs of %s on %s: %w", definition, node, err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:]), nil
}
