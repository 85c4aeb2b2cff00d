package fuel

import (
	"fmt"
	"maps"
	"slices"

	"gorm.io/gorm"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// A release's graphs and tags are Fuel's part of it: every import
// validates the graphs' tasks first, then replaces the release's graphs
// and its declared tags (user-created tags are kept).
func init() {
	models.RegisterReleaseSection(models.ReleaseSection{Name: "graphs and tags", Validate: validateReleaseGraphs, Save: saveReleaseGraphsAndTags})
}

func validateReleaseGraphs(spec models.ReleaseSpec) error {
	for _, typ := range slices.Sorted(maps.Keys(spec.Graphs)) {
		g := spec.Graphs[typ]
		field := "graphs." + models.Clip(typ)
		if err := ValidateGraphType(typ); err != nil {
			return models.Invalid(field, "%s", err.(*models.InputError).Reason)
		}
		if err := models.ValidLine(field+".name", g.Name, maxGraphName); err != nil {
			return err
		}
		if err := models.ValidateMap(field+".metadata", g.Metadata); err != nil {
			return err
		}
		if err := ValidateTasks(field+".tasks", g.Tasks); err != nil {
			return err
		}
		if err := plan.Validate(g.Tasks); err != nil {
			ie := tasksError(err)
			ie.Field = field + ".tasks"
			return ie
		}
	}
	return nil
}

func saveReleaseGraphsAndTags(tx *gorm.DB, rel *models.Release, spec models.ReleaseSpec) error {
	if err := tx.Where("owner_kind = ? AND owner_id = ?", OwnerRelease, rel.ID).Delete(&Graph{}).Error; err != nil {
		return fmt.Errorf("replace graphs: %w", err)
	}
	for _, typ := range slices.Sorted(maps.Keys(spec.Graphs)) {
		g := spec.Graphs[typ]
		graph := Graph{OwnerKind: OwnerRelease, OwnerID: rel.ID, Type: typ, Name: g.Name, Metadata: g.Metadata, Tasks: g.Tasks}
		if err := saveGraph(tx, &graph); err != nil {
			return err
		}
	}
	return syncReleaseTags(tx, rel, spec)
}
