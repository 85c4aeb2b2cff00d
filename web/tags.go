package web

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
)

// tagRoutes registers the tag routes: tags of releases and deployments, and
// their assignment to nodes.
func (s *Server) tagRoutes(admin *echo.Group) {
	admin.GET("/tags", s.listTags)
	admin.POST("/tags", s.createTag)
	admin.GET("/tags/:id", s.getTag)
	admin.PATCH("/tags/:id", s.updateTag)
	admin.DELETE("/tags/:id", s.deleteTag)
	admin.GET("/nodes/:id/tags", s.getNodeTags)
	admin.POST("/nodes/:id/tags", s.assignNodeTags)
	admin.DELETE("/nodes/:id/tags", s.unassignNodeTags)
	admin.GET("/deployments/:id/check", s.checkDeployment)
}

// listTags is GET /tags?release=<ref> or ?deployment=<ref> (exactly one): a
// release's tags, or those a deployment sees (its release's and its own).
func (s *Server) listTags(c echo.Context) error {
	tags, err := s.fuel.Tags(c.Request().Context(), fuel.TagScope{
		Release: c.QueryParam("release"), Deployment: c.QueryParam("deployment"),
	})
	if err != nil {
		return err
	}
	// The release's tags, then the deployment's own, each by name.
	return pageSlice(c, tags, func(t fuel.Tag) string {
		rank := 0
		if t.OwnerKind == fuel.OwnerDeployment {
			rank = 1
		}
		return fmt.Sprintf("%d/%s/%020d", rank, t.Name, t.ID)
	})
}

type createTagRequest struct {
	Name       string         `json:"name"`
	Release    idOrName       `json:"release"`
	Deployment idOrName       `json:"deployment"`
	HasPrimary bool           `json:"has_primary"`
	Metadata   map[string]any `json:"metadata"`
}

func (s *Server) createTag(c echo.Context) error {
	var req createTagRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	tag, err := s.fuel.CreateTag(c.Request().Context(), fuel.TagInput{
		Name: req.Name, Release: string(req.Release), Deployment: string(req.Deployment),
		HasPrimary: req.HasPrimary, Metadata: req.Metadata,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, tag)
}

// tagID reads the numeric :id of a tag route.
func tagID(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, &models.InputError{Status: http.StatusBadRequest, Field: "id", Reason: fmt.Sprintf("%q is not a tag id", c.Param("id"))}
	}
	return id, nil
}

func (s *Server) getTag(c echo.Context) error {
	id, err := tagID(c)
	if err != nil {
		return err
	}
	tag, err := s.fuel.Tag(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tag)
}

type updateTagRequest struct {
	HasPrimary *bool           `json:"has_primary"`
	Metadata   *map[string]any `json:"metadata"`
}

func (s *Server) updateTag(c echo.Context) error {
	id, err := tagID(c)
	if err != nil {
		return err
	}
	var req updateTagRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	tag, err := s.fuel.UpdateTag(c.Request().Context(), id, fuel.TagUpdate{HasPrimary: req.HasPrimary, Metadata: req.Metadata})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tag)
}

// deleteTag deletes a user tag and unassigns it from the nodes of its scope;
// the answer names those nodes.
func (s *Server) deleteTag(c echo.Context) error {
	id, err := tagID(c)
	if err != nil {
		return err
	}
	out, err := s.fuel.DeleteTag(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getNodeTags(c echo.Context) error {
	view, err := s.fuel.NodeTags(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, view)
}

type nodeTagsRequest struct {
	Tags []string `json:"tags"`
}

// assignNodeTags is POST /nodes/:id/tags {"tags": [...]}: all or nothing.
func (s *Server) assignNodeTags(c echo.Context) error {
	var req nodeTagsRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	view, err := s.fuel.AssignTags(c.Request().Context(), c.Param("id"), req.Tags)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, view)
}

// unassignNodeTags is DELETE /nodes/:id/tags {"tags": [...]}.
func (s *Server) unassignNodeTags(c echo.Context) error {
	var req nodeTagsRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	view, err := s.fuel.UnassignTags(c.Request().Context(), c.Param("id"), req.Tags)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, view)
}

// checkDeployment is the pre-deployment check: mandatory tags no node holds
// are warnings; deploying stays allowed.
func (s *Server) checkDeployment(c echo.Context) error {
	check, err := s.fuel.CheckDeployment(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, check)
}
