package fuel

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// runKey is where a run sits in plan order: the keyset of a page of runs.
type runKey struct {
	GraphIndex int    `json:"g"`
	Position   int    `json:"p"`
	NodeName   string `json:"n"`
	ID         int64  `json:"i"`
}

// RunsPage lists one page of a transaction's runs in plan order (graph,
// position, node), keyset-paginated so that a page of a transaction of tens
// of thousands of runs is one index range scan (task_runs_tx_order_idx).
func (s *Store) RunsPage(ctx context.Context, id uuid.UUID, f RunFilter, page models.Page) (runs []models.TaskRun, next string, err error) {
	if _, err := s.Transaction(ctx, id); err != nil {
		return nil, "", err
	}
	limit := page.PageLimit()
	q := s.DB.WithContext(ctx).Where("transaction_id = ?", id).
		Order("graph_index, position, node_name, id").Limit(limit + 1)
	if page.Cursor != "" {
		var k runKey
		if err := models.DecodeCursor(page.Cursor, &k); err != nil {
			return nil, "", err
		}
		q = q.Where("(graph_index, position, node_name, id) > (?, ?, ?, ?)", k.GraphIndex, k.Position, k.NodeName, k.ID)
	}
	if f.Node != "" {
		q = q.Where("node_name = ? OR node_id::text = ?", f.Node, f.Node)
	}
	if f.State != "" {
		q = q.Where("state = ?", f.State)
	}
	if err := q.Find(&runs).Error; err != nil {
		return nil, "", fmt.Errorf("list runs of %s: %w", id, err)
	}
	if len(runs) > limit {
		runs = runs[:limit]
		last := runs[limit-1]
		next = models.EncodeCursor(runKey{last.GraphIndex, last.Position, last.NodeName, last.ID})
	}
	return runs, next, nil
}

// TransactionFilter narrows GET /transactions.
type TransactionFilter struct {
	// Deployment is a deployment's name or id.
	Deployment string
	Status     string
	// Since and Until bound the creation time (inclusive, exclusive).
	Since, Until *time.Time
}

// txKey is a transaction's place in the newest-first order.
type txKey struct {
	CreatedAt time.Time `json:"t"`
	ID        uuid.UUID `json:"i"`
}

// Transactions lists one page of transactions, newest first (keyset on
// created_at, id), each with its deployment's name, counts and progress as
// GET /transactions/:uuid shows them (without the failed runs' names).
func (s *Store) Transactions(ctx context.Context, f TransactionFilter, page models.Page) (out []TransactionStatus, next string, err error) {
	db := s.DB.WithContext(ctx)
	limit := page.PageLimit()
	q := db.Order("created_at DESC, id DESC").Limit(limit + 1)
	if f.Deployment != "" {
		dep, err := models.DeploymentInField(db, "deployment", f.Deployment)
		if err != nil {
			return nil, "", err
		}
		q = q.Where("deployment_id = ?", dep.ID)
	}
	if f.Status != "" {
		q = q.Where("status = ?", f.Status)
	}
	if f.Since != nil {
		q = q.Where("created_at >= ?", *f.Since)
	}
	if f.Until != nil {
		q = q.Where("created_at < ?", *f.Until)
	}
	if page.Cursor != "" {
		var k txKey
		if err := models.DecodeCursor(page.Cursor, &k); err != nil {
			return nil, "", err
		}
		q = q.Where("(created_at, id) < (?, ?)", k.CreatedAt, k.ID)
	}
	var txns []Transaction
	if err := q.Find(&txns).Error; err != nil {
		return nil, "", fmt.Errorf("list transactions: %w", err)
	}
	if len(txns) > limit {
		txns = txns[:limit]
		last := txns[limit-1]
		next = models.EncodeCursor(txKey{last.CreatedAt, last.ID})
	}
	if len(txns) == 0 {
		return []TransactionStatus{}, "", nil
	}
	ids := make([]uuid.UUID, len(txns))
	depIDs := make([]int64, 0, len(txns))
	for i, t := range txns {
		ids[i] = t.ID
		depIDs = append(depIDs, t.DeploymentID)
	}
	// The page's counts and deployment names in two queries, not two per
	// transaction.
	var counts []struct {
		TransactionID uuid.UUID
		State         string
		N             int
	}
	if err := db.Model(&models.TaskRun{}).Select("transaction_id, state, count(*) AS n").
		Where("transaction_id IN ?", ids).Group("transaction_id, state").Scan(&counts).Error; err != nil {
		return nil, "", fmt.Errorf("count runs of transactions: %w", err)
	}
	var deps []models.Deployment
	if err := db.Select("id", "name").Where("id IN ?", depIDs).Find(&deps).Error; err != nil {
		return nil, "", fmt.Errorf("load deployments of transactions: %w", err)
	}
	names := map[int64]string{}
	for _, d := range deps {
		names[d.ID] = d.Name
	}
	byTx := map[uuid.UUID]map[string]int{}
	for _, c := range counts {
		if byTx[c.TransactionID] == nil {
			byTx[c.TransactionID] = map[string]int{}
		}
		byTx[c.TransactionID][c.State] = c.N
	}
	out = make([]TransactionStatus, len(txns))
	for i, t := range txns {
		st := TransactionStatus{Transaction: t, Deployment: names[t.DeploymentID], Counts: map[string]int{}}
		done := 0
		for state, n := range byTx[t.ID] {
			st.Counts[state] = n
			st.Total += n
			if contract.RunFinal(state) {
				done += n
			}
		}
		st.Progress = 100
		if st.Total > 0 {
			st.Progress = done * 100 / st.Total
		}
		out[i] = st
	}
	return out, next, nil
}
