package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/google/uuid"
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

// nodeAttributeUpdates turns a callback's node_attributes into column
// updates of a node: status (only a storable one; Fuel's "ready" means
// deployed, transient ones are computed and so ignored), error_type (null
// clears it), and any other key into the node's attributes.
func nodeAttributeUpdates(node *Node, attrs map[string]any) map[string]any {
	updates := map[string]any{}
	extra := maps.Clone(node.Attributes)
	if extra == nil {
		extra = map[string]any{}
	}
	changedExtra := false
	for key, value := range attrs {
		switch key {
		case "status":
			status, _ := value.(string)
			if status == "ready" {
				status = NodeDeployed
			}
			if status == NodeDiscover || status == NodeProvisioned || status == NodeDeployed {
				updates["status"] = status
			}
		case "error_type":
			if s, ok := value.(string); ok && s != "" {
				updates["error_type"] = s
			} else {
				updates["error_type"] = nil
			}
		case "progress":
			// Progress belongs to the framework: it resets when an action ends.
		default:
			extra[key] = value
			changedExtra = true
		}
	}
	if changedExtra {
		updates["attributes"] = extra
	}
	return updates
}

// callbackAttributes reads node_attributes of on_<outcome> from a graph's
// metadata; a missing or null callback does nothing.
func callbackAttributes(metadata map[string]any, outcome string) map[string]any {
	cb, _ := metadata["on_"+outcome].(map[string]any)
	attrs, _ := cb["node_attributes"].(map[string]any)
	return attrs
}

// StartNodeGraph marks a node busy with a graph: progress 0 until it ends.
func (s *Store) StartNodeGraph(ctx context.Context, nodeID int64) error {
	err := s.DB.WithContext(ctx).Model(&Node{}).Where("id = ?", nodeID).
		Updates(map[string]any{"progress": 0, "updated_at": Now()}).Error
	if err != nil {
		return fmt.Errorf("start graph on node %d: %w", nodeID, err)
	}
	return nil
}

// FinishNodeGraph applies the graph's on_success, on_error or on_stop
// callback to the node and resets its progress to 100 (the action has
// committed). Applying it twice gives the same node.
func (s *Store) FinishNodeGraph(ctx context.Context, id uuid.UUID, gi int, nodeID int64, outcome string) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var txn Transaction
		if err := tx.Take(&txn, "id = ?", id).Error; err != nil {
			return fmt.Errorf("load transaction %s: %w", id, err)
		}
		if gi < 0 || gi >= len(txn.Graphs) {
			return fmt.Errorf("transaction %s has no graph %d", id, gi)
		}
		var dep Deployment
		if err := tx.Take(&dep, txn.DeploymentID).Error; err != nil {
			return fmt.Errorf("load deployment of %s: %w", id, err)
		}
		graph, err := resolveGraph(tx, &dep, txn.Graphs[gi].Type)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		var node Node
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&node, nodeID).Error; err != nil {
			return fmt.Errorf("load node %d: %w", nodeID, err)
		}
		updates := map[string]any{}
		if graph != nil {
			updates = nodeAttributeUpdates(&node, callbackAttributes(graph.Metadata, outcome))
		}
		updates["progress"] = 100
		updates["updated_at"] = Now()
		if attrs, ok := updates["attributes"]; ok {
			node.Attributes = attrs.(map[string]any)
			delete(updates, "attributes")
			if err := tx.Model(&node).Select("attributes").Updates(&Node{Attributes: node.Attributes}).Error; err != nil {
				return fmt.Errorf("update attributes of node %d: %w", nodeID, err)
			}
		}
		if err := tx.Model(&Node{}).Where("id = ?", nodeID).Updates(updates).Error; err != nil {
			return fmt.Errorf("finish graph on node %d: %w", nodeID, err)
		}
		return nil
	})
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
// node. A run that already succeeded is returned unchanged; while the node
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
		if run.State == contract.RunSucceeded {
			return nil
		}
		// One thing at a time on a node, even when the worker runs it.
		var nr int64
		if run.NodeRoleID != nil {
			nr = *run.NodeRoleID
		}
		busy, err := nodeRunning(tx, node.ID, run.ID, nr)
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

// MoveToBootstrap returns a node to discovery: back in the system
// deployment, without roles or tags, status discover and no error. Its
// credential stays, so its agent carries on.
func (s *Store) MoveToBootstrap(ctx context.Context, nodeID int64) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		sys, err := FindDeployment(tx, SystemDeployment)
		if err != nil {
			return err
		}
		node := Node{ID: nodeID, DeploymentID: sys.ID, Roles: []string{}, Tags: []string{}, Status: NodeDiscover, UpdatedAt: Now()}
		res := tx.Model(&node).Select("deployment_id", "roles", "tags", "status", "error_type", "updated_at").Updates(&node)
		if res.Error != nil {
			return fmt.Errorf("move node %d to bootstrap: %w", nodeID, res.Error)
		}
		if res.RowsAffected == 0 {
			return NotFound("node", nodeID)
		}
		return nil
	})
}

// NodeBootID returns a node's current boot id.
func (s *Store) NodeBootID(ctx context.Context, nodeID int64) (string, error) {
	var node Node
	if err := s.DB.WithContext(ctx).Select("boot_id").Take(&node, nodeID).Error; err != nil {
		return "", fmt.Errorf("load boot id of node %d: %w", nodeID, err)
	}
	return node.BootID, nil
}
