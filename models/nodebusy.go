package models

import (
	"fmt"
	"time"

	"gorm.io/gorm"
)

// staleAfter is how long past its timeout a run or a transition may still
// hold its node. A row left running by a workflow that was terminated
// (rather than stopped) would otherwise keep the node busy forever; an
// agent enforces every run's timeout, so nothing runs longer than that.
const staleAfter = 2 * time.Minute

// NodeBusyError says why a run cannot be handed to its node yet: the node
// is running something else. The dispatcher waits and tries again.
type NodeBusyError struct {
	Node   string
	Reason string
}

// Error names the node and what keeps it busy.
func (e *NodeBusyError) Error() string { return fmt.Sprintf("node %s is busy: %s", e.Node, e.Reason) }

// nodeRunning says what the node is running besides exceptRun and
// exceptNodeRole ("" when nothing): a noderole in transition or a task run
// under way, either within its timeout. The caller holds the node's row
// lock, so that two dispatchers cannot both find the node free.
func NodeRunning(tx *gorm.DB, nodeID, exceptRun, exceptNodeRole int64) (string, error) {
	var reasons []string
	err := tx.Raw(`
SELECT format('noderole %s (%s) is in transition', nr.id, r.name)
FROM noderoles nr JOIN roles r ON r.id = nr.role_id
WHERE nr.node_id = @node AND nr.state = 'transition' AND nr.id <> @nr
  AND nr.updated_at > now() - make_interval(secs => @hold)
UNION ALL
SELECT format('run %s (%s) is running', t.id, t.task_name)
FROM task_runs t
WHERE t.node_id = @node AND t.state = 'running' AND t.id <> @run
  AND t.started_at > now() - make_interval(secs => coalesce((t.spec->>'timeout_sec')::int, 0) + @stale)
LIMIT 1`, map[string]any{"node": nodeID, "run": exceptRun, "nr": exceptNodeRole,
		"hold": NodeRoleTimeoutSec + int(staleAfter.Seconds()), "stale": int(staleAfter.Seconds())}).Find(&reasons).Error
	if err != nil {
		return "", fmt.Errorf("check what node %d runs: %w", nodeID, err)
	}
	if len(reasons) == 0 {
		return "", nil
	}
	return reasons[0], nil
}

// transactionWants returns an unfinished transaction that still has runs
// to do on the node ("" when none): the annealer leaves the node to it
// until it ends (its end wakes the annealer), and the node is not deleted.
func TransactionWants(tx *gorm.DB, nodeID int64) (string, error) {
	var ids []string
	err := tx.Raw(`SELECT t.transaction_id::text FROM task_runs t JOIN transactions x ON x.id = t.transaction_id
		WHERE t.node_id = ? AND t.state IN ('pending', 'running') AND x.status IN ? LIMIT 1`,
		nodeID, []string{TxPending, TxRunning}).Find(&ids).Error
	if err != nil {
		return "", fmt.Errorf("check transactions on node %d: %w", nodeID, err)
	}
	if len(ids) == 0 {
		return "", nil
	}
	return ids[0], nil
}

// NodeRoleTimeoutSec bounds one run of a noderole on its node (and so how
// long a noderole in transition may hold its node).
const NodeRoleTimeoutSec = 600
