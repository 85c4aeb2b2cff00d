// Package crowbar is the store of Crowbar's model: deployments' snapshots
// (proposed, committed, archived), noderoles (a role bound to a node in a
// snapshot) and their state machine, role events, deployment roles, what a
// noderole's run sees (attributes) and leaves (its wall), the annealer's
// choice of what runs next, and a new node's bootstrap. It meets the other
// seeds only through the kernel (package models).
package crowbar

import "github.com/anneal-dev/anneal/models"

// Store is the Crowbar part of anneal's access to Postgres; it shares the
// kernel's connection and helpers.
type Store struct{ *models.Store }

// New returns the Crowbar store over the kernel store.
func New(s *models.Store) *Store { return &Store{Store: s} }
