package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSoftwareSignalRanges: status codes and rounds that do not fit in 32
// bits are refused with the key named; quoted numbers from shell hooks are
// read.
func TestSoftwareSignalRanges(t *testing.T) {
	var sig SoftwareSignal
	require.NoError(t, json.Unmarshal([]byte(`{"deploy_status_code": "3", "deploy_round": 2, "out": 1}`), &sig))
	assert.Equal(t, 3, sig.StatusCode)
	assert.Equal(t, 2, sig.Round)
	assert.Equal(t, map[string]any{"out": int64(1)}, sig.Outputs)
	for _, tc := range []struct{ body, key string }{
		{`{"deploy_status_code": 4294967296}`, "deploy_status_code"},
		{`{"deploy_status_code": "-2147483649"}`, "deploy_status_code"},
		{`{"deploy_round": 1e40}`, "deploy_round"},
		{`{"deploy_round": true}`, "deploy_round"},
	} {
		err := json.Unmarshal([]byte(tc.body), &sig)
		require.Error(t, err, tc.body)
		assert.Regexp(t, "^"+tc.key+": must be an integer", err.Error(), tc.body)
	}
}
