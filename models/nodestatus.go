package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// Computed node statuses (never stored).
const (
	NodeProvisioning = "provisioning"
	NodeDeploying    = "deploying"
	NodeError        = "error"
)

// ComputedStatus is the status an operator sees: error when an error type
// is set, provisioning or deploying while an action runs on the node
// (progress below 100), else the stored status. As Fuel's graph concept
// defines it, only discover, provisioned and deployed are stored.
func (n *Node) ComputedStatus() string {
	switch {
	case n.ErrorType != nil && *n.ErrorType != "":
		return NodeError
	case n.Progress < 100 && n.Status == NodeDiscover:
		return NodeProvisioning
	case n.Progress < 100 && n.Status == NodeProvisioned:
		return NodeDeploying
	}
	return n.Status
}

// MarshalJSON adds the computed status to a node's JSON.
func (n Node) MarshalJSON() ([]byte, error) {
	type plain Node // no methods: no recursion
	return json.Marshal(struct {
		plain
		ComputedStatus string `json:"computed_status"`
	}{plain(n), n.ComputedStatus()})
}

// StartLocalRun marks a run executed by the orchestrator running (a new
// attempt, claimed at once so no agent takes it) and returns it with its
// node. A run that already succeeded is returned unchanged, one whose inputs
// turn out unchanged is returned skipped (see settleInputs); while the node
// runs something else the answer is a *NodeBusyError.
func (s *Store) StartLocalRun(ctx context.Context, runID int64) (*TaskRun, *Node, error) {
	var run TaskRun
	var node Node
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&run, runID).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return NotFound("run", runID)
			}
			return fmt.Errorf("load run %d: %w", runID, err)
		}
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&node, run.NodeID).Error; err != nil {
			return fmt.Errorf("load node of run %d: %w", runID, err)
		}
		if run.State == contract.RunSucceeded || run.State == contract.RunSkipped {
			return nil
		}
		// Every run it depends on has ended: its inputs are final, and may
		// show that it has nothing to do (LCM).
		skipped, err := settleInputs(tx, runID)
		if err != nil {
			return err
		}
		if skipped != nil {
			run = *skipped
			return nil
		}
		// One thing at a time on a node, even when the worker runs it.
		var nr int64
		if run.NodeRoleID != nil {
			nr = *run.NodeRoleID
		}
		busy, err := NodeRunning(tx, node.ID, run.ID, nr)
		if err != nil {
			return err
		}
		if busy != "" {
			return &NodeBusyError{Node: node.Name, Reason: busy}
		}
		t := Now()
		run.State, run.Attempt, run.ClaimedAt, run.StartedAt, run.FinishedAt = contract.RunRunning, run.Attempt+1, &t, &t, nil
		run.ExitCode, run.Error = nil, ""
		return tx.Model(&run).Select("state", "attempt", "claimed_at", "started_at", "finished_at", "exit_code", "error").
			Updates(&run).Error
	})
	if err != nil {
		return nil, nil, err
	}
	return &run, &node, nil
}

// NodeBootID returns a node's current boot id.
func (s *Store) NodeBootID(ctx context.Context, nodeID int64) (string, error) {
	var node Node
	if err := s.DB.WithContext(ctx).Select("boot_id").Take(&node, nodeID).Error; err != nil {
		return "", fmt.Errorf("load boot id of node %d: %w", nodeID, err)
	}
	return node.BootID, nil
}
