package daemon

import (
	"context"
	"log/slog"
	"os/exec"
	"time"

	"github.com/google/uuid"

	"github.com/anneal-dev/anneal/agent/protocol"
)

func (a *agent) currentBootID() string {
	a.bootMu.Lock()
	defer a.bootMu.Unlock()
	return a.bootID
}

// reboot carries out a reboot task: it stores and reports the run as done
// first (the orchestrator then waits for the node to come back with a new
// boot id; the same attempt offered again after the reboot gets that
// result, not a second reboot), then runs RebootCommand, or, on a simulated
// node, takes a new boot id and announces it with a heartbeat at once.
func (a *agent) reboot(ctx context.Context, log *slog.Logger, item protocol.WorkItem, rec *RunRecord) {
	start := time.Now()
	log.Info("rebooting the node", "command", a.cfg.RebootCommand)
	res := protocol.RunResult{Attempt: item.Attempt, StdoutTail: "rebooting\n", StartedAt: start, FinishedAt: time.Now()}
	a.finish(ctx, log, rec, res)
	if a.cfg.RebootCommand != "" {
		if out, err := exec.CommandContext(ctx, "/bin/sh", "-c", a.cfg.RebootCommand).CombinedOutput(); err != nil {
			log.Error("reboot command failed; the orchestrator will time out waiting for the node", "error", err, "output", string(out))
		}
		return
	}
	a.bootMu.Lock()
	a.bootID = uuid.NewString()
	a.bootMu.Unlock()
	if _, err := a.api.Heartbeat(ctx, a.heartbeatRequest()); err != nil {
		log.Warn("first heartbeat after the reboot failed; the next one will tell", "error", err)
	}
	log.Info("node rebooted (simulated)", "boot_id", a.currentBootID())
}
