package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/secrets"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// WorkChannel is the Postgres NOTIFY channel that wakes the agents' long
// polls. The payload is a kind and the node id: "w:<id>" when a run is
// dispatched to the node (GET /agent/work), "s:<id>" when its software
// deployments change (GET /agent/software). A bare "<id>", as earlier
// versions sent, wakes both.
const WorkChannel = "anneal_work"

// EventsChannel is the Postgres NOTIFY channel of the live event stream:
// triggers (migration 0016) announce there every change of a transaction's
// status, a run's or noderole's state and a node's status, as small JSON
// objects (kind, id, deployment_id, state, ...), while some server holds a
// listener lease (migration 0028, HoldEventListener).
const EventsChannel = "anneal_events"

// CredentialsChannel is the Postgres NOTIFY channel on which a credential
// that stopped working (an operator token revoked, a node's agent
// credential replaced or deleted with its node) is announced by its hash
// (migration 0030), for the API servers to drop it from their caches.
const CredentialsChannel = "anneal_credentials"

// Kinds of wake-up on WorkChannel: the payload's prefix before the node id.
const (
	WakeWork     = "w"
	WakeSoftware = "s"
)

// Default task parameters.
const (
	DefaultTaskTimeoutSec = 300
)

// RunStates returns the current state of the given runs.
func (s *Store) RunStates(ctx context.Context, ids []int64) (map[int64]string, error) {
	var rows []TaskRun
	if err := s.DB.WithContext(ctx).Select("id", "state").Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("load run states: %w", err)
	}
	out := make(map[int64]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.State
	}
	return out, nil
}

// DispatchRun hands a run to its node's agent: it becomes running with a new
// attempt number and the activity's task token, and the agents' long polls
// wake (pg_notify, in the same statement). A run that already ended in a
// state other than failed is returned unchanged and not dispatched, so a
// retried activity never runs a succeeded run twice. A run whose inputs
// turn out to be those of its task's last successful run on the node is
// skipped instead, and returned so (see settleInputs).
//
// A node runs one thing at a time: while it runs another task or a
// noderole is in transition on it, the answer is a *NodeBusyError and the
// caller tries again later. The node's row lock makes the check and the
// dispatch one step.
func (s *Store) DispatchRun(ctx context.Context, runID int64, token []byte) (*TaskRun, error) {
	var out *TaskRun
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		out, err = dispatch(tx, runID, token, nil, true, nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// dispatchable are the states a run may be dispatched from: pending, and
// running or failed for a retry.
var dispatchable = []string{contract.RunPending, contract.RunRunning, contract.RunFailed}

// dispatch is DispatchRun inside tx: it locks the run's node, settles the
// run's inputs (LCM may skip it), checks that the node is free when
// checkBusy (a chain's later runs follow their predecessor on a node the
// chain holds), and dispatches it. chain dispatches it as a run of a chain
// (linked by DispatchChain), handed to the reporting agent when
// chain.handBack is set; nil dispatches it alone and unlinks it. locked is
// the run as lockRunAndNode read it, when the caller did already (nil:
// read here). It returns the run: the whole row, with its Context, when
// it is handed back (it goes to the agent with the answer to the report
// before it, as a work item), else the columns of dispatchColumns; a run
// it did not dispatch (skipped, ended, blocked) comes back whole.
func dispatch(tx *gorm.DB, runID int64, token []byte, chain *chainLink, checkBusy bool, locked *TaskRun) (*TaskRun, error) {
	if locked == nil {
		var err error
		if locked, err = lockRunAndNode(tx, runID, false); err != nil {
			return nil, err
		}
	}
	// A run handed back goes with a report's answer; any other wakes the
	// agents' polls.
	handBack := chain != nil && chain.handBack
	leaseSecs := 0.0 // a hand-back's, until its agent confirms it
	if handBack {
		leaseSecs = ackLeaseOr(chain.lease).Seconds()
	}
	hash := "" // the final inputs hash, written with the dispatch
	var seen *seenOutputs
	if locked != nil && slices.Contains(dispatchable, locked.State) {
		if handBack {
			// Its work item shows what it sees: read with its inputs.
			var err error
			if seen, err = loadSeenOutputs(tx, locked); err != nil {
				return nil, err
			}
		}
		// Every run it depends on has ended: its inputs are final, and
		// may show that it has nothing to do (LCM).
		skipped, h, err := finalInputsOf(tx, *locked, true, seen)
		hash = h
		if err != nil {
			return nil, err
		}
		if skipped != nil {
			return skipped, nil
		}
		if checkBusy {
			var nr int64
			if locked.NodeRoleID != nil {
				nr = *locked.NodeRoleID
			}
			busy, err := NodeRunning(tx, locked.NodeID, runID, nr)
			if err != nil {
				return nil, err
			}
			if busy != "" {
				return nil, &NodeBusyError{Node: locked.NodeName, Reason: busy}
			}
		}
	}
	returning := dispatchColumns
	if handBack {
		returning = "*" // the work item is built from it
	}
	var runs []TaskRun
	if err := tx.Raw(`
UPDATE task_runs
SET state = @running, attempt = attempt + 1, task_token = @token,
    claimed_at = CASE WHEN @handback THEN now() END, acked_at = CASE WHEN @handback THEN now() END,
    lease_until = CASE WHEN @handback THEN now() + make_interval(secs => @lease) END,
    started_at = now(), finished_at = NULL, exit_code = NULL, error = '', updated_at = now(),
    inputs_hash = CASE WHEN @hash <> '' THEN @hash ELSE inputs_hash END,
    chain_head = CASE WHEN @chained THEN chain_head END, chain_next = CASE WHEN @chained THEN chain_next END
WHERE id = @id AND state IN @dispatchable
RETURNING `+returning+`, CASE WHEN @handback THEN true ELSE pg_notify(@channel, @wake || ':' || node_id::text) IS NULL END AS notified`,
		map[string]any{"running": contract.RunRunning, "token": token, "handback": handBack, "lease": leaseSecs, "hash": hash, "chained": chain != nil,
			"id": runID, "dispatchable": dispatchable, "channel": WorkChannel, "wake": WakeWork}).Find(&runs).Error; err != nil {
		return nil, fmt.Errorf("dispatch run %d: %w", runID, err)
	}
	if len(runs) == 1 {
		if seen != nil {
			runs[0].Context = &RunContext{Outputs: seen.all, Peers: []string{}}
		}
		return &runs[0], nil
	}
	var run TaskRun
	err := tx.Take(&run, runID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("run", runID)
	}
	if err != nil {
		return nil, fmt.Errorf("load run %d: %w", runID, err)
	}
	return &run, nil
}

// lockRunAndNode locks a run's node (and the run too, when withRun), and
// reads in the same round trip what dispatching the run needs: its state
// and chain links, what settling its inputs needs (inputsColumns) and
// what its work item's context needs, or that it sees no outputs. It
// returns nil for a run without a node (deleted since): dispatch then
// leaves the decision to its UPDATE.
func lockRunAndNode(tx *gorm.DB, runID int64, withRun bool) (*TaskRun, error) {
	of := "n"
	if withRun {
		of = "t, n"
	}
	var rows []struct {
		TaskRun
		OutputsLeft bool
	}
	// Whether any run of its transaction has left outputs yet: the probe
	// of task_runs_tx_outputs_idx that spares the common dispatch, in a
	// transaction whose tasks hand over no outputs, the round trip of
	// loadSeenOutputs. The EXISTS reads the snapshot taken before the
	// wait for the locks; that is enough, as the runs whose outputs a run
	// sees ended before it could be dispatched: committed by then, or
	// written earlier in the same transaction (ReportRun).
	if err := tx.Raw(`SELECT t.id, t.transaction_id, t.node_id, t.node_name, t.noderole_id, t.task_name, t.graph_type, t.graph_index,
			t.position, t.state, t.attempt, t.chain_head, t.chain_next, t.inputs_base, t.lcm,
			`+outputsLeftSQL("t.transaction_id")+` AS outputs_left
		FROM task_runs t JOIN nodes n ON n.id = t.node_id WHERE t.id = ? FOR UPDATE OF `+of, runID).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("lock the node of run %d: %w", runID, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	run := rows[0].TaskRun
	run.noOutputsSeen = !rows[0].OutputsLeft
	return &run, nil
}

// outputsLeftSQL is whether any run of the transaction txID (an SQL
// expression) has left outputs yet: a probe of task_runs_tx_outputs_idx,
// whose predicate its literals match, so that it serves a cached generic
// plan too. A run of a transaction without outputs sees none, and its
// work item or dispatch spares the walk up its ancestors
// (loadSeenOutputs).
func outputsLeftSQL(txID string) string {
	return `EXISTS (SELECT 1 FROM task_runs o WHERE o.transaction_id = ` + txID + `
    AND o.state IN ('succeeded', 'skipped') AND o.outputs <> '{}'::jsonb)`
}

// dispatchColumns are the columns of a run dispatch returns when the run
// waits for its agent's poll: what the activity that dispatched it logs
// and goes on with. Its spec and attributes are JSON to decode, and the
// poll reads them anyway.
const dispatchColumns = "id, transaction_id, node_id, node_name, task_name, state, attempt, exit_code, task_token, chain_head, chain_next"

// chainLink dispatches a run as one of the chain headed by head (linked
// by DispatchChain). With handBack, the run goes back in the answer to its
// predecessor's report, taken by that agent there and then: no poll is
// woken for it, and it is acknowledged as it is dispatched, which saves
// the agent's ack, a request and a write per run (WorkItem.Acknowledged).
// Its acked_at equal to its claimed_at marks such a hand-back until the
// agent's first run heartbeat confirms it (AckRun): should the answer be
// lost (the agent killed before it read it, stopped before it started the
// run, or talking to an older API), the run is offered to the node's
// polls again once lease has passed, as an unacknowledged one is, and the
// report sent again hands it back again (ReportRun). The agent's
// record keeps it from running twice either way; a chain lost meanwhile
// fails it (EndLostChain), as the agent may have it.
type chainLink struct {
	head     int64
	handBack bool
	lease    time.Duration
}

// ackLeaseOr is lease, or DefaultAckLease when it is not set.
func ackLeaseOr(lease time.Duration) time.Duration {
	if lease <= 0 {
		return DefaultAckLease
	}
	return lease
}

// DispatchChain hands a chain of a node's runs to its agent under one
// activity (token): the runs, in order, each starting when the one before
// succeeded, with no cross-node wait between them. It links the runs
// (chain_head, chain_next) and dispatches the first that has not ended
// well yet: runs that already succeeded or were skipped (an earlier
// attempt got that far) are passed over, so a chain handed out again
// resumes at its first unfinished run, never at one that ended (a run
// an agent may still hold was failed or taken back by EndLostChain). LCM may
// skip runs on the way. It returns the run dispatched, or nil when none
// is left to run (all ended well, or the next one is blocked or
// cancelled). A busy node is a *NodeBusyError, as with DispatchRun.
func (s *Store) DispatchChain(ctx context.Context, runIDs []int64, token []byte) (*TaskRun, error) {
	if len(runIDs) == 0 {
		return nil, nil
	}
	var out *TaskRun
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Each run's next is the one after it in the list (none for the last).
		if err := tx.Exec(`UPDATE task_runs t SET chain_head = ?, chain_next = c.next
FROM (SELECT id, lead(id) OVER (ORDER BY o) AS next FROM unnest(?::bigint[]) WITH ORDINALITY AS u(id, o)) c
WHERE t.id = c.id`, runIDs[0], int64Array(runIDs)).Error; err != nil {
			return fmt.Errorf("link the chain of run %d: %w", runIDs[0], err)
		}
		var err error
		out, err = dispatchChained(tx, runIDs[0], token, chainLink{head: runIDs[0]}, true, nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// dispatchChained dispatches run id of a chain (locked: as lockRunAndNode
// read it, or nil) and, while it turns out to have ended well already or
// to be skipped by LCM, the runs after it; nil when the chain has nothing
// left to run.
func dispatchChained(tx *gorm.DB, id int64, token []byte, chain chainLink, checkBusy bool, locked *TaskRun) (*TaskRun, error) {
	for {
		run, err := dispatch(tx, id, token, &chain, checkBusy, locked)
		if err != nil {
			return nil, err
		}
		locked = nil
		switch {
		case run.State == contract.RunRunning:
			return run, nil
		case run.State != contract.RunSucceeded && run.State != contract.RunSkipped, run.ChainNext == nil:
			return nil, nil // blocked or cancelled, or the last: the chain ends here
		}
		id, checkBusy = *run.ChainNext, false
	}
}

// continueChain is called by ReportRun, in a database transaction (the
// report's, or its own after the report's single statement), when the
// agent reported run of a chain succeeded: it dispatches the
// chain's next run, passing over runs LCM skips, handed to that agent
// (it goes back in the answer to the report, offered again after lease
// unless the agent confirms it; see chainLink), and says so (fresh). A
// report repeated after the next run was dispatched (its answer lost on
// the way) finds it running and dispatches nothing again: the run goes
// back in the answer again, whole, and the agent's record of it keeps it
// from running twice. It returns nil when the chain has ended (its
// activity is then to be completed).
func continueChain(tx *gorm.DB, run *TaskRun, lease time.Duration) (next *TaskRun, fresh bool, err error) {
	if !chainGoesOn(run) {
		return nil, false, nil
	}
	// Walk to the chain's first run not yet ended well, as a repeated
	// report must not dispatch anything twice.
	id := *run.ChainNext
	for {
		// Locked, with its node: a cut of the chain (CutChain) waits
		// for this dispatch, or this sees the cut; and what the
		// dispatch reads comes in the same round trip.
		cur, err := lockRunAndNode(tx, id, true)
		if err != nil {
			return nil, false, err
		}
		if cur == nil || cur.ChainHead == nil || *cur.ChainHead != *run.ChainHead {
			return nil, false, nil // relinked since (another activity holds it), or its node is gone
		}
		switch cur.State {
		case contract.RunRunning:
			// Already continued by an earlier report. Offered anew:
			// its claimed_at moves on, so that TakeBackHandBack
			// leaves it to the agent this answer goes to, and a
			// hand-back not yet confirmed stays one, its lease renewed.
			var again []TaskRun
			if err := tx.Raw(`UPDATE task_runs SET
  acked_at = CASE WHEN acked_at = claimed_at THEN now() ELSE acked_at END,
  lease_until = CASE WHEN acked_at IS NULL OR acked_at = claimed_at THEN now() + make_interval(secs => ?) ELSE lease_until END,
  claimed_at = now(), updated_at = now()
WHERE id = ? RETURNING *`, ackLeaseOr(lease).Seconds(), id).Find(&again).Error; err != nil {
				return nil, false, fmt.Errorf("hand run %d back again: %w", id, err)
			}
			if len(again) == 1 {
				next = &again[0]
			}
			return next, false, nil
		case contract.RunPending:
			next, err = dispatchChained(tx, id, run.TaskToken, chainLink{head: *run.ChainHead, handBack: true, lease: lease}, false, cur)
			return next, next != nil, err
		case contract.RunSucceeded, contract.RunSkipped:
			if cur.ChainNext == nil {
				return nil, false, nil
			}
			id = *cur.ChainNext
		default:
			return nil, false, nil
		}
	}
}

// chainGoesOn says whether a run reported succeeded has a next run in its
// chain to go on with.
func chainGoesOn(run *TaskRun) bool {
	return run.ChainHead != nil && run.ChainNext != nil && run.State == contract.RunSucceeded
}

// int64Array writes ids as a Postgres bigint[] literal: a whole list of
// ids in one statement parameter (unnest(?::bigint[])).
func int64Array(ids []int64) string {
	b := make([]byte, 0, len(ids)*8+2)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, '}'))
}

// chainRunsSQL selects columns (of t) of the runs linked to the chain
// headed by ? (given twice). A chain's runs are one node's in one graph:
// they are looked for among the runs of its head's node in its head's
// graph, which the runs' unique index holds together (migration 0031
// dropped the index on chain_head, so that linking a chain's runs is a
// HOT update), or, once the node is deleted (its runs' node_id NULL),
// among the graph's runs.
func chainRunsSQL(columns string) string {
	return `SELECT ` + columns + ` FROM task_runs h JOIN task_runs t
  ON t.transaction_id = h.transaction_id AND t.graph_index = h.graph_index AND t.node_id = h.node_id
WHERE h.id = ? AND t.chain_head = h.id
UNION ALL
SELECT ` + columns + ` FROM task_runs h JOIN task_runs t ON t.transaction_id = h.transaction_id AND t.graph_index = h.graph_index
WHERE h.id = ? AND h.node_id IS NULL AND t.node_id IS NULL AND t.chain_head = h.id`
}

// chainRunIDsSQL is chainRunsSQL of the runs' ids, for the statements
// that lock them in id order.
var chainRunIDsSQL = chainRunsSQL("t.id")

// CutChain ends the chain headed by head after the runs now running: its
// runs not yet dispatched are unlinked, so the API hands out none of
// them, and every other (the one an agent runs, those handed ahead to it,
// those that ended) loses its next, so that the chain goes on from none
// of them, a report sent again included, and the API completes the
// chain's activity when the last running one is reported. A run handed ahead may still start within the ahead window
// (protocol.RunResultResponse.AheadMs); one the agent releases goes back
// to pending, still in the chain (its state is part of the chain's
// outcome), and is not handed out again by it. The workflow calls it when
// its transaction is stopped during a chain.
func (s *Store) CutChain(ctx context.Context, head int64) error {
	// The rows are locked in id order (plan order), as ReportRun locks
	// them, so that the two never deadlock.
	if err := s.DB.WithContext(ctx).Exec(`UPDATE task_runs SET chain_head = CASE WHEN state = ? THEN NULL ELSE chain_head END, chain_next = NULL
WHERE id IN (SELECT id FROM task_runs WHERE id IN (`+chainRunIDsSQL+`) AND chain_head = ? ORDER BY id FOR UPDATE)`,
		contract.RunPending, head, head, head).Error; err != nil {
		return fmt.Errorf("cut the chain of run %d: %w", head, err)
	}
	return nil
}

// EndLostChain ends, in one database transaction, a chain whose activity
// ended without a report: its runs not yet dispatched are unlinked (the
// API hands out none of them); a running run no agent acknowledged is
// taken back to pending, to be handed out again; a running run an agent
// did acknowledge fails with reason (its report, should it still come, is
// refused as late). It answers the states of the chain's runs after that,
// so the workflow and Postgres agree on each, whatever a report racing
// with it did.
func (s *Store) EndLostChain(ctx context.Context, head int64, reason string) (*contract.LostChainEnd, error) {
	out := &contract.LostChainEnd{States: map[int64]string{}}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var rows []struct {
			ID      int64
			State   string
			AckedAt *time.Time
		}
		// Locked in id order (plan order), as ReportRun locks them.
		if err := tx.Raw("SELECT id, state, acked_at FROM task_runs WHERE id IN ("+chainRunIDsSQL+") AND chain_head = ? ORDER BY id FOR UPDATE",
			head, head, head).Scan(&rows).Error; err != nil {
			return fmt.Errorf("lock the chain of run %d: %w", head, err)
		}
		for _, r := range rows {
			st := r.State
			switch {
			case r.State == contract.RunPending:
				if err := tx.Exec("UPDATE task_runs SET chain_head = NULL, chain_next = NULL WHERE id = ?", r.ID).Error; err != nil {
					return fmt.Errorf("cut run %d from its chain: %w", r.ID, err)
				}
			case r.State == contract.RunRunning && r.AckedAt == nil:
				if err := tx.Exec(`UPDATE task_runs SET state = ?, claimed_at = NULL, lease_until = NULL, started_at = NULL,
chain_head = NULL, chain_next = NULL, updated_at = now() WHERE id = ?`, contract.RunPending, r.ID).Error; err != nil {
					return fmt.Errorf("take back run %d: %w", r.ID, err)
				}
				st = contract.RunPending
				out.TakenBack = append(out.TakenBack, r.ID)
			case r.State == contract.RunRunning:
				if err := tx.Exec("UPDATE task_runs SET state = ?, error = ?, finished_at = now(), updated_at = now() WHERE id = ?",
					contract.RunFailed, reason, r.ID).Error; err != nil {
					return fmt.Errorf("fail run %d: %w", r.ID, err)
				}
				st = contract.RunFailed
			}
			out.States[r.ID] = st
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// TakeBackHandBack returns a chain's next run, dispatched by
// ReportRun for the answer to its predecessor's report (next: the run
// as that returned it), to pending, as long as that answer has not gone
// out: its activity turned out cancelled or gone. It takes the run back
// only while it is as that dispatch left it (same attempt and claim, not
// confirmed by an agent): a report sent again, which hands it back again,
// or a poll that offered it again, has moved its claimed_at on. It reports
// whether it took it back. The attempt number stays raised: the next
// dispatch skips one, which only shows in the run's attempt count.
func (s *Store) TakeBackHandBack(ctx context.Context, next *TaskRun) (bool, error) {
	n, err := s.TakeBackHandBacks(ctx, []TaskRun{*next})
	return n == 1, err
}

// TakeBackHandBacks is TakeBackHandBack for runs handed out together (one
// statement's, so one claim: runs handed ahead), in one statement. It
// returns how many it took back.
func (s *Store) TakeBackHandBacks(ctx context.Context, runs []TaskRun) (int64, error) {
	if len(runs) == 0 || runs[0].ClaimedAt == nil {
		return 0, nil
	}
	ids, attempts := make([]int64, len(runs)), make([]int64, len(runs))
	for i, r := range runs {
		ids[i], attempts[i] = r.ID, int64(r.Attempt)
	}
	res := s.DB.WithContext(ctx).Exec(`UPDATE task_runs t
SET state = ?, claimed_at = NULL, acked_at = NULL, lease_until = NULL, started_at = NULL, updated_at = now()
FROM unnest(?::bigint[], ?::int[]) AS x(id, attempt)
WHERE t.id = x.id AND t.attempt = x.attempt AND t.state = ? AND t.claimed_at = ? AND (t.acked_at IS NULL OR t.acked_at = t.claimed_at)`,
		contract.RunPending, int64Array(ids), int64Array(attempts), contract.RunRunning, *runs[0].ClaimedAt)
	if res.Error != nil {
		return 0, fmt.Errorf("take back the dispatch of runs %v: %w", ids, res.Error)
	}
	return res.RowsAffected, nil
}

// EndChain ends the chain headed by head after its last report and
// returns its runs' states (ChainStates), the outcome of its activity.
// Runs still handed out that no agent confirmed (handed ahead, acked_at
// still its claimed_at) go back to pending first, their attempt raised
// (as TakeBackHandBack leaves it): no agent started them, as a chain ends on a report only once
// its agent stopped going on (it reports the runs it ran, the interrupted
// ones included, and starts none after a failure), and a poll must not
// offer them after the run before them failed.
func (s *Store) EndChain(ctx context.Context, head int64) (map[int64]string, error) {
	var rows []TaskRun
	err := s.DB.WithContext(ctx).Raw(`WITH back AS (
  UPDATE task_runs r SET state = ?, claimed_at = NULL, acked_at = NULL, lease_until = NULL,
    started_at = NULL, updated_at = now()
  WHERE r.id IN (`+chainRunIDsSQL+`) AND r.chain_head = ? AND r.state = ? AND r.acked_at = r.claimed_at
  RETURNING r.id, r.state
)
SELECT id, state FROM back
UNION ALL
SELECT c.id, c.state FROM (`+chainRunsSQL("t.id, t.state")+`) c WHERE c.id NOT IN (SELECT id FROM back)`,
		contract.RunPending, head, head, head, contract.RunRunning, head, head).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("end the chain of run %d: %w", head, err)
	}
	out := make(map[int64]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.State
	}
	return out, nil
}

// ChainStates returns the states of the runs of the chain headed by head:
// the outcome of its activity.
func (s *Store) ChainStates(ctx context.Context, head int64) (map[int64]string, error) {
	var rows []TaskRun
	if err := s.DB.WithContext(ctx).Raw(chainRunsSQL("t.id, t.state"), head, head).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("load the states of the chain of run %d: %w", head, err)
	}
	out := make(map[int64]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.State
	}
	return out, nil
}

// DefaultAckLease is how long a run handed to an agent waits for the
// agent's acknowledgement before it is offered again. It must stay well
// below the run heartbeat timeout, which fails a run nobody works on.
const DefaultAckLease = 5 * time.Second

// ClaimWorkOrNextOffer hands the runs dispatched to a node to its agent,
// and when there are none says when to look again (the zero time: at the
// next notification): what an agent's long poll asks at each look, in one
// round trip. A run counts as delivered only once the agent acknowledges
// it (AckRun); until then it is offered again each time lease has passed
// since the last offer, so an answer lost on the way (the server killed
// between claim and response, a dropped connection) only delays the run,
// and no notification announces that time: hence the next offer. The
// agent keeps a durable record of the runs it started, so an offer
// repeated after all never runs a command twice. The lease lives in
// Postgres: a restarted server offers again what its predecessor handed
// out unacknowledged. A run claimed also knows whether any run of its
// transaction has left outputs yet (as a dispatch's lockRunAndNode reads
// it), so that its work item spares the walk up its ancestors for outputs
// when none has.
//
// asAcked takes the runs claimed as acknowledged, as a hand-back is
// (acked_at = claimed_at; see offerableSQL), for an agent that says it
// needs no ack for them (protocol.WorkAheadParam): its first run
// heartbeat or its result confirms each, and one not confirmed when its
// lease has passed is offered again, as one not acknowledged is. The
// agent's record makes that safe too: it never runs a run+attempt twice.
func (s *Store) ClaimWorkOrNextOffer(ctx context.Context, nodeID int64, lease time.Duration, asAcked bool) ([]TaskRun, time.Time, error) {
	lease = ackLeaseOr(lease)
	q := pollStatement()
	args, err := positionalArgs(q.params, map[string]any{"lease": lease.Seconds(), "acked": asAcked, "node": nodeID})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("claim work of node %d: %w", nodeID, err)
	}
	var runs []TaskRun
	var next time.Time
	err = queryGenericPlan(s.DB.WithContext(ctx), q.sql, args, func(rows rowReader) error {
		for rows.Next() {
			var outputsLeft bool
			var nextOffer *time.Time
			run, err := q.scanRun(rows, nil, &outputsLeft, &nextOffer)
			if err != nil {
				return err
			}
			if run.ID == 0 {
				// Nothing claimed: the row of NULLs with the next offer.
				if nextOffer != nil {
					next = *nextOffer
				}
				continue
			}
			run.noOutputsSeen = !outputsLeft
			runs = append(runs, run)
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("claim work of node %d: %w", nodeID, err)
	}
	return runs, next, nil
}

// claimOrNextOfferSQL is claimWorkSQL and nextOfferSQL in one statement
// (@lease, @acked, @node): the runs claimed, each with whether its
// transaction has outputs yet (outputs_left, read from the snapshot before
// the claim, which changes no outputs), or, when none is, one row of NULLs
// whose next_offer is nextOfferSQL's answer, which the claim that changed
// nothing cannot have changed either. The states are literals, so that
// task_runs_node_unfinished_idx serves it from a generic plan
// (TestWorkQueriesUseAnIndex). %[1]s and %[2]s are the runs' columns, of
// the claimed run c and of the row of NULLs n.
var claimOrNextOfferSQL = `WITH claimed AS (` + claimWorkSQL + `)
SELECT %[1]s, ` + outputsLeftSQL("c.transaction_id") + ` AS outputs_left, NULL::timestamptz AS next_offer
FROM claimed c
UNION ALL
SELECT %[2]s, false, (` + nextOfferSQL + `)
FROM (SELECT (NULL::task_runs).*) n
WHERE NOT EXISTS (SELECT 1 FROM claimed)`

// pollStatement is claimOrNextOfferSQL ready to run with a generic plan
// (queryGenericPlan), its runs' columns those TaskRun has fields for.
// Left to choose, Postgres planned it anew at about every second call
// once the runs of 1,000 nodes x 20 tasks were analyzed (1,751 plans in
// 3,610 polls, 6.1 s of planning in a round: more than its execution),
// as it did the report's statement (see queryGenericPlan).
var pollStatement = sync.OnceValue(func() reportQuery {
	columns := taskRunColumnNames()
	q, params := positionalSQL(fmt.Sprintf(claimOrNextOfferSQL,
		prefixed("c.", strings.Join(columns, ",")), prefixed("n.", strings.Join(columns, ","))))
	return reportQuery{sql: q, params: params, columns: columns}
})

// claimWorkSQL claims a node's runs to hand out (@lease seconds, @acked:
// as acknowledged, @node). A run not acknowledged is offered, and one handed
// back with a report's answer, or taken as acknowledged by a poll, that
// its agent has not confirmed (acked_at = claimed_at: see chainLink)
// once its lease has passed; the latter stays marked so, and so is the
// former when the poll takes it as acknowledged.
const claimWorkSQL = `
UPDATE task_runs t SET claimed_at = now(), lease_until = now() + make_interval(secs => @lease), updated_at = now(),
  acked_at = CASE WHEN acked_at IS NOT NULL OR @acked::boolean THEN now() END
WHERE t.node_id = @node AND ` + offerableSQL + `
  AND (t.claimed_at IS NULL OR t.lease_until <= now())
RETURNING *`

// offerableSQL says whether run t, dispatched to its node, may be offered
// to the node's poll: not acknowledged, or taken as acknowledged (acked_at
// = claimed_at) and not confirmed, when it is a poll's (it heads its
// chain, or is in none) or was handed back right after a run of its chain
// that ended well. A run handed ahead behind one that has not (still
// running, failed, or its link taken by a stop) is not: a poll hands runs
// out one by one, and would run it whatever became of the run before it;
// it is released, taken back at the chain's end (EndChain), or failed
// with its lost chain (EndLostChain).
const offerableSQL = `t.state = 'running' AND (t.acked_at IS NULL OR (t.acked_at = t.claimed_at AND (
  t.chain_head IS NULL OR t.chain_head = t.id OR EXISTS (
    SELECT 1 FROM task_runs p
    WHERE p.transaction_id = t.transaction_id AND p.graph_index = t.graph_index AND p.node_id = t.node_id
      AND p.chain_next = t.id AND p.chain_head = t.chain_head AND p.state IN ('succeeded', 'skipped')))))`

// nextOfferSQL finds when a node's next unacknowledged run is offered
// again (@node).
const nextOfferSQL = `
SELECT min(t.lease_until) FROM task_runs t
WHERE t.node_id = @node AND ` + offerableSQL + ` AND t.lease_until IS NOT NULL`

// AckRun records that a node's agent took delivery of attempt of a run (0:
// whatever attempt is current, for an agent that does not say), or
// confirms a run handed back with a report's answer (its first run
// heartbeat; see chainLink): it is not offered again. It returns the run as it is now; a run that is no longer
// running is returned unchanged, and the caller tells the agent. Another
// attempt than the current one is a *ConflictError: that agent holds a
// stale offer.
//
// A run just acknowledged comes back with the columns of ackColumns only
// (what the caller needs to heartbeat its activity): it is read at every
// run's start, and its spec and attributes are JSON to decode.
func (s *Store) AckRun(ctx context.Context, nodeID, runID int64, attempt int) (*TaskRun, error) {
	if err := checkAttempt(attempt, true); err != nil {
		return nil, err
	}
	db := s.DB.WithContext(ctx)
	var runs []TaskRun
	err := db.Raw(`
UPDATE task_runs SET acked_at = clock_timestamp(), lease_until = NULL, updated_at = now()
WHERE id = ? AND node_id = ? AND state = ? AND (acked_at IS NULL OR acked_at = claimed_at) AND (attempt = ? OR ? = 0)
RETURNING `+ackColumns, runID, nodeID, contract.RunRunning, attempt, attempt).Find(&runs).Error
	if err != nil {
		return nil, fmt.Errorf("acknowledge run %d: %w", runID, err)
	}
	if len(runs) == 1 {
		return &runs[0], nil
	}
	run, err := s.AgentRun(ctx, nodeID, runID)
	if err != nil {
		return nil, err
	}
	if attempt != 0 && attempt != run.Attempt {
		return nil, &ConflictError{Reason: fmt.Sprintf("run %d is at attempt %d, not %d", runID, run.Attempt, attempt)}
	}
	return run, nil
}

// ackColumns are the columns of a run AckRun returns when it acknowledges
// it.
const ackColumns = "id, transaction_id, node_id, node_name, task_name, state, attempt, task_token, chain_head, chain_next"

// checkAttempt refuses an attempt number no run can have: attempts count
// from 1 and are stored in 32 bits. zeroOK allows 0 for "not given".
func checkAttempt(attempt int, zeroOK bool) error {
	if (attempt == 0 && zeroOK) || (attempt >= 1 && attempt <= math.MaxInt32) {
		return nil
	}
	return &InputError{Status: http.StatusBadRequest, Field: "attempt",
		Reason: fmt.Sprintf("%d is not an attempt number (1 to %d)", attempt, math.MaxInt32)}
}

// earliestReport bounds the timestamps an agent may report: nothing ran
// before 1970, and a clock that says so is broken, not early.
var earliestReport = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)

// latestReport bounds them from above: the last instant JSON's four-digit
// years can name (Postgres could hold more, nothing else could).
var latestReport = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// checkResult range-checks an agent's report before it reaches Postgres, so
// that a value that does not fit is a 400 naming its field, not a 500.
func checkResult(res protocol.RunResult) error {
	var fe *protocol.FieldError
	if err := res.Validate(); errors.As(err, &fe) {
		return &InputError{Status: http.StatusBadRequest, Field: fe.Field, Reason: fe.Reason}
	}
	if err := checkAttempt(res.Attempt, false); err != nil {
		return err
	}
	if res.ExitCode < math.MinInt32 || res.ExitCode > math.MaxInt32 {
		return &InputError{Status: http.StatusBadRequest, Field: "exit_code",
			Reason: fmt.Sprintf("%d does not fit in 32 bits", res.ExitCode)}
	}
	for _, ts := range []struct {
		field string
		t     time.Time
	}{{"started_at", res.StartedAt}, {"finished_at", res.FinishedAt}} {
		if !ts.t.IsZero() && (ts.t.Before(earliestReport) || ts.t.After(latestReport)) {
			return &InputError{Status: http.StatusBadRequest, Field: ts.field,
				Reason: fmt.Sprintf("%s is out of range (%d to %d)", ts.t.Format(time.RFC3339), earliestReport.Year(), latestReport.Year())}
		}
	}
	// finished_at before started_at is not refused: the node's clock may
	// have been stepped back during the run.
	return nil
}

// AgentRun loads a run on behalf of a node's agent, refusing another node's.
func (s *Store) AgentRun(ctx context.Context, nodeID, runID int64) (*TaskRun, error) {
	return agentRun(s.DB.WithContext(ctx), nodeID, runID)
}

// agentRun is AgentRun on db, a transaction or not.
func agentRun(db *gorm.DB, nodeID, runID int64) (*TaskRun, error) {
	var run TaskRun
	err := db.Take(&run, runID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("run", runID)
	}
	if err != nil {
		return nil, fmt.Errorf("load run %d: %w", runID, err)
	}
	if run.NodeID != nodeID {
		return nil, fmt.Errorf("run %d belongs to another node: %w", runID, ErrForbidden)
	}
	return &run, nil
}

// resultColumns are the columns RecordRunResult reads back with its
// UPDATE, besides those it writes: what the API needs to answer the report
// and go on with the run's chain or activity. A run's spec and attributes
// are JSON to decode, and are not needed there.
const resultColumns = `id, transaction_id, graph_index, graph_type, node_id, node_name, noderole_id, task_name, task_type,
	position, attempt, task_token, chain_head, chain_next, started_at`

// firstChunkCTEs store the first chunk of a run attempt's log (@data,
// @size bytes), and its log's row, for the run the rows of from name
// (FROM from: its id), when the log has no row yet; chunk then holds the
// run's id.
func firstChunkCTEs(from string) string {
	return `log AS (
  INSERT INTO run_logs (run_id, attempt, size, stored, truncated, updated_at)
  SELECT id, @attempt, @size, @size, false, now() FROM ` + from + `
  ON CONFLICT DO NOTHING
  RETURNING run_id
), chunk AS (
  INSERT INTO run_log_chunks (run_id, attempt, pos, data) SELECT run_id, @attempt, 0, @data FROM log
  RETURNING run_id
)`
}

// firstChunkSQL stores the first chunk of a run attempt's log when the
// run is the node's and the attempt is not past the run's: the WITH of
// the statement of firstLogChunk, and of the result's UPDATE when a
// report carries the chunk (a round trip fewer per run).
var firstChunkSQL = "WITH " + firstChunkCTEs("task_runs WHERE id = @run AND node_id = @node AND attempt >= @attempt") + "\n"

// updateResult writes a report's result (what run holds) to the run if
// it is its node's and running at that attempt, and reads resultColumns
// back into run; changed is false when no row was the one. With chunk,
// the first chunk of the run's log goes in the same statement, and
// logStored says whether it was stored (whatever became of the result).
func updateResult(db *gorm.DB, run *TaskRun, nodeID int64, attempt int, chunk []byte) (changed, logStored bool, err error) {
	params, err := resultParams(run, nodeID, attempt, chunk)
	if err != nil {
		return false, false, err
	}
	prefix, stored := "", "false"
	if chunk != nil {
		prefix, stored = firstChunkSQL, "EXISTS (SELECT 1 FROM chunk)"
	}
	var rows []struct {
		TaskRun
		LogStored bool
	}
	err = db.Raw(prefix+`UPDATE task_runs SET `+resultSetSQL+`
WHERE id = @run AND node_id = @node AND attempt = @attempt AND state = @running
RETURNING `+resultColumns+`, `+stored+` AS log_stored`, params).Find(&rows).Error
	if err != nil {
		return false, false, fmt.Errorf("record result of run %d: %w", run.ID, err)
	}
	if len(rows) == 0 {
		// No row came back, so the chunk's fate is unknown: the caller's
		// general path, idempotent by offset, finds out.
		return false, false, nil
	}
	readBack(run, rows[0].TaskRun)
	return true, rows[0].LogStored, nil
}

// resultSetSQL is the SET of a report's UPDATE of its run, and
// resultParams binds it and the WHERE that goes with it (the run, its
// node, its attempt, still running) and the first chunk of its log.
const resultSetSQL = `state = @state, exit_code = @exit, outputs = CAST(@outputs AS jsonb), error = @error,
  stdout_tail = @stdout, stderr_tail = @stderr, finished_at = @finished, updated_at = @updated, attrs_out = CAST(@attrs AS jsonb)`

// resultParams are the parameters of resultSetSQL and its WHERE for run,
// the row resultOf made of a report.
func resultParams(run *TaskRun, nodeID int64, attempt int, chunk []byte) (map[string]any, error) {
	outputs, err := json.Marshal(run.Outputs)
	if err != nil {
		return nil, fmt.Errorf("encode the outputs of run %d: %w", run.ID, err)
	}
	var attrs any // NULL when nothing was handed back
	if run.AttrsOut != nil {
		raw, err := json.Marshal(run.AttrsOut)
		if err != nil {
			return nil, fmt.Errorf("encode the attributes of run %d: %w", run.ID, err)
		}
		attrs = string(raw)
	}
	return map[string]any{"state": run.State, "exit": *run.ExitCode, "outputs": string(outputs), "error": run.Error,
		"stdout": run.StdoutTail, "stderr": run.StderrTail, "finished": *run.FinishedAt, "updated": run.UpdatedAt, "attrs": attrs,
		"run": run.ID, "node": nodeID, "attempt": attempt, "running": contract.RunRunning,
		"size": len(chunk), "data": chunk}, nil
}

// readBack makes run, whose report was just written, the row read back
// (resultColumns) with the values written.
func readBack(run *TaskRun, back TaskRun) {
	back.State, back.ExitCode, back.Outputs, back.Error = run.State, run.ExitCode, run.Outputs, run.Error
	back.StdoutTail, back.StderrTail, back.FinishedAt, back.UpdatedAt, back.AttrsOut = run.StdoutTail, run.StderrTail, run.FinishedAt, run.UpdatedAt, run.AttrsOut
	*run = back
}

// RecordedResult says what RecordRunResult did.
type RecordedResult struct {
	Run *TaskRun
	// Changed is false when the same result had been recorded before.
	Changed bool
}

// RecordRunResult stores an agent's report of a run of its own node. The
// common case is one UPDATE; only a refused or repeated report reads the row
// to say why. The run it returns after that UPDATE holds the values sent
// and the columns of resultColumns; a repeated report's is the whole row.
func (s *Store) RecordRunResult(ctx context.Context, nodeID, runID int64, res protocol.RunResult) (*RecordedResult, error) {
	db := s.DB.WithContext(ctx)
	run, err := s.resultOf(db, nodeID, runID, res)
	if err != nil {
		return nil, err
	}
	return storeResult(db, run, nodeID, res, false)
}

// ReportedRun says what ReportRun did: the result as RecordRunResult
// records it, and the chain's next run as continueChain dispatches it
// (Next, nil when the chain ends here or the run is in none).
type ReportedRun struct {
	RecordedResult
	// Next is the chain's run dispatched to go back in the answer.
	Next *TaskRun
	// Fresh is true when Next was dispatched by this report, false
	// when an earlier report of the same result had (handed back again).
	Fresh bool
}

// ReportRun stores an agent's report of a run of its own node: the end of
// the run's log the report carries (res.Log; see AppendRunLog), its result
// (RecordRunResult) and, when the run succeeded in a chain, the dispatch
// of the chain's next run, handed back to the agent. It is ReportRuns for
// a batch of one that hands no run ahead (older agents report so): the
// common report is one statement, any other one transaction, and a report
// refused writes nothing, its log included.
func (s *Store) ReportRun(ctx context.Context, nodeID, runID int64, res protocol.RunResult, lease time.Duration) (*ReportedRun, error) {
	out, err := s.reportRuns(ctx, nodeID, protocol.RunResults{Results: []protocol.RunReport{{RunID: runID, RunResult: res}}}, lease, 1, "")
	if err != nil {
		return nil, err
	}
	return &out.ReportedRun, nil
}

// resultOf checks a report (checkResult) and makes the row it writes to
// its run (resultRow), redacted of the node's deployment's secrets.
func (s *Store) resultOf(db *gorm.DB, nodeID, runID int64, res protocol.RunResult) (*TaskRun, error) {
	// The agent redacts the secrets it was sent; the server redacts every
	// secret of the node's deployment again, whatever the agent did. A
	// report with no text in it (most succeeded runs) has nothing to
	// redact, and spares the secrets' round trip.
	var red *secrets.Redactor
	if hasText(res) {
		var err error
		if red, err = s.NodeRedactor(db, nodeID); err != nil {
			return nil, err
		}
	}
	return resultRow(runID, res, red)
}

// resultRow checks a report (checkResult) and makes the row it writes to
// its run: the state, exit code, outputs, tails, error and attributes
// handed back, redacted by red (nil: the report holds no text, see
// hasText), with NUL bytes stripped.
func resultRow(runID int64, res protocol.RunResult, red *secrets.Redactor) (*TaskRun, error) {
	if err := checkResult(res); err != nil {
		return nil, err
	}
	if red == nil {
		red = secrets.NewRedactor()
	}
	state := contract.RunSucceeded
	if !res.Succeeded() {
		state = contract.RunFailed
	}
	finished := res.FinishedAt
	if finished.IsZero() {
		finished = Now()
	}
	// Postgres text cannot hold NUL bytes, which command output may.
	outputs := make(map[string]string, len(res.Outputs))
	for k, v := range res.Outputs {
		outputs[red.String(StripNUL(k))] = red.String(StripNUL(v))
	}
	exitCode := res.ExitCode
	run := &TaskRun{
		ID: runID, State: state, ExitCode: &exitCode, Outputs: outputs, Error: red.String(StripNUL(res.Error)),
		StdoutTail: red.String(StripNUL(res.StdoutTail)), StderrTail: red.String(StripNUL(res.StderrTail)), FinishedAt: &finished, UpdatedAt: Now(),
	}
	// attrs_out is written either way: nil (nothing handed back, the
	// attributes unchanged) must not leave an earlier attempt's.
	if res.Attrs != nil {
		var back map[string]any
		if err := json.Unmarshal(res.Attrs, &back); err != nil || back == nil {
			return nil, Invalid("attrs", "must be a JSON object")
		}
		run.AttrsOut, _ = red.Value(stripNULMap(back)).(map[string]any)
	}
	return run, nil
}

// firstChunkOf is the log a report carries when it is the first chunk of
// its run's log, short enough to go in the result's statement; else nil.
func firstChunkOf(res protocol.RunResult) []byte {
	if res.Log != nil && res.Log.Offset == 0 && len(res.Log.Data) > 0 && len(res.Log.Data) <= MaxLogChunkBytes {
		return res.Log.Data
	}
	return nil
}

// storeResult writes run, the row resultOf made of a report, to db (a
// transaction or not). With withLog, it stores the end of the run's log
// the report carries too (res.Log; see AppendRunLog), the first chunk of
// a log in the same statement as the result.
func storeResult(db *gorm.DB, run *TaskRun, nodeID int64, res protocol.RunResult, withLog bool) (*RecordedResult, error) {
	runID := run.ID
	var chunk []byte // the first chunk of the run's log, stored with the result
	if withLog {
		chunk = firstChunkOf(res)
	}
	changed, logStored, err := updateResult(db, run, nodeID, res.Attempt, chunk)
	if err != nil {
		return nil, err
	}
	if withLog && res.Log != nil && !logStored {
		// A log begun already, or a report refused or repeated: the
		// general path, idempotent by offset, stores what is new or
		// says why not, before the result's refusal is looked into.
		if _, err := appendRunLog(db, nodeID, runID, res.Attempt, res.Log.Offset, res.Log.Data); err != nil {
			return nil, err
		}
	}
	if changed {
		return &RecordedResult{Run: run, Changed: true}, nil
	}
	var cur TaskRun
	err = db.Take(&cur, runID).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return nil, NotFound("run", runID)
	case err != nil:
		return nil, fmt.Errorf("load run %d: %w", runID, err)
	case cur.NodeID != nodeID:
		return nil, fmt.Errorf("run %d belongs to another node: %w", runID, ErrForbidden)
	case res.Attempt != cur.Attempt:
		return nil, &ConflictError{Reason: fmt.Sprintf("run %d is at attempt %d, not %d", runID, cur.Attempt, res.Attempt)}
	case cur.State == contract.RunFailed && cur.ExitCode == nil:
		// Failed without a report (timed out, agent lost): this result came
		// too late to count.
		return nil, &ConflictError{Reason: fmt.Sprintf("run %d already failed without a report (%s); this result is not awaited any more", runID, cur.Error)}
	case contract.RunFinal(cur.State):
		return &RecordedResult{Run: &cur}, nil // a repeated report: nothing changes
	default:
		return nil, &ConflictError{Reason: fmt.Sprintf("run %d is %s, not running", runID, cur.State)}
	}
}

// hasText says whether a report holds text a secret could hide in: its
// outputs, output tails, error or attributes.
func hasText(res protocol.RunResult) bool {
	return len(res.Outputs) > 0 || res.StdoutTail != "" || res.StderrTail != "" || res.Error != "" || len(res.Attrs) > 0
}

// FailRun marks a run failed with reason (a timeout, a lost agent, a result
// that came too late) unless it already ended, and blocks the given runs
// that depend on it and have not started.
func (s *Store) FailRun(ctx context.Context, runID int64, reason string, blocked []int64) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		t := Now()
		if runID != 0 {
			err := tx.Model(&TaskRun{}).Where("id = ? AND state IN ?", runID, []string{contract.RunPending, contract.RunRunning}).
				Updates(map[string]any{"state": contract.RunFailed, "error": reason, "finished_at": t, "updated_at": t}).Error
			if err != nil {
				return fmt.Errorf("fail run %d: %w", runID, err)
			}
		}
		return setPending(tx, blocked, contract.RunBlocked, "blocked: a run it depends on did not succeed")
	})
}

// CancelRuns marks runs that have not started as cancelled.
func (s *Store) CancelRuns(ctx context.Context, ids []int64, reason string) error {
	return setPending(s.DB.WithContext(ctx), ids, contract.RunCancelled, reason)
}

func setPending(tx *gorm.DB, ids []int64, state, reason string) error {
	if len(ids) == 0 {
		return nil
	}
	err := tx.Model(&TaskRun{}).Where("id IN ? AND state = ?", ids, contract.RunPending).
		Updates(map[string]any{"state": state, "error": reason, "updated_at": Now()}).Error
	if err != nil {
		return fmt.Errorf("mark %d run(s) %s: %w", len(ids), state, err)
	}
	return nil
}

// AbandonNodeRuns fails what a node's workflow left unfinished when that
// workflow itself ended abnormally, so that nothing stays running forever.
func (s *Store) AbandonNodeRuns(ctx context.Context, id uuid.UUID, gi int, nodeID int64, reason string) error {
	err := s.DB.WithContext(ctx).Model(&TaskRun{}).
		Where("transaction_id = ? AND graph_index = ? AND node_id = ? AND state IN ?", id, gi, nodeID, []string{contract.RunPending, contract.RunRunning}).
		Updates(map[string]any{"state": contract.RunFailed, "error": reason, "finished_at": Now(), "updated_at": Now()}).Error
	if err != nil {
		return fmt.Errorf("abandon runs of node %d in %s: %w", nodeID, id, err)
	}
	return nil
}

// SucceedNoOp marks a run that has nothing to execute as succeeded.
func (s *Store) SucceedNoOp(ctx context.Context, runID int64) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := recordInputs(tx, runID); err != nil {
			return err
		}
		t := Now()
		err := tx.Model(&TaskRun{}).Where("id = ? AND state IN ?", runID, []string{contract.RunPending, contract.RunRunning}).
			Updates(map[string]any{"state": contract.RunSucceeded, "started_at": t, "finished_at": t, "updated_at": t}).Error
		if err != nil {
			return fmt.Errorf("record no-op run %d: %w", runID, err)
		}
		return nil
	})
}

// RejectLateResult turns a result recorded after its activity had already
// timed out into a failure: the workflow moved on without it.
func (s *Store) RejectLateResult(ctx context.Context, runID int64, attempt int, reason string) error {
	err := s.DB.WithContext(ctx).Model(&TaskRun{}).Where("id = ? AND attempt = ?", runID, attempt).
		Updates(map[string]any{"state": contract.RunFailed, "error": reason, "finished_at": Now(), "updated_at": Now()}).Error
	if err != nil {
		return fmt.Errorf("reject late result of run %d: %w", runID, err)
	}
	return nil
}

func StripNUL(s string) string { return strings.ReplaceAll(s, "\x00", "") }

// stripNULMap strips NUL bytes from the keys and strings of a JSON object,
// which jsonb cannot hold either.
func stripNULMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[StripNUL(k)] = stripNULValue(v)
	}
	return out
}

func stripNULValue(v any) any {
	switch x := v.(type) {
	case string:
		return StripNUL(x)
	case map[string]any:
		return stripNULMap(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = stripNULValue(e)
		}
		return out
	}
	return v
}

// RunOutputs are the outputs of one finished run.
type RunOutputs struct {
	TaskName string            `json:"task_name"`
	NodeName string            `json:"node_name"`
	Outputs  map[string]string `json:"outputs"`
}

// RunContext is what a run sees besides its command: the outputs of the
// succeeded runs of its transaction it depends on (a run skipped by LCM
// carrying the outputs of the run it stands for) — its ancestors through
// the plan's edges, the runs of earlier graphs and the earlier runs of its
// own node — in the order they finished, and the addresses of its node's
// peers (the other alive nodes of its deployment, in name order). Outputs
// of runs it does not depend on are not its business, and stay off its
// node.
type RunContext struct {
	Outputs []RunOutputs
	Peers   []string
}

// RunContext loads a run's context, its outputs and its peers.
func (s *Store) RunContext(ctx context.Context, run *TaskRun) (*RunContext, error) {
	return s.RunContextWith(ctx, run, true)
}

// RunContextWith loads a run's context, with its peers only when asked: it
// is read for every run handed to an agent, and the peers (every other
// node of a deployment) are only for the tasks that use them.
func (s *Store) RunContextWith(ctx context.Context, run *TaskRun, peers bool) (*RunContext, error) {
	seen, err := loadSeenOutputs(s.DB.WithContext(ctx), run)
	if err != nil {
		return nil, err
	}
	out := &RunContext{Outputs: seen.all, Peers: []string{}}
	if !peers {
		return out, nil
	}
	var addrs string
	err = s.DB.WithContext(ctx).Raw(`
SELECT coalesce(json_agg(address ORDER BY name), '[]')
FROM nodes WHERE deployment_id = (SELECT deployment_id FROM nodes WHERE id = ?)
  AND id <> ? AND alive AND address <> ''`, run.NodeID, run.NodeID).Scan(&addrs).Error
	if err != nil {
		return nil, fmt.Errorf("load the peers of run %d: %w", run.ID, err)
	}
	if err := json.Unmarshal([]byte(addrs), &out.Peers); err != nil {
		return nil, fmt.Errorf("decode peers of run %d: %w", run.ID, err)
	}
	return out, nil
}

// RejectRebootRun fails a reboot run whose node did not come back in time
// (its agent had reported the reboot under way).
func (s *Store) RejectRebootRun(ctx context.Context, runID int64, reason string) error {
	err := s.DB.WithContext(ctx).Model(&TaskRun{}).Where("id = ? AND state = ?", runID, contract.RunSucceeded).
		Updates(map[string]any{"state": contract.RunFailed, "error": reason, "finished_at": Now(), "updated_at": Now()}).Error
	if err != nil {
		return fmt.Errorf("fail reboot run %d: %w", runID, err)
	}
	return nil
}

// RunDelivery says how far a run got towards its node's agent: its state,
// its attempt, and whether the agent acknowledged that attempt.
func (s *Store) RunDelivery(ctx context.Context, runID int64) (*contract.RunDelivery, error) {
	var row struct {
		State   string
		Attempt int
		AckedAt *time.Time
	}
	res := s.DB.WithContext(ctx).Model(&TaskRun{}).Select("state", "attempt", "acked_at").Where("id = ?", runID).Take(&row)
	if errors.Is(res.Error, gorm.ErrRecordNotFound) {
		return nil, NotFound("run", runID)
	}
	if res.Error != nil {
		return nil, fmt.Errorf("load the delivery of run %d: %w", runID, res.Error)
	}
	return &contract.RunDelivery{State: row.State, Attempt: row.Attempt, Acked: row.AckedAt != nil}, nil
}
