// Package heat is the store of Heat's software configuration: immutable
// software configs, software deployments that bind one to a node with
// input values (get_attr references to other deployments' outputs), their
// rounds (DEPLOY, REDEPLOY, UNDEPLOY) and the signals of the node's agent.
// It meets the other seeds only through the kernel (package models).
package heat

import "github.com/anneal-dev/anneal/models"

// Store is the Heat part of anneal's access to Postgres; it shares the
// kernel's connection and helpers.
type Store struct{ *models.Store }

// New returns the Heat store over the kernel store.
func New(s *models.Store) *Store { return &Store{Store: s} }
