package models

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// Roles lists roles ordered by release id, then name: all of them, or with
// release (an id, a name@version or a name, the newest of that name) only
// that release's. An unknown release is bad input naming "release": it
// filters the list, it is not the resource addressed.
func (s *Store) Roles(ctx context.Context, release string) ([]Role, error) {
	db := s.DB.WithContext(ctx)
	q := db.Order("release_id, name")
	if release != "" {
		rel, err := FindRelease(db, release)
		if errors.Is(err, ErrNotFound) {
			return nil, Invalid("release", "no release %q (give an id, a name@version or a name)", release)
		}
		if err != nil {
			return nil, err
		}
		q = q.Where("release_id = ?", rel.ID)
	}
	roles := []Role{}
	if err := q.Find(&roles).Error; err != nil {
		return nil, fmt.Errorf("list roles: %w", err)
	}
	return roles, nil
}

// Role loads one role by id. Role names repeat across releases, so only
// the id addresses a role on its own.
func (s *Store) Role(ctx context.Context, id int64) (*Role, error) {
	var role Role
	err := s.DB.WithContext(ctx).Take(&role, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, NotFound("role", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load role %d: %w", id, err)
	}
	return &role, nil
}

// Role flags the framework knows.
const (
	FlagDiscovery = "discovery"
	FlagBootstrap = "bootstrap"
	FlagImplicit  = "implicit"
	FlagLibrary   = "library"
)

// RoleFlags are the flags a role may carry. library is accepted and, as in
// Crowbar, means nothing yet.
var RoleFlags = []string{FlagDiscovery, FlagBootstrap, FlagImplicit, FlagLibrary}
