package main

import (
	"context"
	"fmt"
	"log/slog"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/anneal-dev/anneal/workflows/contract"
)

// activityIdentities reads the histories of a transaction's workflows (the
// transaction, its graph and its nodes' workflows) and counts the activity
// tasks started per worker identity (ActivityTaskStarted's identity: the
// worker process that took the task).
func (h *chaosHarness) activityIdentities(ctx context.Context, tx string) (map[string]int, error) {
	tc, err := client.DialContext(ctx, client.Options{HostPort: h.tmp.Address, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s: %w", h.tmp.Address, err)
	}
	defer tc.Close()
	ids := []string{contract.TransactionWorkflowID(tx), contract.GraphWorkflowID(tx, 0)}
	for _, name := range h.names {
		ids = append(ids, contract.NodeWorkflowID(tx, name))
	}
	out := map[string]int{}
	for _, id := range ids {
		it := tc.GetWorkflowHistory(ctx, id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				return nil, fmt.Errorf("history of %s: %w", id, err)
			}
			if a := ev.GetActivityTaskStartedEventAttributes(); a != nil {
				out[a.GetIdentity()]++
			}
		}
	}
	return out, nil
}
