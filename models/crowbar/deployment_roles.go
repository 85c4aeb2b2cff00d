package crowbar

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
)

// DeploymentRoleView is a deployment role as the API shows it: the stored
// defaults with the name and release of their role, since a role id alone
// means nothing to an operator.
type DeploymentRoleView struct {
	DeploymentRole
	Role      string `json:"role"`
	ReleaseID int64  `json:"release_id"`
}

// DeploymentRoles lists a deployment's role defaults, by role name. Only
// roles bound in the deployment at least once (or set with
// SetDeploymentRole) have defaults.
func (s *Store) DeploymentRoles(ctx context.Context, deploymentRef string) ([]DeploymentRoleView, error) {
	out := []DeploymentRoleView{}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, err := models.FindDeployment(tx, deploymentRef)
		if err != nil {
			return err
		}
		var drs []DeploymentRole
		if err := tx.Where("deployment_id = ?", dep.ID).Find(&drs).Error; err != nil {
			return fmt.Errorf("list the role defaults of deployment %s: %w", dep.Name, err)
		}
		out, err = viewDeploymentRoles(tx, drs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeploymentRole loads a deployment's defaults for one role, the role named
// (or numbered) as in BindRole: in the release of the deployment or of its
// nearest parent with one. A role that has no defaults there yet is not
// found.
func (s *Store) DeploymentRole(ctx context.Context, deploymentRef, roleRef string) (*DeploymentRoleView, error) {
	var out *DeploymentRoleView
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, role, err := deploymentAndRole(tx, deploymentRef, roleRef)
		if err != nil {
			return err
		}
		var drs []DeploymentRole
		if err := tx.Where("deployment_id = ? AND role_id = ?", dep.ID, role.ID).Limit(1).Find(&drs).Error; err != nil {
			return fmt.Errorf("load the defaults of role %s in deployment %s: %w", role.Name, dep.Name, err)
		}
		if len(drs) == 0 {
			return fmt.Errorf("deployment %q has no defaults for role %q yet (they are seeded from the role's template when the role is first bound there, or set with PUT): %w",
				dep.Name, role.Name, models.ErrNotFound)
		}
		views, err := viewDeploymentRoles(tx, drs)
		if err != nil {
			return err
		}
		out = &views[0]
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetDeploymentRole creates or replaces a deployment's defaults for a role
// (resolved as in DeploymentRole), and reports whether it created them.
// The defaults seed the user data of noderoles bound from now on; existing
// noderoles keep theirs.
func (s *Store) SetDeploymentRole(ctx context.Context, deploymentRef, roleRef string, data map[string]any) (*DeploymentRoleView, bool, error) {
	if err := models.ValidateMap("data", data); err != nil {
		return nil, false, err
	}
	if data == nil {
		return nil, false, models.Invalid("data", "is required: a JSON object")
	}
	var out *DeploymentRoleView
	var created bool
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		dep, role, err := deploymentAndRole(tx, deploymentRef, roleRef)
		if err != nil {
			return err
		}
		// xmax is 0 on a row this statement inserted and set on one it
		// updated: one round trip that cannot race with a concurrent
		// first binding (which inserts the same row from the template).
		var res []struct {
			ID       int64
			Inserted bool
		}
		if err := tx.Raw(`INSERT INTO deployment_roles (deployment_id, role_id, data, created_at, updated_at)
			VALUES (?, ?, ?, now(), now())
			ON CONFLICT (deployment_id, role_id) DO UPDATE SET data = EXCLUDED.data, updated_at = now()
			RETURNING id, (xmax = 0) AS inserted`, dep.ID, role.ID, jsonb(data)).Scan(&res).Error; err != nil {
			return fmt.Errorf("set the defaults of role %s in deployment %s: %w", role.Name, dep.Name, err)
		}
		if len(res) != 1 {
			return fmt.Errorf("set the defaults of role %s in deployment %s: %d rows came back", role.Name, dep.Name, len(res))
		}
		created = res[0].Inserted
		var dr DeploymentRole
		if err := tx.Take(&dr, res[0].ID).Error; err != nil {
			return fmt.Errorf("load deployment role %d: %w", res[0].ID, err)
		}
		views, err := viewDeploymentRoles(tx, []DeploymentRole{dr})
		if err != nil {
			return err
		}
		out = &views[0]
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, created, nil
}

// deploymentAndRole finds the deployment addressed (not found: 404, it is
// the resource) and resolves the role in its release chain (resolveRole:
// an unknown or ambiguous role is bad input naming "role").
func deploymentAndRole(tx *gorm.DB, deploymentRef, roleRef string) (*models.Deployment, *models.Role, error) {
	if roleRef == "" {
		return nil, nil, models.Invalid("role", "is required")
	}
	dep, err := models.FindDeployment(tx, deploymentRef)
	if err != nil {
		return nil, nil, err
	}
	chain, err := deploymentChain(tx, dep)
	if err != nil {
		return nil, nil, err
	}
	role, err := resolveRole(tx, chain, roleRef)
	if err != nil {
		return nil, nil, err
	}
	return dep, role, nil
}

// viewDeploymentRoles adds their roles' names and releases to deployment
// roles, and sorts them by role name (then id: names repeat across
// releases).
func viewDeploymentRoles(tx *gorm.DB, drs []DeploymentRole) ([]DeploymentRoleView, error) {
	out := make([]DeploymentRoleView, 0, len(drs))
	if len(drs) == 0 {
		return out, nil
	}
	ids := make([]int64, len(drs))
	for i, dr := range drs {
		ids[i] = dr.RoleID
	}
	var roles []models.Role
	if err := tx.Select("id", "name", "release_id").Where("id IN ?", ids).Find(&roles).Error; err != nil {
		return nil, fmt.Errorf("load the roles of deployment roles: %w", err)
	}
	byID := make(map[int64]models.Role, len(roles))
	for _, r := range roles {
		byID[r.ID] = r
	}
	for _, dr := range drs {
		r, ok := byID[dr.RoleID]
		if !ok {
			// The foreign key cascades deletes, so this is a broken
			// database, not bad input.
			return nil, fmt.Errorf("deployment role %d points at role %d, which does not exist", dr.ID, dr.RoleID)
		}
		if dr.Data == nil {
			dr.Data = map[string]any{}
		}
		out = append(out, DeploymentRoleView{DeploymentRole: dr, Role: r.Name, ReleaseID: r.ReleaseID})
	}
	slices.SortFunc(out, func(a, b DeploymentRoleView) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}
