package web

import "time"

// ExpireEventLease makes the server take its event listener lease again
// at the next subscription, as after a time without clients, for tests.
func (s *Server) ExpireEventLease() {
	s.eventLease.mu.Lock()
	defer s.eventLease.mu.Unlock()
	s.eventLease.until = time.Time{}
}
