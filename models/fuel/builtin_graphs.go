package fuel

import (
	"context"
	"fmt"

	"go.yaml.in/yaml/v3"
	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models/plan"
)

// BuiltinGraphDoc is one built-in graph as shipped in scenarios/graphs.
type BuiltinGraphDoc struct {
	Type     string         `yaml:"type"`
	Name     string         `yaml:"name"`
	Metadata map[string]any `yaml:"metadata"`
	Tasks    []plan.Task    `yaml:"tasks"`
}

// EnsureBuiltinGraphs loads the built-in graphs (YAML documents), replacing
// the stored ones of the same type, in one database transaction.
func EnsureBuiltinGraphs(ctx context.Context, s *Store, docs ...[]byte) error {
	var graphs []BuiltinGraphDoc
	for i, raw := range docs {
		var doc BuiltinGraphDoc
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return fmt.Errorf("built-in graph %d: %w", i, err)
		}
		if doc.Type == "" {
			return fmt.Errorf("built-in graph %d: no type", i)
		}
		if err := plan.Validate(doc.Tasks); err != nil {
			return fmt.Errorf("built-in graph %s: %w", doc.Type, err)
		}
		for j := range doc.Tasks {
			if doc.Tasks[j].IsMarker() {
				continue
			}
			if _, err := runSpec(&doc.Tasks[j]); err != nil {
				return fmt.Errorf("built-in graph %s: %w", doc.Type, err)
			}
		}
		graphs = append(graphs, doc)
	}
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, doc := range graphs {
			if err := tx.Where("owner_kind = ? AND type = ?", OwnerBuiltin, doc.Type).Delete(&Graph{}).Error; err != nil {
				return fmt.Errorf("replace built-in graph %s: %w", doc.Type, err)
			}
			g := Graph{OwnerKind: OwnerBuiltin, Type: doc.Type, Name: doc.Name, Metadata: doc.Metadata, Tasks: doc.Tasks}
			if err := saveGraph(tx, &g); err != nil {
				return err
			}
		}
		return nil
	})
}
