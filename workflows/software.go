package workflows

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// While a deployment's input references another deployment that is not
// COMPLETE yet, the workflow polls Postgres (an activity) on a timer that
// backs off from the first to the maximum interval, within its timeout.
const (
	SoftwareRefPollFirst = 2 * time.Second
	SoftwareRefPollMax   = 30 * time.Second
)

// EvaluateSoftwareSignal decides a round from the agent's signal: a
// non-zero deploy_status_code fails it, and so does any non-empty value for
// an output flagged error_output; otherwise it is COMPLETE.
func EvaluateSoftwareSignal(errorOutputs []string, sig contract.SoftwareSignalSummary) (status, reason string) {
	if sig.StatusCode != 0 {
		reason = fmt.Sprintf("deploy_status_code %d", sig.StatusCode)
		if sig.StatusReason != "" {
			reason += ": " + sig.StatusReason
		}
		return contract.SoftwareFailed, reason
	}
	var bad []string
	for _, name := range errorOutputs {
		if v, ok := sig.Present[name]; ok {
			if v == contract.Redacted {
				// The value is not in the summary: name the output.
				bad = append(bad, name)
				continue
			}
			bad = append(bad, fmt.Sprintf("%s=%q", name, v)) // an older summary, with an excerpt
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return contract.SoftwareFailed, "error output signalled: " + strings.Join(bad, ", ")
	}
	return contract.SoftwareComplete, ""
}

// SoftwareDeployment runs one round of a software deployment: it waits for
// the deployments its inputs reference (get_attr) to complete, hands the
// deployment to the node's agent (IN_PROGRESS) and waits for the agent's
// signal; the round's timeout (timeout_sec, counted from the start of the
// run) fails it. A signal for another round is ignored, so repeated
// signals change nothing.
func SoftwareDeployment(ctx workflow.Context, in contract.SoftwareInput) (*contract.SoftwareResult, error) {
	log := workflow.GetLogger(ctx)
	round := contract.SoftwareRound{DeploymentID: in.DeploymentID, Round: in.Round}
	start := workflow.GetInfo(ctx).WorkflowStartTime
	if start.IsZero() {
		start = workflow.Now(ctx)
	}
	signals := workflow.GetSignalChannel(ctx, contract.SignalSoftware)

	var p contract.SoftwarePrepared
	poll := SoftwareRefPollFirst
	for {
		if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "prepare round %d of software deployment %d", in.Round, in.DeploymentID), contract.PrepareSoftwareRoundActivity, round).Get(ctx, &p); err != nil {
			return nil, fmt.Errorf("start round %d of software deployment %d: %w", in.Round, in.DeploymentID, err)
		}
		switch {
		case p.Stale:
			log.Info("software deployment moved on to another round", "software_deployment", in.DeploymentID, "round", in.Round)
			return &contract.SoftwareResult{Status: "STALE", Reason: "the deployment moved on to another round or was deleted"}, nil
		case p.Final:
			return &contract.SoftwareResult{Status: p.Status}, nil
		case p.Failed != "":
			return finishSoftware(ctx, round, contract.SoftwareFailed, p.Failed)
		}
		if p.Ready {
			break
		}
		remaining := start.Add(time.Duration(p.TimeoutSec) * time.Second).Sub(workflow.Now(ctx))
		if remaining <= 0 {
			return finishSoftware(ctx, round, contract.SoftwareFailed, fmt.Sprintf(
				"timed out after %ds waiting for software deployment(s) %s to complete (get_attr)", p.TimeoutSec, softwareIDs(p.WaitingFor)))
		}
		if err := workflow.Sleep(ctx, min(poll, remaining)); err != nil {
			return cancelledSoftware(ctx, round)
		}
		poll = min(poll*2, SoftwareRefPollMax)
	}

	remaining := start.Add(time.Duration(p.TimeoutSec) * time.Second).Sub(workflow.Now(ctx))
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	timer := workflow.NewTimer(timerCtx, max(remaining, time.Millisecond))
	var got *contract.SoftwareSignalSummary
	timedOut := false
	for got == nil && !timedOut && ctx.Err() == nil {
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(signals, func(c workflow.ReceiveChannel, _ bool) {
			var sig contract.SoftwareSignalSummary
			c.Receive(ctx, &sig)
			if sig.Round == in.Round {
				got = &sig
			} else {
				log.Warn("ignoring a signal for another round", "software_deployment", in.DeploymentID, "round", in.Round, "signal_round", sig.Round)
			}
		})
		sel.AddFuture(timer, func(f workflow.Future) {
			if f.Get(ctx, nil) == nil {
				timedOut = true
			}
		})
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {})
		sel.Select(ctx)
	}
	cancelTimer()
	switch {
	case got != nil:
		status, reason := EvaluateSoftwareSignal(p.ErrorOutputs, *got)
		if in.Delete && status == contract.SoftwareComplete {
			return removeSoftware(ctx, contract.SoftwareRemoval{SoftwareRound: round,
				Reason: fmt.Sprintf("UNDEPLOY signalled by the agent of node %s", p.Node)})
		}
		if in.Delete {
			reason = "UNDEPLOY failed, the deployment is kept (DELETE again to retry, or with ?force=true to remove it without UNDEPLOY): " + reason
		}
		return finishSoftware(ctx, round, status, reason)
	case timedOut:
		reason := fmt.Sprintf("timed out after %ds: the agent of node %s did not signal round %d", p.TimeoutSec, p.Node, in.Round)
		if in.Delete {
			// The node is most likely gone with its server: a delete
			// must not wait forever for an agent that will never answer.
			return removeSoftware(ctx, contract.SoftwareRemoval{SoftwareRound: round, Reason: reason, TimedOut: true})
		}
		return finishSoftware(ctx, round, contract.SoftwareFailed, reason)
	default:
		return cancelledSoftware(ctx, round)
	}
}

// removeSoftware ends the UNDEPLOY round of a deleted deployment by
// removing it. Only rounds started by a delete (SoftwareInput.Delete, which
// executions recorded before it existed never carry) come here; the version
// marker keeps the change visible in their histories.
func removeSoftware(ctx workflow.Context, rm contract.SoftwareRemoval) (*contract.SoftwareResult, error) {
	if workflow.GetVersion(ctx, "software-delete-removes", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return finishSoftware(ctx, rm.SoftwareRound, contract.SoftwareComplete, rm.Reason)
	}
	if err := workflow.ExecuteActivity(stateActivity(ctx), contract.RemoveSoftwareActivity, rm).Get(ctx, nil); err != nil {
		return nil, fmt.Errorf("remove software deployment %d after its UNDEPLOY round %d: %w", rm.DeploymentID, rm.Round, err)
	}
	return &contract.SoftwareResult{Status: "DELETED", Reason: rm.Reason}, nil
}

func finishSoftware(ctx workflow.Context, round contract.SoftwareRound, status, reason string) (*contract.SoftwareResult, error) {
	if err := workflow.ExecuteActivity(withSummary(stateActivity(ctx), "record the end of round %d of software deployment %d: %s", round.Round, round.DeploymentID, status), contract.FinishSoftwareRoundActivity, contract.SoftwareEnd{
		SoftwareRound: round, Status: status, Reason: reason,
	}).Get(ctx, nil); err != nil {
		return nil, fmt.Errorf("record the end of round %d of software deployment %d: %w", round.Round, round.DeploymentID, err)
	}
	return &contract.SoftwareResult{Status: status, Reason: reason}, nil
}

// cancelledSoftware records a cancelled round (temporal workflow cancel) as
// FAILED, so that Postgres tells the truth.
func cancelledSoftware(ctx workflow.Context, round contract.SoftwareRound) (*contract.SoftwareResult, error) {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if _, err := finishSoftware(dctx, round, contract.SoftwareFailed, "cancelled"); err != nil {
		return nil, err
	}
	return nil, temporal.NewCanceledError("software deployment cancelled")
}

func softwareIDs(list []int64) string {
	s := make([]string, len(list))
	for i, id := range list {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ", ")
}
