package models

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"gorm.io/gorm"
)

// findDeployment looks a deployment up by id (all digits) or by name.
func FindDeployment(tx *gorm.DB, ref string) (*Deployment, error) {
	return TakeRef[Deployment](ByRef(tx, ref), "deployment", ref)
}

// DeploymentInField finds the deployment an input field names by id or
// name; an unknown one is an InputError naming the field, so the caller
// answers 422 rather than 404 (the request itself was wrong).
func DeploymentInField(tx *gorm.DB, field, ref string) (*Deployment, error) {
	dep, err := FindDeployment(tx, ref)
	if errors.Is(err, ErrNotFound) {
		return nil, Invalid(field, "no deployment named or numbered %q", ref)
	}
	return dep, err
}

// Deployment finds a deployment by id or name.
func (s *Store) Deployment(ctx context.Context, ref string) (*Deployment, error) {
	return FindDeployment(s.DB.WithContext(ctx), ref)
}

// Deployments lists every deployment.
func (s *Store) Deployments(ctx context.Context) ([]Deployment, error) {
	var deps []Deployment
	if err := s.DB.WithContext(ctx).Order("id").Find(&deps).Error; err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	return deps, nil
}

// DeploymentInput creates a deployment.
type DeploymentInput struct {
	Name    string `json:"name"`
	Parent  string `json:"parent"`  // name or id; default system
	Release string `json:"release"` // name, name@version or id
	// Attributes every graph task of the deployment sees (NodeInputs).
	Attributes map[string]any `json:"attributes"`
}

// CreateDeployment validates and creates a deployment.
func (s *Store) CreateDeployment(ctx context.Context, in DeploymentInput) (*Deployment, error) {
	if err := ValidName("name", "deployment", in.Name); err != nil {
		return nil, err
	}
	if err := ValidLine("parent", in.Parent, MaxLineLen); err != nil {
		return nil, err
	}
	if err := ValidLine("release", in.Release, MaxLineLen); err != nil {
		return nil, err
	}
	if _, err := strconv.ParseInt(in.Name, 10, 64); err == nil {
		return nil, Invalid("name", "%q must not be a number (numbers address deployments by id)", in.Name)
	}
	var dep *Deployment
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		parentRef := in.Parent
		if parentRef == "" {
			parentRef = SystemDeployment
		}
		parent, err := DeploymentInField(tx, "parent", parentRef)
		if err != nil {
			return err
		}
		dep = &Deployment{Name: in.Name, ParentID: &parent.ID, Attributes: in.Attributes}
		if dep.Attributes == nil {
			dep.Attributes = map[string]any{}
		}
		if in.Release != "" {
			rel, err := FindRelease(tx, in.Release)
			if errors.Is(err, ErrNotFound) {
				return Invalid("release", "no release %q", in.Release)
			}
			if err != nil {
				return err
			}
			dep.ReleaseID = &rel.ID
		}
		var count int64
		if err := tx.Model(&Deployment{}).Where("name = ?", in.Name).Count(&count).Error; err != nil {
			return fmt.Errorf("check deployment name: %w", err)
		}
		if count > 0 {
			return &ConflictError{Reason: fmt.Sprintf("a deployment named %q already exists", in.Name)}
		}
		if err := tx.Create(dep).Error; err != nil {
			return fmt.Errorf("create deployment %q: %w", in.Name, UniqueViolation(err, fmt.Sprintf("a deployment named %q already exists", in.Name)))
		}
		return nil
	})
	return dep, err
}

// SetDeploymentAttributes replaces a deployment's attributes: the next
// plan of its graphs hands them to every task (NodeInputs), and LCM runs
// again the tasks that see a change.
func (s *Store) SetDeploymentAttributes(ctx context.Context, ref string, attributes map[string]any) (*Deployment, error) {
	if attributes == nil {
		return nil, Invalid("attributes", "is required: a JSON object")
	}
	var dep *Deployment
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if dep, err = FindDeployment(tx, ref); err != nil {
			return err
		}
		dep.Attributes, dep.UpdatedAt = stripNULMap(attributes), Now()
		if err := tx.Model(dep).Select("attributes", "updated_at").Updates(dep).Error; err != nil {
			return fmt.Errorf("set attributes of deployment %s: %w", dep.Name, err)
		}
		return nil
	})
	return dep, err
}
