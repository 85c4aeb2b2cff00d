package workflows_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows"
	"github.com/anneal-dev/anneal/workflows/codec"
)

// TestReplayRecordedHistories replays histories recorded from real runs
// (by the end-to-end test with ANNEAL_RECORD_HISTORIES=1) against today's
// workflow code: a change that would break running workflows fails here.
// Such a change needs workflow.GetVersion once anneal runs anywhere; before
// that, re-record with
// `ANNEAL_RECORD_HISTORIES=1 go run ./dev test ./web/... -run 'ThreeNodes|AnnealerGrows'`.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob("testdata/*.history.json")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no recorded histories in testdata")
	keys, err := secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			require.NoError(t, err)
			var hist history.History
			require.NoError(t, protojson.Unmarshal(raw, &hist))
			replayer := worker.NewWorkflowReplayer()
			workflows.Register(replayer)
			require.NoError(t, replayer.ReplayWorkflowHistory(nil, &hist))

			// The recorded histories hold plain payloads; the encrypting
			// codec every client uses now passes them through, so an
			// installation upgraded to encryption replays its old runs.
			replayer, err = worker.NewWorkflowReplayerWithOptions(worker.WorkflowReplayerOptions{
				DataConverter: codec.DataConverter(keys), FailureConverter: codec.FailureConverter(keys),
			})
			require.NoError(t, err)
			workflows.Register(replayer)
			require.NoError(t, replayer.ReplayWorkflowHistory(nil, &hist), "through the codec")
		})
	}
}
