package fuel

import (
	"context"
	"database/sql"
	"fmt"
	"maps"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
)

// nodeAttributeUpdates turns a callback's node_attributes into column
// updates of a node: status (only a storable one; Fuel's "ready" means
// deployed, transient ones are computed and so ignored), error_type (null
// clears it), and any other key into the node's attributes.
func nodeAttributeUpdates(node *models.Node, attrs map[string]any) map[string]any {
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
				status = models.NodeDeployed
			}
			if status == models.NodeDiscover || status == models.NodeProvisioned || status == models.NodeDeployed {
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

// FinishNodeGraph applies the graph's on_success, on_error or on_stop
// callback to the node and resets its progress to 100 (the action has
// committed). Applying it twice gives the same node.
//
// It runs once per node of a transaction, so its common case is short:
// one statement sets the node's progress and reads the graph's type and
// merged metadata (finishNodeGraphSQL), and a graph with no node
// attributes to set for this outcome (most) is done. Only a callback's
// attributes take a database transaction, which locks the node to merge
// them.
func (s *Store) FinishNodeGraph(ctx context.Context, id uuid.UUID, gi int, nodeID int64, outcome string) error {
	if gi < 0 {
		// jsonb's -> counts a negative index from the end.
		return fmt.Errorf("transaction %s has no graph %d", id, gi)
	}
	db := s.DB.WithContext(ctx)
	var graphs []Graph
	err := db.Raw(finishNodeGraphSQL, sql.Named("gi", gi), sql.Named("tx", id), sql.Named("node", nodeID)).Find(&graphs).Error
	switch {
	case err != nil:
		return fmt.Errorf("finish graph %d of transaction %s on node %d: %w", gi, id, nodeID, err)
	case len(graphs) == 0:
		return fmt.Errorf("load transaction %s: %w", id, models.NotFound("transaction", id))
	case graphs[0].Type == "":
		return fmt.Errorf("transaction %s has no graph %d", id, gi)
	}
	attrs := callbackAttributes(mergedMetadata(graphs), outcome)
	if len(attrs) == 0 {
		return nil
	}
	return db.Transaction(func(tx *gorm.DB) error {
		var node models.Node
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&node, nodeID).Error; err != nil {
			return fmt.Errorf("load node %d: %w", nodeID, err)
		}
		updates := nodeAttributeUpdates(&node, attrs)
		updates["progress"] = 100
		updates["updated_at"] = models.Now()
		if attrs, ok := updates["attributes"]; ok {
			node.Attributes = attrs.(map[string]any)
			delete(updates, "attributes")
			if err := tx.Model(&node).Select("attributes").Updates(&models.Node{Attributes: node.Attributes}).Error; err != nil {
				return fmt.Errorf("update attributes of node %d: %w", nodeID, err)
			}
		}
		if err := tx.Model(&models.Node{}).Where("id = ?", nodeID).Updates(updates).Error; err != nil {
			return fmt.Errorf("finish graph on node %d: %w", nodeID, err)
		}
		return nil
	})
}

// finishNodeGraphSQL sets a node's progress to 100 at the end of graph
// @gi of transaction @tx, and reads the graph's type and the metadata of
// every graph of that type its deployment sees, in merge order (a row
// with a NULL metadata when none): no row when the transaction does not
// exist, a row with no type (and no update) when it has no such graph.
var finishNodeGraphSQL = `WITH g AS (
  SELECT t.graphs -> CAST(@gi AS int) ->> 'type' AS type, d.id AS deployment_id, d.release_id
  FROM transactions t JOIN deployments d ON d.id = t.deployment_id WHERE t.id = @tx
), fin AS (
  UPDATE nodes SET progress = 100, updated_at = now()
  WHERE id = @node AND EXISTS (SELECT 1 FROM g WHERE type IS NOT NULL)
)
SELECT g.type, gr.metadata FROM g LEFT JOIN LATERAL (
  SELECT metadata, owner_kind, owner_id FROM graphs
  WHERE type = g.type AND ` + visibleGraphsWhere("g.release_id", "g.deployment_id") + `
) gr ON true
ORDER BY ` + mergeOrder

// MoveToBootstrap returns a node to discovery: back in the system
// deployment, without roles or tags, status discover and no error. Its
// credential stays, so its agent carries on.
func (s *Store) MoveToBootstrap(ctx context.Context, nodeID int64) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		sys, err := models.FindDeployment(tx, models.SystemDeployment)
		if err != nil {
			return err
		}
		node := models.Node{ID: nodeID, DeploymentID: sys.ID, Roles: []string{}, Tags: []string{}, Status: models.NodeDiscover, UpdatedAt: models.Now()}
		res := tx.Model(&node).Select("deployment_id", "roles", "tags", "status", "error_type", "updated_at").Updates(&node)
		if res.Error != nil {
			return fmt.Errorf("move node %d to bootstrap: %w", nodeID, res.Error)
		}
		if res.RowsAffected == 0 {
			return models.NotFound("node", nodeID)
		}
		return nil
	})
}
