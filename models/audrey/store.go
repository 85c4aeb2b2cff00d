// Package audrey is the store of Aeolus Audrey: deployables imported from
// the seed's XML (or YAML), one node-to-be per instance with its instance
// configuration and its own credential, and the config server's state
// (each instance's config, the parameters it provided). The pure parser
// and reference resolution live in audrey/aeolus. It meets the other
// seeds only through the kernel (package models).
package audrey

import "github.com/anneal-dev/anneal/models"

// Store is the Audrey part of anneal's access to Postgres; it shares the
// kernel's connection and helpers.
type Store struct{ *models.Store }

// New returns the Audrey store over the kernel store.
func New(s *models.Store) *Store { return &Store{Store: s} }
