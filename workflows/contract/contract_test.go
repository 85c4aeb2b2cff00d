package contract_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/anneal-dev/anneal/workflows/contract"
)

func TestRunFinal(t *testing.T) {
	final := map[string]bool{
		contract.RunPlanned: true, contract.RunPending: false, contract.RunRunning: false, contract.RunSucceeded: true,
		contract.RunFailed: true, contract.RunBlocked: true, contract.RunSkipped: true, contract.RunCancelled: true, "bogus": false,
	}
	for state, want := range final {
		assert.Equal(t, want, contract.RunFinal(state), state)
	}
}

// Workflow IDs are a contract with recorded histories and with operators'
// scripts: their formats never change.
func TestWorkflowIDs(t *testing.T) {
	assert.Equal(t, "tx-u", contract.TransactionWorkflowID("u"))
	assert.Equal(t, "tx-u/n1.anneal.test", contract.NodeWorkflowID("u", "n1.anneal.test"))
	assert.Equal(t, "swd-7", contract.SoftwareWorkflowID(7))
	assert.Equal(t, "annealer", contract.AnnealerWorkflowID(contract.DefaultTaskQueue))
	assert.Equal(t, "q/annealer", contract.AnnealerWorkflowID("q"))
	assert.Equal(t, "noderole-5/run-2", contract.NodeRoleWorkflowID("", 5, 2))
	assert.Equal(t, "bootstrap/n1.anneal.test/9", contract.NodeBootstrapWorkflowID("anneal", "n1.anneal.test", 9))
}
