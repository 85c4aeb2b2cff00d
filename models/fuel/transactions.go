package fuel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// ExecuteInput is the body of POST /graphs/execute.
type ExecuteInput struct {
	Deployment string
	Graphs     []GraphRequest
	DryRun     bool
	Force      bool
	// MaxNodesInFlight and FailureThreshold apply to every graph that does
	// not set its own.
	MaxNodesInFlight int
	FailureThreshold *int
}

// CreateTransaction validates an execute request completely (deployment,
// graph types, node and task filters, and that every graph plans without a
// cycle), then inserts the transaction and calls start inside the same
// database transaction: if start fails, nothing is written.
func (s *Store) CreateTransaction(ctx context.Context, in ExecuteInput, start func(*Transaction) error) (*Transaction, error) {
	if in.Deployment == "" {
		return nil, models.Invalid("deployment", "is required (a deployment name or id)")
	}
	if len(in.Graphs) == 0 {
		return nil, models.Invalid("graphs", "must list at least one graph, e.g. [{\"type\": \"deployment\"}]")
	}
	if err := validateExecute(in); err != nil {
		return nil, err
	}
	var txn *Transaction
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := models.DeploymentInField(tx, "deployment", in.Deployment)
		if err != nil {
			return err
		}
		nodes, err := plannableNodes(tx, dep.ID)
		if err != nil {
			return err
		}
		if err := checkValves("", in.MaxNodesInFlight, in.FailureThreshold); err != nil {
			return err
		}
		for i := range in.Graphs {
			g := &in.Graphs[i]
			field := fmt.Sprintf("graphs[%d]", i)
			if g.Type == "" {
				return models.Invalid(field+".type", "is required")
			}
			if err := checkValves(field+".", g.MaxNodesInFlight, g.FailureThreshold); err != nil {
				return err
			}
			if g.MaxNodesInFlight == 0 {
				g.MaxNodesInFlight = in.MaxNodesInFlight
			}
			if g.FailureThreshold == nil {
				g.FailureThreshold = in.FailureThreshold
			}
			graph, err := graphTasks(tx, dep, g.Type)
			if errors.Is(err, models.ErrNotFound) {
				return models.Invalid(field+".type", "deployment %q has no graph of type %q", dep.Name, g.Type)
			}
			if err != nil {
				return err
			}
			if err := checkFilters(field, *g, graph, dep, tx); err != nil {
				return err
			}
			built, err := plan.Build(graph.Tasks, nodes, plan.Options{Nodes: g.Nodes, Tasks: g.Tasks})
			if err != nil {
				return planError(field, err)
			}
			// Every secret the planned runs reference must be set now; a
			// missing one is named here rather than failing a run later.
			tasks := make([]*plan.Task, 0, len(built.Runs))
			for _, r := range built.Runs {
				tasks = append(tasks, r.Task)
			}
			missing, err := models.MissingSecrets(tx, dep.ID, SecretNames(tasks))
			if err != nil {
				return err
			}
			if len(missing) > 0 {
				return models.MissingSecretsError(field+".type", dep.Name, missing)
			}
			for j := range graph.Tasks {
				if graph.Tasks[j].IsMarker() {
					continue
				}
				if _, err := runSpec(&graph.Tasks[j]); err != nil {
					return models.Invalid(field+".type", "graph %q: %v", g.Type, err)
				}
			}
		}
		txn = &Transaction{
			ID: uuid.New(), DeploymentID: dep.ID, Graphs: in.Graphs, DryRun: in.DryRun, Force: in.Force,
			Status: models.TxPending, Warnings: []string{},
		}
		txn.WorkflowID = contract.TransactionWorkflowID(txn.ID.String())
		if err := tx.Create(txn).Error; err != nil {
			return fmt.Errorf("create transaction: %w", err)
		}
		return start(txn)
	})
	if err != nil {
		return nil, err
	}
	return txn, nil
}

// checkValves validates the safety valves of a transaction or a graph.
func checkValves(prefix string, maxNodes int, threshold *int) error {
	if maxNodes < 0 || maxNodes > models.MaxNodesInFlight {
		return models.Invalid(prefix+"max_nodes_in_flight", "must be 0 (the default, %d) or more, at most %d, not %d",
			contract.DefaultMaxNodesInFlight, models.MaxNodesInFlight, maxNodes)
	}
	if threshold != nil && (*threshold < 0 || *threshold > 100) {
		return models.Invalid(prefix+"failure_threshold", "must be a percentage from 0 to 100, not %d", *threshold)
	}
	return nil
}

// maxExecuteGraphs bounds the graphs of one execute request.
const maxExecuteGraphs = 100

// validateExecute checks what an execute request can be checked for without
// the database: sizes, ranges and forms, so that nothing absurd reaches a
// query or a workflow.
func validateExecute(in ExecuteInput) error {
	if err := models.ValidLine("deployment", in.Deployment, models.MaxLineLen); err != nil {
		return err
	}
	if err := models.MaxItems("graphs", len(in.Graphs), maxExecuteGraphs); err != nil {
		return err
	}
	if err := checkValves("", in.MaxNodesInFlight, in.FailureThreshold); err != nil {
		return err
	}
	for i, g := range in.Graphs {
		field := fmt.Sprintf("graphs[%d]", i)
		if g.Type == "" {
			return models.Invalid(field+".type", "is required")
		}
		if err := ValidateGraphType(g.Type); err != nil {
			return models.Invalid(field+".type", "%s", err.(*models.InputError).Reason)
		}
		if err := checkValves(field+".", g.MaxNodesInFlight, g.FailureThreshold); err != nil {
			return err
		}
		if err := models.MaxItems(field+".nodes", len(g.Nodes), models.MaxListLen); err != nil {
			return err
		}
		for j, id := range g.Nodes {
			if id < 1 {
				return models.Invalid(fmt.Sprintf("%s.nodes[%d]", field, j), "is a node id (1 or more), not %d", id)
			}
		}
		if err := models.MaxItems(field+".tasks", len(g.Tasks), models.MaxListLen); err != nil {
			return err
		}
		for j, name := range g.Tasks {
			if err := models.ValidLine(fmt.Sprintf("%s.tasks[%d]", field, j), name, models.MaxTaskIDLen); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkFilters verifies that every node of a graph's filter belongs to the
// deployment and every task names a task of the graph.
func checkFilters(field string, g GraphRequest, graph *ResolvedGraph, dep *models.Deployment, tx *gorm.DB) error {
	if len(g.Nodes) > 0 {
		var found []int64
		if err := tx.Model(&models.Node{}).Where("id IN ? AND deployment_id = ?", g.Nodes, dep.ID).Pluck("id", &found).Error; err != nil {
			return fmt.Errorf("check nodes: %w", err)
		}
		have := map[int64]bool{}
		for _, id := range found {
			have[id] = true
		}
		for j, id := range g.Nodes {
			if !have[id] {
				return models.Invalid(subField(field, fmt.Sprintf("nodes[%d]", j)), "node %d is not in deployment %q", id, dep.Name)
			}
		}
	}
	known := map[string]bool{}
	for _, t := range graph.Tasks {
		known[t.ID] = true
	}
	for j, name := range g.Tasks {
		if !known[name] {
			return models.Invalid(subField(field, fmt.Sprintf("tasks[%d]", j)), "graph %q has no task %q", g.Type, name)
		}
	}
	return nil
}

// subField names a field inside another ("" for a top-level one).
func subField(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// planError turns a planner error into bad input naming the graph.
func planError(field string, err error) error {
	var cycle *plan.CycleError
	if errors.As(err, &cycle) {
		return &models.InputError{Field: field, Reason: err.Error(), Details: map[string]any{"cycle": cycle.Path}}
	}
	var verr *plan.ValidationError
	if errors.As(err, &verr) {
		return &models.InputError{Field: field, Reason: err.Error()}
	}
	return fmt.Errorf("%s: %w", field, err)
}

// plannableNodes are the nodes of a deployment the annealer may give work:
// allocated, alive and available. Their role names count as tags even when
// the user removed them (Fuel's implicit role-name tag). The primary of each
// has_primary tag is decided among all the deployment's nodes and recorded
// (see primaryPlanningTags in tags.go); it also gets "primary-<tag>".
func plannableNodes(tx *gorm.DB, deploymentID int64) ([]plan.Node, error) {
	var nodes []models.Node
	err := tx.Select("id", "name", "roles", "tags", "allocated", "alive", "available").
		Where("deployment_id = ?", deploymentID).
		Order("name").Find(&nodes).Error
	if err != nil {
		return nil, fmt.Errorf("load nodes of deployment %d: %w", deploymentID, err)
	}
	primary, err := primaryPlanningTags(tx, deploymentID, nodes)
	if err != nil {
		return nil, err
	}
	// A node the worker reaches over SSH (it has a key) needs no agent:
	// "alive" (its agent phoning home) does not apply to it.
	var viaSSH []int64
	if err := tx.Model(&models.NodeSSH{}).Scopes(models.WithSSHKey).Where("node_id IN (SELECT id FROM nodes WHERE deployment_id = ?)", deploymentID).
		Pluck("node_id", &viaSSH).Error; err != nil {
		return nil, fmt.Errorf("load the ssh nodes of deployment %d: %w", deploymentID, err)
	}
	out := make([]plan.Node, 0, len(nodes))
	for _, n := range nodes {
		if n.Allocated && (n.Alive || slices.Contains(viaSSH, n.ID)) && n.Available {
			out = append(out, plan.Node{ID: n.ID, Name: n.Name, Tags: append(plan.NodeTags(n.Roles, n.Tags), primary[n.ID]...)})
		}
	}
	return out, nil
}

// Transaction loads one transaction.
func (s *Store) Transaction(ctx context.Context, id uuid.UUID) (*Transaction, error) {
	var txn Transaction
	err := s.DB.WithContext(ctx).Take(&txn, "id = ?", id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("transaction", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load transaction %s: %w", id, err)
	}
	return &txn, nil
}

// TransactionStatus is a transaction with its progress, for the API.
type TransactionStatus struct {
	Transaction
	Deployment string         `json:"deployment"`
	Progress   int            `json:"progress"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	FailedRuns []string       `json:"failed_runs,omitempty"`
}

// TransactionStatus returns a transaction with its counts per run state and
// its progress in percent.
func (s *Store) TransactionStatus(ctx context.Context, id uuid.UUID) (*TransactionStatus, error) {
	txn, err := s.Transaction(ctx, id)
	if err != nil {
		return nil, err
	}
	db := s.DB.WithContext(ctx)
	out := &TransactionStatus{Transaction: *txn, Counts: map[string]int{}}
	var dep models.Deployment
	if err := db.Select("name").Take(&dep, txn.DeploymentID).Error; err != nil {
		return nil, fmt.Errorf("load deployment of transaction %s: %w", id, err)
	}
	out.Deployment = dep.Name
	counts, err := runCounts(db, id)
	if err != nil {
		return nil, err
	}
	done := 0
	for state, n := range counts {
		out.Counts[state] = n
		out.Total += n
		if contract.RunFinal(state) {
			done += n
		}
	}
	out.Progress = 100
	if out.Total > 0 {
		out.Progress = done * 100 / out.Total
	}
	out.FailedRuns, err = failedRuns(db, id, 20)
	return out, err
}

func runCounts(db *gorm.DB, id uuid.UUID) (map[string]int, error) {
	var rows []struct {
		State string
		N     int
	}
	if err := db.Model(&models.TaskRun{}).Select("state, count(*) AS n").Where("transaction_id = ?", id).Group("state").Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count runs of %s: %w", id, err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.State] = r.N
	}
	return out, nil
}

// failedRuns names up to limit failed runs as "task@node: reason".
func failedRuns(db *gorm.DB, id uuid.UUID, limit int) ([]string, error) {
	var runs []models.TaskRun
	err := db.Select("task_name", "node_name", "exit_code", "error", "graph_type").
		Where("transaction_id = ? AND state = ?", id, contract.RunFailed).Order("finished_at, id").Limit(limit).Find(&runs).Error
	if err != nil {
		return nil, fmt.Errorf("list failed runs of %s: %w", id, err)
	}
	out := make([]string, 0, len(runs))
	for _, r := range runs {
		reason := r.Error
		if reason == "" && r.ExitCode != nil {
			reason = fmt.Sprintf("exit code %d", *r.ExitCode)
		}
		out = append(out, fmt.Sprintf("%s@%s: %s", r.TaskName, r.NodeName, reason))
	}
	return out, nil
}

// FinishTransaction records how a transaction ended. The status comes from
// the runs in Postgres unless stopped or failReason says otherwise: any
// failed or blocked run makes it error, with the failed runs named.
func (s *Store) FinishTransaction(ctx context.Context, id uuid.UUID, stopped bool, failReason string) (*TransactionStatus, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Runs a stop or a failed plan left behind never ran.
		if err := tx.Model(&models.TaskRun{}).Where("transaction_id = ? AND state = ?", id, contract.RunPending).
			Updates(map[string]any{"state": contract.RunCancelled, "error": "never started: the transaction ended first", "updated_at": models.Now()}).Error; err != nil {
			return fmt.Errorf("cancel leftover runs of %s: %w", id, err)
		}
		counts, err := runCounts(tx, id)
		if err != nil {
			return err
		}
		status, msg := models.TxReady, ""
		switch {
		case failReason != "":
			status, msg = models.TxError, failReason
		case stopped:
			status, msg = models.TxStopped, "stopped by request"
		case counts[contract.RunFailed] > 0 || counts[contract.RunBlocked] > 0 || counts[contract.RunCancelled] > 0:
			failed, err := failedRuns(tx, id, 10)
			if err != nil {
				return err
			}
			status = models.TxError
			msg = fmt.Sprintf("%d run(s) failed, %d blocked, %d cancelled", counts[contract.RunFailed], counts[contract.RunBlocked], counts[contract.RunCancelled])
			if len(failed) > 0 {
				msg += ": " + strings.Join(failed, "; ")
			}
		}
		res := tx.Model(&Transaction{}).Where("id = ?", id).Updates(map[string]any{
			"status": status, "error": msg, "finished_at": models.Now(),
		})
		if res.Error != nil {
			return fmt.Errorf("finish transaction %s: %w", id, res.Error)
		}
		if res.RowsAffected == 0 {
			return models.NotFound("transaction", id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.TransactionStatus(ctx, id)
}

// RunFilter narrows a run listing.
type RunFilter struct {
	Node  string // node name or id
	State string
}

// Runs lists a transaction's runs in plan order.
func (s *Store) Runs(ctx context.Context, id uuid.UUID, f RunFilter) ([]models.TaskRun, error) {
	if _, err := s.Transaction(ctx, id); err != nil {
		return nil, err
	}
	q := s.DB.WithContext(ctx).Where("transaction_id = ?", id).Order("graph_index, position, node_name")
	if f.Node != "" {
		q = q.Where("node_name = ? OR node_id::text = ?", f.Node, f.Node)
	}
	if f.State != "" {
		q = q.Where("state = ?", f.State)
	}
	var runs []models.TaskRun
	if err := q.Find(&runs).Error; err != nil {
		return nil, fmt.Errorf("list runs of %s: %w", id, err)
	}
	return runs, nil
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ReopenTransaction makes a failed or stopped transaction pending again and
// calls start (which starts its workflow again) in the same database
// transaction: if start fails, nothing changes.
func (s *Store) ReopenTransaction(ctx context.Context, id uuid.UUID, start func(*Transaction) error) (*Transaction, error) {
	var txn Transaction
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&txn, "id = ?", id).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return models.NotFound("transaction", id)
			}
			return fmt.Errorf("load transaction %s: %w", id, err)
		}
		if txn.Status != models.TxError && txn.Status != models.TxStopped {
			return &models.ConflictError{Reason: fmt.Sprintf("transaction %s is %s; only a failed (error) or stopped one can be retried", id, txn.Status)}
		}
		txn.Status, txn.Error, txn.FinishedAt = models.TxPending, "", nil
		if err := tx.Model(&txn).Select("status", "error", "finished_at").Updates(&txn).Error; err != nil {
			return fmt.Errorf("reopen transaction %s: %w", id, err)
		}
		return start(&txn)
	})
	if err != nil {
		return nil, err
	}
	return &txn, nil
}

// UnfinishedTransactions lists the transactions still pending or running
// that were created before the given age: those a reconciler checks
// against their workflow.
func (s *Store) UnfinishedTransactions(ctx context.Context, olderThan time.Duration) ([]Transaction, error) {
	var out []Transaction
	err := s.DB.WithContext(ctx).Select("id", "status", "workflow_id", "created_at").
		Where("status IN ? AND created_at < ?", []string{models.TxPending, models.TxRunning}, models.Now().Add(-olderThan)).
		Order("created_at").Limit(1000).Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list unfinished transactions: %w", err)
	}
	return out, nil
}

// EndAbandonedTransaction ends a transaction whose workflow Temporal ended
// without it (terminated, timed out, failed, or gone): in one database
// transaction its running runs fail and its pending ones are cancelled,
// each with reason, its nodes' progress ends (so they are free for other
// work), and the transaction goes to status (TxError, or TxStopped for a
// workflow that was cancelled) with reason. A transaction that already
// ended is left as it is: the answer's Changed says which.
func (s *Store) EndAbandonedTransaction(ctx context.Context, id uuid.UUID, status, reason string) (*Transaction, bool, error) {
	var txn Transaction
	changed := false
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&txn, "id = ?", id).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return models.NotFound("transaction", id)
			}
			return fmt.Errorf("load transaction %s: %w", id, err)
		}
		if txn.Status != models.TxPending && txn.Status != models.TxRunning {
			return nil
		}
		now := models.Now()
		if err := tx.Exec(`UPDATE nodes SET progress = 100, updated_at = ? WHERE progress < 100 AND id IN
(SELECT DISTINCT node_id FROM task_runs WHERE transaction_id = ? AND state IN ?)`,
			now, id, []string{contract.RunPending, contract.RunRunning}).Error; err != nil {
			return fmt.Errorf("free the nodes of transaction %s: %w", id, err)
		}
		for state, newState := range map[string]string{contract.RunRunning: contract.RunFailed, contract.RunPending: contract.RunCancelled} {
			if err := tx.Model(&models.TaskRun{}).Where("transaction_id = ? AND state = ?", id, state).Updates(map[string]any{
				"state": newState, "error": reason, "finished_at": now, "updated_at": now,
			}).Error; err != nil {
				return fmt.Errorf("end the %s runs of transaction %s: %w", state, id, err)
			}
		}
		txn.Status, txn.Error, txn.FinishedAt = status, reason, &now
		if err := tx.Model(&txn).Select("status", "error", "finished_at").Updates(&txn).Error; err != nil {
			return fmt.Errorf("end transaction %s: %w", id, err)
		}
		changed = true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return &txn, changed, nil
}
