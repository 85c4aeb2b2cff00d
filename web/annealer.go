package web

import (
	"context"
	"fmt"
	"net/http"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// kickAnnealer wakes the annealer after a change it must see (a commit, a
// retry, a node that came back or became available). What changed is
// already committed, so a failure here loses nothing: the annealer's
// periodic fallback round finds the work. It returns a note for answers
// that report it, nil when the kick went through.
func (s *Server) kickAnnealer(ctx context.Context, reason string) map[string]any {
	if err := contract.KickAnnealer(ctx, s.cfg.Temporal, s.cfg.TaskQueue, reason); err != nil {
		s.log.Warn("annealer not woken", "reason", reason, "error", err)
		return map[string]any{"error": err.Error(),
			"hint": "the change is saved; the annealer picks it up within 5 minutes, or at once when anything else wakes it"}
	}
	return nil
}

// startBootstrap starts a new node's bootstrap workflow; it is called
// inside the database transaction that creates the node, so the node is
// not created when Temporal cannot be reached.
func (s *Server) startBootstrap(ctx context.Context) func(*models.Node) error {
	return func(node *models.Node) error {
		err := contract.StartNodeBootstrap(ctx, s.cfg.Temporal, s.cfg.TaskQueue, contract.NodeBootstrapInput{NodeID: node.ID, Node: node.Name})
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "temporal_unavailable",
				fmt.Sprintf("node %s not created: its bootstrap workflow could not start; nothing was recorded: %v", node.Name, err))
		}
		return nil
	}
}
