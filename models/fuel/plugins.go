package fuel

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
)

// Plugin is a named, versioned bundle of graphs. A deployment enables
// plugins; the graphs of every enabled plugin merge between the release's and
// the deployment's own (release → plugins in id order → deployment).
type Plugin struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	Title     string    `json:"title"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DeploymentPlugin enables a plugin for a deployment.
type DeploymentPlugin struct {
	DeploymentID int64
	PluginID     int64
	CreatedAt    time.Time
}

// PluginInput creates a plugin.
type PluginInput struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Title   string `json:"title"`
}

var (
	pluginNameRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	pluginVersionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)
)

const (
	maxPluginName  = 100
	maxPluginTitle = 200
)

// validatePlugin checks a plugin's fields, naming the first bad one.
func validatePlugin(in PluginInput) error {
	switch {
	case in.Name == "":
		return models.Invalid("name", "is required")
	case len(in.Name) > maxPluginName:
		return models.Invalid("name", "must be at most %d characters", maxPluginName)
	case !pluginNameRe.MatchString(in.Name):
		return models.Invalid("name", "%q must start with a letter or digit and contain only letters, digits, '.', '_' and '-'", in.Name)
	}
	if _, err := strconv.ParseInt(in.Name, 10, 64); err == nil {
		return models.Invalid("name", "%q must not be a number (numbers address plugins by id)", in.Name)
	}
	switch {
	case in.Version == "":
		return models.Invalid("version", "is required, e.g. \"1.0.0\"")
	case len(in.Version) > maxPluginName:
		return models.Invalid("version", "must be at most %d characters", maxPluginName)
	case !pluginVersionRe.MatchString(in.Version):
		return models.Invalid("version", "%q must start with a letter or digit and contain only letters, digits, '.', '_', '+' and '-'", in.Version)
	}
	if err := models.ValidLine("title", in.Title, maxPluginTitle); err != nil {
		return err
	}
	return nil
}

// CreatePlugin validates and creates a plugin; a plugin of the same name and
// version is a conflict.
func (s *Store) CreatePlugin(ctx context.Context, in PluginInput) (*Plugin, error) {
	if err := validatePlugin(in); err != nil {
		return nil, err
	}
	p := &Plugin{Name: in.Name, Version: in.Version, Title: in.Title}
	conflict := fmt.Sprintf("plugin %s@%s already exists", in.Name, in.Version)
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var count int64
		if err := tx.Model(&Plugin{}).Where("name = ? AND version = ?", in.Name, in.Version).Count(&count).Error; err != nil {
			return fmt.Errorf("check plugin %s@%s: %w", in.Name, in.Version, err)
		}
		if count > 0 {
			return &models.ConflictError{Reason: conflict}
		}
		if err := tx.Create(p).Error; err != nil {
			return fmt.Errorf("create plugin %s@%s: %w", in.Name, in.Version, models.UniqueViolation(err, conflict))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// findPlugin looks a plugin up by id (all digits), name@version or name (the
// newest of that name).
func findPlugin(tx *gorm.DB, ref string) (*Plugin, error) {
	return models.TakeRef[Plugin](models.ByVersionedRef(tx, ref), "plugin", ref)
}

// Plugin finds a plugin by id, name@version or name (newest).
func (s *Store) Plugin(ctx context.Context, ref string) (*Plugin, error) {
	return findPlugin(s.DB.WithContext(ctx), ref)
}

// Plugins lists every plugin by id.
func (s *Store) Plugins(ctx context.Context) ([]Plugin, error) {
	plugins := []Plugin{}
	if err := s.DB.WithContext(ctx).Order("id").Find(&plugins).Error; err != nil {
		return nil, fmt.Errorf("list plugins: %w", err)
	}
	return plugins, nil
}

// DeploymentPlugins lists the plugins enabled for a deployment, in merge
// order (plugin id).
func (s *Store) DeploymentPlugins(ctx context.Context, depRef string) ([]Plugin, error) {
	db := s.DB.WithContext(ctx)
	dep, err := models.FindDeployment(db, depRef)
	if err != nil {
		return nil, err
	}
	plugins := []Plugin{}
	err = db.Where("id IN (SELECT plugin_id FROM deployment_plugins WHERE deployment_id = ?)", dep.ID).
		Order("id").Find(&plugins).Error
	if err != nil {
		return nil, fmt.Errorf("list plugins of deployment %s: %w", dep.Name, err)
	}
	return plugins, nil
}

// EnablePlugin enables a plugin for a deployment; enabling it again changes
// nothing. It is a conflict when the plugin's graphs would turn a graph of
// the deployment that merges today into one that does not.
func (s *Store) EnablePlugin(ctx context.Context, depRef, pluginRef string) error {
	return s.setPlugin(ctx, depRef, pluginRef, true)
}

// DisablePlugin disables a plugin for a deployment (ErrNotFound when it is
// not enabled). It is a conflict when the deployment's own graphs need the
// plugin's tasks.
func (s *Store) DisablePlugin(ctx context.Context, depRef, pluginRef string) error {
	return s.setPlugin(ctx, depRef, pluginRef, false)
}

func (s *Store) setPlugin(ctx context.Context, depRef, pluginRef string, enable bool) error {
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := lockGraphs(tx); err != nil {
			return err
		}
		dep, err := models.FindDeployment(tx, depRef)
		if err != nil {
			return err
		}
		p, err := findPlugin(tx, pluginRef)
		if err != nil {
			return err
		}
		var types []string
		if err := tx.Model(&Graph{}).Where("owner_kind = ? AND owner_id = ?", OwnerPlugin, p.ID).
			Order("type").Pluck("type", &types).Error; err != nil {
			return fmt.Errorf("list graphs of plugin %s: %w", p.Name, err)
		}
		before, err := mergedProblems(tx, []models.Deployment{*dep}, types)
		if err != nil {
			return err
		}
		if enable {
			if err := tx.Exec("INSERT INTO deployment_plugins (deployment_id, plugin_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
				dep.ID, p.ID, models.Now()).Error; err != nil {
				return fmt.Errorf("enable plugin %s for %s: %w", p.Name, dep.Name, err)
			}
		} else {
			res := tx.Where("deployment_id = ? AND plugin_id = ?", dep.ID, p.ID).Delete(&DeploymentPlugin{})
			if res.Error != nil {
				return fmt.Errorf("disable plugin %s for %s: %w", p.Name, dep.Name, res.Error)
			}
			if res.RowsAffected == 0 {
				return fmt.Errorf("plugin %s@%s is not enabled for deployment %s: %w", p.Name, p.Version, dep.Name, models.ErrNotFound)
			}
		}
		after, err := mergedProblems(tx, []models.Deployment{*dep}, types)
		if err != nil {
			return err
		}
		if pr := newProblem(before, after); pr != nil {
			verb := "disabling"
			if enable {
				verb = "enabling"
			}
			return &models.ConflictError{Reason: fmt.Sprintf("%s plugin %s@%s would break graph %q of deployment %q: %v",
				verb, p.Name, p.Version, pr.graphType, pr.dep.Name, pr.err)}
		}
		return nil
	})
}
