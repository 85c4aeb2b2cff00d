package web

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models/crowbar"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// temporalUILink is the address of a workflow in the Temporal Web UI,
// "" when the server was not told where the UI is (Config.TemporalUI).
func (s *Server) temporalUILink(workflowID string) string {
	if s.cfg.TemporalUI == "" || workflowID == "" {
		return ""
	}
	ns := s.cfg.Namespace
	if ns == "" {
		ns = "default"
	}
	// Workflow ids hold slashes (tx-<uuid>/<node>): one path segment each.
	return strings.TrimRight(s.cfg.TemporalUI, "/") + "/namespaces/" + url.PathEscape(ns) + "/workflows/" + url.PathEscape(workflowID)
}

// transactionLinks are the links of a transaction's answers.
func (s *Server) transactionLinks(id, workflowID string) map[string]string {
	links := map[string]string{
		"self": "/api/v1/transactions/" + id,
		"runs": "/api/v1/transactions/" + id + "/runs",
	}
	if ui := s.temporalUILink(workflowID); ui != "" {
		links["temporal_ui"] = ui
	}
	return links
}

// transactionView is a transaction as GET /transactions and
// GET /transactions/:uuid show it: its status and links.
type transactionView struct {
	*fuel.TransactionStatus
	Links map[string]string `json:"links"`
}

func (s *Server) transactionView(st *fuel.TransactionStatus) transactionView {
	return transactionView{TransactionStatus: st, Links: s.transactionLinks(st.ID.String(), st.WorkflowID)}
}

// nodeRoleView is a noderole with the link to its latest run's workflow.
type nodeRoleView struct {
	*crowbar.NodeRole
	Links map[string]string `json:"links,omitempty"`
}

func (s *Server) nodeRoleView(nr *crowbar.NodeRole) nodeRoleView {
	v := nodeRoleView{NodeRole: nr}
	if nr.RunCount > 0 {
		if ui := s.temporalUILink(contract.NodeRoleWorkflowID(s.cfg.TaskQueue, nr.ID, nr.RunCount)); ui != "" {
			v.Links = map[string]string{"temporal_ui": ui}
		}
	}
	return v
}

// transactionAccepted is the 202 answer to a started transaction, with
// extra entries merged in.
func (s *Server) transactionAccepted(c echo.Context, txn *fuel.Transaction, extra map[string]any) error {
	body := map[string]any{
		"task_uuid": txn.ID, "workflow_id": txn.WorkflowID, "status": txn.Status,
		"links": s.transactionLinks(txn.ID.String(), txn.WorkflowID),
	}
	for k, v := range extra {
		body[k] = v
	}
	return c.JSON(http.StatusAccepted, body)
}
