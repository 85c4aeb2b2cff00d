package models

import (
	"context"
	"fmt"
	"time"
)

// EventLease is what HoldEventListener found when it took or renewed a
// server's lease on the database's change announcements (migration 0028).
type EventLease struct {
	// WasLive says that some server's lease was live already: every change
	// was announced until now. When false, the changes before this lease
	// were not announced, and a server's clients must read the state again.
	WasLive bool
	// Writers are set when WasLive is false: the ids of the transactions
	// of this database that had written when the lease began. They may
	// have fired their triggers without seeing it, and so announce nothing,
	// yet commit later. AwaitTransactions returns once they have ended.
	Writers []string
}

// HoldEventListener takes or renews the lease of server id (any string of
// its own, such as a random one per process) on the database's change
// announcements, until ttl from now: the event triggers announce nothing
// while no server holds a live lease. Leases of servers gone for a day
// are removed on the way.
func (s *Store) HoldEventListener(ctx context.Context, id string, ttl time.Duration) (EventLease, error) {
	var lease EventLease
	// One statement: the CTEs share its snapshot, so "was live" is read
	// before this lease counts.
	err := s.DB.WithContext(ctx).Raw(`WITH gone AS (
  DELETE FROM event_listeners WHERE until < now() - interval '1 day'
), up AS (
  INSERT INTO event_listeners (id, until) VALUES (?, now() + make_interval(secs => ?))
  ON CONFLICT (id) DO UPDATE SET until = EXCLUDED.until
)
SELECT EXISTS (SELECT 1 FROM event_listeners WHERE until > now()) AS was_live`, id, ttl.Seconds()).Row().Scan(&lease.WasLive)
	if err != nil {
		return EventLease{}, fmt.Errorf("hold the event listener lease of %s: %w", id, err)
	}
	if lease.WasLive {
		return lease, nil
	}
	// Read after the lease committed. A trigger reads the lease with a
	// snapshot taken after its statement's first write, which gave its
	// transaction an id: a transaction that fired one unannounced has an
	// id now, or has ended. (Sessions of other roles show no id without
	// pg_read_all_stats; anneal uses one role.)
	err = s.DB.WithContext(ctx).Raw(`SELECT backend_xid::text FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&lease.Writers).Error
	if err != nil {
		return EventLease{}, fmt.Errorf("read the transactions running as the event listener lease of %s began: %w", id, err)
	}
	return lease, nil
}

// AwaitTransactions returns once none of the transactions writers (an
// EventLease's Writers) is running, polling every poll, or when ctx ends
// (with its error).
func (s *Store) AwaitTransactions(ctx context.Context, writers []string, poll time.Duration) error {
	for len(writers) > 0 {
		var running bool
		err := s.DB.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid::text IN ?)`, writers).Row().Scan(&running)
		if err != nil {
			return fmt.Errorf("wait for the transactions %s: %w", writers, err)
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
	return nil
}
