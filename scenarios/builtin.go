package scenarios

import _ "embed"

// deployChanges is the built-in deploy-changes scenario.
//
//go:embed deploy-changes.yaml
var deployChanges []byte

// Builtins returns the built-in scenarios, one YAML document each, in the
// shape of the POST /api/v1/scenarios body. Upsert them at start with
// fuel.EnsureBuiltinScenarios(ctx, store, scenarios.Builtins()...).
func Builtins() [][]byte {
	return [][]byte{deployChanges}
}
