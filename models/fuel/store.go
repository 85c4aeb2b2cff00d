// Package fuel is the store of Fuel's model: tags (and the nodes holding
// them), task graphs at three levels (release, plugin, deployment) and the
// built-in ones, transactions and their planning into runs (with LCM skips),
// a graph's end on a node (on_success/on_error/on_stop), and scenarios. It
// also saves a release's graphs and tags at import (a release section). It
// meets the other seeds only through the kernel (package models).
package fuel

import "github.com/anneal-dev/anneal/models"

// Store is the Fuel part of anneal's access to Postgres; it shares the
// kernel's connection and helpers.
type Store struct{ *models.Store }

// New returns the Fuel store over the kernel store.
func New(s *models.Store) *Store { return &Store{Store: s} }
