package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// The annealer sleeps until it is kicked; the timer is only a safety net
// for a kick that was lost (Temporal unreachable when a commit happened),
// not the way it learns of work.
const annealerFallback = 5 * time.Minute

// annealerRounds bounds one run's history: it continues as new after so
// many rounds (each costs about ten events).
const annealerRounds = 400

// annealerMaxEvents bounds one run's history however many kicks arrive
// between rounds (each is an event): past it, or when Temporal suggests
// it, the annealer continues as new at the top of its next round.
const annealerMaxEvents = 4000

// versionAnnealerBounded adds that bound (version 1); runs started before
// it go on counting rounds only, so that their histories replay.
const versionAnnealerBounded = "annealer-bounded-history"

// Annealer is Crowbar's annealer as one long-lived workflow per
// installation: each round starts every todo noderole that may run now (its
// jig active, its snapshot committed, its node alive and available with
// nothing in transition), one NodeRoleRun workflow each, then sleeps until
// a kick (a commit, a node coming back or made available, a noderole that
// finished or was retried) wakes it. Kicks waiting when a round starts are
// all served by it; a kick that arrives during a round starts another.
func Annealer(ctx workflow.Context, in contract.AnnealerInput) error {
	log := workflow.GetLogger(ctx)
	// Shown in the Web UI, also after a continue-as-new (which drops the
	// summary given at start); it records nothing in the history.
	workflow.SetCurrentDetails(ctx, "The annealer: starts each bound noderole once its parents are active, one at a time per node; woken by commits, finished or retried noderoles and nodes coming back.")
	kicks := workflow.GetSignalChannel(ctx, contract.SignalAnnealerKick)
	// Noderoles in transition whose run is gone (terminated by an
	// operator) are looked for at each start and whenever the fallback
	// timer fires: quiet times, and rare enough to cost nothing.
	recoverNow := true
	bounded := workflow.GetVersion(ctx, versionAnnealerBounded, workflow.DefaultVersion, 1) >= 1
	for round := 0; round < annealerRounds; round++ {
		if info := workflow.GetInfo(ctx); bounded && (info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() > annealerMaxEvents) {
			log.Info("annealer continues as new", "events", info.GetCurrentHistoryLength(), "suggested", info.GetContinueAsNewSuggested())
			break
		}
		if recoverNow {
			var ended []int64
			if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "look for noderoles in transition whose run is gone"), contract.RecoverTransitionsActivity).Get(ctx, &ended); err != nil {
				return fmt.Errorf("check noderoles in transition: %w", err)
			}
			if len(ended) > 0 {
				log.Warn("noderoles in transition had lost their run", "noderoles", ended)
			}
			recoverNow = false
		}
		// The kicks so far are served by this round; one that arrives
		// while it runs may concern a change its query did not see, so it
		// stays in the channel and wakes the next round at once.
		drain(kicks)
		var res contract.AnnealResult
		if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "annealing round %d: start the noderoles that can run", round+1), contract.AnnealActivity).Get(ctx, &res); err != nil {
			return fmt.Errorf("anneal: %w", err)
		}
		if res.More {
			continue
		}
		timerCtx, cancelTimer := workflow.WithCancel(ctx)
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(kicks, func(c workflow.ReceiveChannel, _ bool) {
			var reason string
			c.Receive(ctx, &reason)
		})
		sel.AddFuture(workflow.NewTimer(timerCtx, annealerFallback), func(workflow.Future) { recoverNow = true })
		sel.Select(ctx)
		cancelTimer()
	}
	// Kicks not received here are not lost work: the next run starts with a
	// round.
	return workflow.NewContinueAsNewError(ctx, contract.AnnealerWorkflow, contract.AnnealerInput{})
}

// drain takes every pending kick: one round serves them all.
func drain(c workflow.ReceiveChannel) {
	var reason string
	for c.ReceiveAsync(&reason) {
	}
}

// NodeRoleRun runs a noderole once through its jig: the attributes it sees
// are frozen in its task run; the agent jig hands the run to the node's
// agent (a dead agent is a heartbeat timeout), the local jig runs it in the
// worker, and a role with nothing to run (the noop jig, or no script) hands
// the attributes straight back. Then the noderole goes active or error and
// the annealer is woken.
func NodeRoleRun(ctx workflow.Context, in contract.NodeRoleRunInput) (*contract.NodeRoleRunResult, error) {
	var plan contract.NodeRoleRunPlan
	if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "prepare %s on %s (run %d)", in.Role, in.Node, in.Run), contract.PrepareNodeRoleRunActivity, in).Get(ctx, &plan); err != nil {
		return nil, fmt.Errorf("prepare %s on %s: %w", in.Role, in.Node, err)
	}
	if plan.Skip != "" {
		return &contract.NodeRoleRunResult{Skipped: plan.Skip}, nil
	}
	end := contract.NodeRoleRunEnd{NodeRoleID: in.NodeRoleID, Run: in.Run, OK: true}
	var err error
	switch {
	case !plan.HasScript || plan.Jig == "noop":
		err = workflow.ExecuteActivity(withSummary(stateActivity(ctx), "%s on %s (nothing to run)", in.Role, in.Node), contract.RecordNoOpActivity, plan.RunID).Get(ctx, nil)
	default:
		heartbeat := contract.HeartbeatTimeout(in.HeartbeatTimeoutSec)
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Duration(plan.TimeoutSec)*time.Second + 2*heartbeat,
			HeartbeatTimeout:    heartbeat,
			Summary:             fmt.Sprintf("%s on %s", plan.Role, plan.Node),
			// A failed run is the noderole's error, retried by the
			// operator (POST /noderoles/:id/retry), not here.
			RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		jig := contract.RunTaskOnNodeActivity
		if plan.Jig == contract.RoleJigLocal {
			jig = contract.RunOnOrchestratorActivity
		} else if sshJig(ctx, plan.Jig == contract.RoleJigSSH) {
			jig = contract.RunOverSSHActivity
		}
		input := contract.RunTaskInput{RunID: plan.RunID, Task: plan.Role, Node: plan.Node}
		err = runOnNode(ctx, actx, jig, input)
		if err != nil {
			end.OK = false
			var appErr *temporal.ApplicationError
			if errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeTaskFailed {
				end.Reason = rootMessage(err)
			} else {
				end.Reason = "no result from the node's agent: " + rootMessage(err)
			}
			err = nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("run %s on %s: %w", plan.Role, plan.Node, err)
	}
	var state string
	if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "finish %s on %s (run %d)", in.Role, in.Node, in.Run), contract.FinishNodeRoleRunActivity, end).Get(ctx, &state); err != nil {
		return nil, fmt.Errorf("finish %s on %s: %w", plan.Role, plan.Node, err)
	}
	return &contract.NodeRoleRunResult{State: state, Reason: end.Reason}, nil
}

// NodeBootstrap gives a freshly created node its default roles (Crowbar's
// node creation, steps 3 and 4): the bootstrap roles of an admin node or
// the discovery roles of another, bound in dependency order in the system
// deployment's committed snapshot, which is recommitted; the annealer then
// brings the node up. Its result lists what was bound.
func NodeBootstrap(ctx workflow.Context, in contract.NodeBootstrapInput) (*contract.BootstrapResult, error) {
	var res contract.BootstrapResult
	if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "bind the default roles of %s", in.Node), contract.BootstrapNodeActivity, in).Get(ctx, &res); err != nil {
		return nil, fmt.Errorf("bootstrap node %s: %w", in.Node, err)
	}
	return &res, nil
}
