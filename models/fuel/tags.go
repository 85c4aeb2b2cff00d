package fuel

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// Tag is a tag defined by a release (seen by every deployment of it) or by a
// deployment (seen only there), as in Fuel's role decomposition. Nodes hold
// tags in Node.Tags; a tag must be visible in a node's deployment to be
// assigned to it. A tag a role of the release produces is read only: it
// changes only with the release. With HasPrimary, one node of each
// deployment holding the tag is its primary and also gets "primary-<name>"
// when graphs are planned.
type Tag struct {
	ID int64 `json:"id"`
	// OwnerKind is OwnerRelease or OwnerDeployment.
	OwnerKind string `json:"owner_kind"`
	// OwnerID is the id of the release or deployment.
	OwnerID int64  `json:"owner_id"`
	Name    string `json:"name"`
	// ReadOnly marks a tag stuck to a role (produced by it): it can be
	// neither modified nor deleted through the API.
	ReadOnly   bool `json:"read_only"`
	HasPrimary bool `json:"has_primary"`
	// Declared marks a tag the release declares (in tags_metadata or a
	// role's tags), as opposed to one a user created: a re-import replaces
	// declared tags and keeps the users' ones.
	Declared bool           `json:"declared"`
	Metadata map[string]any `json:"metadata" gorm:"serializer:json"`
	// Roles are the roles of the release that produce the tag (computed).
	Roles     []string  `json:"roles,omitempty" gorm:"-"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PrimaryTag records which node of a deployment is the primary of a
// has_primary tag; planning keeps it while that node holds the tag.
type PrimaryTag struct {
	DeploymentID int64  `json:"deployment_id" gorm:"primaryKey;autoIncrement:false"`
	Tag          string `json:"tag" gorm:"primaryKey"`
	NodeID       int64  `json:"node_id"`
}

// PrimaryPrefix starts the planning tag of a primary node ("primary-mysql");
// user tags may not start with it.
const PrimaryPrefix = "primary-"

// ValidateTagName checks the name of a tag a user creates: non-empty, at most
// 255 characters, no whitespace, no ':' (instance tags "name:N" exist only on
// nodes), not a selector ("*", "/regex/") and not starting with "primary-"
// (computed at planning).
func ValidateTagName(name string) error {
	switch {
	case name == "":
		return models.Invalid("name", "is required")
	case strings.IndexFunc(name, unicode.IsSpace) >= 0:
		return models.Invalid("name", "%q must not contain whitespace", name)
	case strings.Contains(name, ":"):
		return models.Invalid("name", "%q must not contain ':': instance tags (name:N) are assigned to nodes, not created", name)
	case strings.HasPrefix(name, PrimaryPrefix):
		return models.Invalid("name", "%q must not start with %q: primary tags are computed at planning", name, PrimaryPrefix)
	case name == plan.Any || strings.HasPrefix(name, "/"):
		return models.Invalid("name", "%q reads as a task selector (\"*\" or \"/regex/\")", name)
	}
	return models.ValidName("name", "tag", name)
}

// tagMetadataMap is a tags_metadata entry as a tag's metadata: every field
// but has_primary, which is a column of its own.
func tagMetadataMap(md models.TagMetadata) map[string]any {
	out := map[string]any{}
	if b, err := json.Marshal(md); err == nil {
		_ = json.Unmarshal(b, &out)
	}
	delete(out, "has_primary")
	return out
}

// syncReleaseTags makes a release's tags what spec declares, inside the
// import's transaction: every tag of tags_metadata and every tag a role
// produces (read only); declared tags the release no longer declares go,
// tags users created stay.
func syncReleaseTags(tx *gorm.DB, rel *models.Release, spec models.ReleaseSpec) error {
	want := map[string]*Tag{}
	declare := func(name string) *Tag {
		t, ok := want[name]
		if !ok {
			t = &Tag{OwnerKind: OwnerRelease, OwnerID: rel.ID, Name: name, Declared: true, Metadata: map[string]any{}}
			want[name] = t
		}
		return t
	}
	for _, name := range sortedKeys(spec.RolesMetadata) {
		for _, tag := range spec.RolesMetadata[name].Tags {
			if tag != "" {
				declare(tag).ReadOnly = true
			}
		}
	}
	for _, name := range sortedKeys(spec.TagsMetadata) {
		if name == "" {
			continue
		}
		md := spec.TagsMetadata[name]
		t := declare(name)
		t.HasPrimary = md.HasPrimary
		t.Metadata = tagMetadataMap(md)
	}
	var existing []Tag
	if err := tx.Where("owner_kind = ? AND owner_id = ?", OwnerRelease, rel.ID).Find(&existing).Error; err != nil {
		return fmt.Errorf("load tags of release %s: %w", rel.Name, err)
	}
	var stale []int64
	for _, ex := range existing {
		t, ok := want[ex.Name]
		if !ok {
			if ex.Declared || ex.ReadOnly {
				stale = append(stale, ex.ID)
			}
			continue
		}
		t.ID, t.CreatedAt = ex.ID, ex.CreatedAt
	}
	if len(stale) > 0 {
		if err := tx.Where("id IN ?", stale).Delete(&Tag{}).Error; err != nil {
			return fmt.Errorf("drop tags release %s no longer declares: %w", rel.Name, err)
		}
	}
	for _, name := range sortedKeys(want) {
		t := want[name]
		t.UpdatedAt = models.Now()
		if t.ID == 0 {
			t.CreatedAt = t.UpdatedAt
			if err := tx.Create(t).Error; err != nil {
				return fmt.Errorf("create tag %s of release %s: %w", name, rel.Name, err)
			}
			continue
		}
		if err := tx.Select("read_only", "has_primary", "declared", "metadata", "updated_at").Save(t).Error; err != nil {
			return fmt.Errorf("update tag %s of release %s: %w", name, rel.Name, err)
		}
	}
	return nil
}

// TagScope selects the tags of one release or one deployment (by name or
// id; a release also as name@version). A deployment sees its release's tags
// and its own.
type TagScope struct {
	Release    string
	Deployment string
}

// Tags lists the tags of a release, or those a deployment sees, by name.
func (s *Store) Tags(ctx context.Context, scope TagScope) ([]Tag, error) {
	if err := oneTagOwner(scope.Release, scope.Deployment); err != nil {
		return nil, err
	}
	db := s.DB.WithContext(ctx)
	var tags []Tag
	if scope.Release != "" {
		rel, err := models.FindRelease(db, scope.Release)
		if err != nil {
			return nil, err
		}
		if err := db.Where("owner_kind = ? AND owner_id = ?", OwnerRelease, rel.ID).Order("name").Find(&tags).Error; err != nil {
			return nil, fmt.Errorf("list tags of release %s: %w", scope.Release, err)
		}
	} else {
		dep, err := models.FindDeployment(db, scope.Deployment)
		if err != nil {
			return nil, err
		}
		if tags, err = deploymentTags(db, dep); err != nil {
			return nil, err
		}
	}
	if err := fillTagRoles(db, tags); err != nil {
		return nil, err
	}
	return tags, nil
}

// oneTagOwner requires exactly one of a release and a deployment.
func oneTagOwner(release, deployment string) error {
	switch {
	case release != "" && deployment != "":
		return models.Invalid("deployment", "give either a release or a deployment, not both")
	case release == "" && deployment == "":
		return models.Invalid("release", "is required: give a release or a deployment (name or id)")
	}
	return nil
}

// deploymentTags are the tags a deployment sees: its release's, then its
// own, each by name.
func deploymentTags(tx *gorm.DB, dep *models.Deployment) ([]Tag, error) {
	q := tx.Where("owner_kind = ? AND owner_id = ?", OwnerDeployment, dep.ID)
	if dep.ReleaseID != nil {
		q = tx.Where("(owner_kind = ? AND owner_id = ?) OR (owner_kind = ? AND owner_id = ?)",
			OwnerRelease, *dep.ReleaseID, OwnerDeployment, dep.ID)
	}
	var tags []Tag
	// 'release' sorts after 'deployment': descending puts the release first.
	if err := q.Order("owner_kind DESC, name").Find(&tags).Error; err != nil {
		return nil, fmt.Errorf("list tags of deployment %s: %w", dep.Name, err)
	}
	return tags, nil
}

// fillTagRoles sets Roles of the release tags: the roles producing them.
func fillTagRoles(tx *gorm.DB, tags []Tag) error {
	var releaseIDs []int64
	for _, t := range tags {
		if t.OwnerKind == OwnerRelease && !slices.Contains(releaseIDs, t.OwnerID) {
			releaseIDs = append(releaseIDs, t.OwnerID)
		}
	}
	if len(releaseIDs) == 0 {
		return nil
	}
	var roles []models.Role
	if err := tx.Select("release_id", "name", "tags").Where("release_id IN ?", releaseIDs).Order("name").Find(&roles).Error; err != nil {
		return fmt.Errorf("load roles for tags: %w", err)
	}
	for i := range tags {
		if tags[i].OwnerKind != OwnerRelease {
			continue
		}
		for _, r := range roles {
			if r.ReleaseID == tags[i].OwnerID && slices.Contains(r.Tags, tags[i].Name) {
				tags[i].Roles = append(tags[i].Roles, r.Name)
			}
		}
	}
	return nil
}

func loadTag(tx *gorm.DB, id int64, lock bool) (*Tag, error) {
	var tag Tag
	q := tx
	if lock {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	err := q.Take(&tag, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, models.NotFound("tag", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load tag %d: %w", id, err)
	}
	one := []Tag{tag}
	if err := fillTagRoles(tx, one); err != nil {
		return nil, err
	}
	return &one[0], nil
}

// Tag loads one tag by id.
func (s *Store) Tag(ctx context.Context, id int64) (*Tag, error) {
	return loadTag(s.DB.WithContext(ctx), id, false)
}

// TagInput creates a tag of a release or of a deployment (exactly one).
type TagInput struct {
	Name       string
	Release    string // name, name@version or id
	Deployment string // name or id
	HasPrimary bool
	Metadata   map[string]any
}

// CreateTag validates and creates a user tag. A name already visible in the
// scope (in the same owner, a deployment's release or a deployment of the
// release) is a conflict.
func (s *Store) CreateTag(ctx context.Context, in TagInput) (*Tag, error) {
	if err := ValidateTagName(in.Name); err != nil {
		return nil, err
	}
	if err := models.ValidLine("release", in.Release, models.MaxLineLen); err != nil {
		return nil, err
	}
	if err := models.ValidLine("deployment", in.Deployment, models.MaxLineLen); err != nil {
		return nil, err
	}
	if err := models.ValidateMap("metadata", in.Metadata); err != nil {
		return nil, err
	}
	if err := oneTagOwner(in.Release, in.Deployment); err != nil {
		return nil, err
	}
	tag := &Tag{Name: in.Name, HasPrimary: in.HasPrimary, Metadata: in.Metadata}
	if tag.Metadata == nil {
		tag.Metadata = map[string]any{}
	}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var clash []Tag
		if in.Release != "" {
			rel, err := models.FindRelease(tx, in.Release)
			if errors.Is(err, models.ErrNotFound) {
				return models.Invalid("release", "no release %q", in.Release)
			}
			if err != nil {
				return err
			}
			tag.OwnerKind, tag.OwnerID = OwnerRelease, rel.ID
			var depIDs []int64
			if err := tx.Model(&models.Deployment{}).Where("release_id = ?", rel.ID).Pluck("id", &depIDs).Error; err != nil {
				return fmt.Errorf("list deployments of release %s: %w", rel.Name, err)
			}
			q := tx.Where("name = ? AND ((owner_kind = ? AND owner_id = ?) OR (owner_kind = ? AND owner_id IN ?))",
				in.Name, OwnerRelease, rel.ID, OwnerDeployment, append(depIDs, 0))
			if err := q.Find(&clash).Error; err != nil {
				return fmt.Errorf("check tag name: %w", err)
			}
		} else {
			dep, err := models.DeploymentInField(tx, "deployment", in.Deployment)
			if err != nil {
				return err
			}
			tag.OwnerKind, tag.OwnerID = OwnerDeployment, dep.ID
			visible, err := deploymentTags(tx, dep)
			if err != nil {
				return err
			}
			for _, t := range visible {
				if t.Name == in.Name {
					clash = append(clash, t)
				}
			}
		}
		if len(clash) > 0 {
			return &models.ConflictError{Reason: fmt.Sprintf("tag %q already exists in %s", in.Name, tagOwnerName(tx, clash[0]))}
		}
		if err := tx.Create(tag).Error; err != nil {
			return fmt.Errorf("create tag %q: %w", in.Name, models.UniqueViolation(err, fmt.Sprintf("tag %q already exists", in.Name)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tag, nil
}

// tagOwnerName names a tag's owner for messages: "release openstack@1.0" or
// "deployment prod".
func tagOwnerName(tx *gorm.DB, t Tag) string {
	if t.OwnerKind == OwnerRelease {
		var rel models.Release
		if tx.Select("name", "version").Take(&rel, t.OwnerID).Error == nil {
			return "release " + releaseLabel(&rel)
		}
		return fmt.Sprintf("release %d", t.OwnerID)
	}
	var dep models.Deployment
	if tx.Select("name").Take(&dep, t.OwnerID).Error == nil {
		return "deployment " + dep.Name
	}
	return fmt.Sprintf("deployment %d", t.OwnerID)
}

func releaseLabel(rel *models.Release) string {
	if rel.Version == "" {
		return rel.Name
	}
	return rel.Name + "@" + rel.Version
}

// stuckError is the conflict of changing a tag produced by roles.
func stuckError(t *Tag) error {
	roles := "of its release"
	if len(t.Roles) > 0 {
		roles = strings.Join(t.Roles, ", ")
	}
	return &models.ConflictError{Reason: fmt.Sprintf("tag %s is stuck to role(s) %s; change the release instead", t.Name, roles)}
}

// TagUpdate changes a user tag's metadata; nil fields stay.
type TagUpdate struct {
	HasPrimary *bool
	Metadata   *map[string]any // replaces the metadata
}

// UpdateTag modifies a tag that no role produces.
func (s *Store) UpdateTag(ctx context.Context, id int64, up TagUpdate) (*Tag, error) {
	if up.Metadata != nil {
		if err := models.ValidateMap("metadata", *up.Metadata); err != nil {
			return nil, err
		}
	}
	var out *Tag
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		tag, err := loadTag(tx, id, true)
		if err != nil {
			return err
		}
		if tag.ReadOnly {
			return stuckError(tag)
		}
		if up.HasPrimary == nil && up.Metadata == nil {
			return models.Invalid("body", "nothing to change: give has_primary and/or metadata")
		}
		if up.HasPrimary != nil {
			tag.HasPrimary = *up.HasPrimary
		}
		if up.Metadata != nil {
			tag.Metadata = *up.Metadata
			if tag.Metadata == nil {
				tag.Metadata = map[string]any{}
			}
		}
		tag.UpdatedAt = models.Now()
		if err := tx.Select("has_primary", "metadata", "updated_at").Save(tag).Error; err != nil {
			return fmt.Errorf("update tag %d: %w", id, err)
		}
		out = tag
		return nil
	})
	return out, err
}

// TagDeletion is what deleting a tag did.
type TagDeletion struct {
	Tag *Tag `json:"tag"`
	// UnassignedFrom names the nodes that lost the tag (or instances of it).
	UnassignedFrom []string `json:"unassigned_from"`
}

// DeleteTag deletes a tag that no role produces and, in the same
// transaction, unassigns it (and its instance tags "name:N") from the nodes
// of its scope where the name is no longer visible.
func (s *Store) DeleteTag(ctx context.Context, id int64) (*TagDeletion, error) {
	out := &TagDeletion{UnassignedFrom: []string{}}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		tag, err := loadTag(tx, id, true)
		if err != nil {
			return err
		}
		if tag.ReadOnly {
			return stuckError(tag)
		}
		out.Tag = tag
		if err := tx.Delete(&Tag{}, id).Error; err != nil {
			return fmt.Errorf("delete tag %d: %w", id, err)
		}
		var deps []models.Deployment
		q := tx.Where("id = ?", tag.OwnerID)
		if tag.OwnerKind == OwnerRelease {
			q = tx.Where("release_id = ?", tag.OwnerID)
		}
		if err := q.Order("id").Find(&deps).Error; err != nil {
			return fmt.Errorf("load deployments of tag %d: %w", id, err)
		}
		for i := range deps {
			visible, err := visibleTagNames(tx, &deps[i])
			if err != nil {
				return err
			}
			if visible[tag.Name] {
				continue // still defined at another level (or a role's name)
			}
			var nodes []models.Node
			if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Select("id", "name", "tags").
				Where("deployment_id = ?", deps[i].ID).Order("id").Find(&nodes).Error; err != nil {
				return fmt.Errorf("load nodes of deployment %s: %w", deps[i].Name, err)
			}
			for _, n := range nodes {
				kept := slices.DeleteFunc(slices.Clone(n.Tags), func(t string) bool {
					base, _, _ := strings.Cut(t, ":")
					return base == tag.Name
				})
				if len(kept) == len(n.Tags) {
					continue
				}
				if err := tx.Model(&models.Node{}).Where("id = ?", n.ID).
					Updates(map[string]any{"tags": jsonList(kept), "updated_at": models.Now()}).Error; err != nil {
					return fmt.Errorf("unassign tag %s from node %s: %w", tag.Name, n.Name, err)
				}
				out.UnassignedFrom = append(out.UnassignedFrom, n.Name)
			}
			if err := tx.Where("deployment_id = ? AND tag = ?", deps[i].ID, tag.Name).Delete(&PrimaryTag{}).Error; err != nil {
				return fmt.Errorf("drop primary of tag %s: %w", tag.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(out.UnassignedFrom)
	return out, nil
}

// jsonList is a string list as a jsonb value for Updates.
func jsonList(list []string) any {
	if list == nil {
		list = []string{}
	}
	b, _ := json.Marshal(list)
	return gorm.Expr("?::jsonb", string(b))
}

// visibleTagNames are the names a node of dep may hold as tags (besides
// their instances "name:N"): the tags dep sees and the names of its
// release's roles.
func visibleTagNames(tx *gorm.DB, dep *models.Deployment) (map[string]bool, error) {
	tags, err := deploymentTags(tx, dep)
	if err != nil {
		return nil, err
	}
	roles, err := models.ReleaseRoles(tx, dep)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(tags)+len(roles))
	for _, t := range tags {
		out[t.Name] = true
	}
	for name := range roles {
		out[name] = true
	}
	return out, nil
}

// NodeTagView is a node's tags as the API shows them.
type NodeTagView struct {
	Node       string `json:"node"`
	Deployment string `json:"deployment"`
	// Tags are the tags the node holds (role tags included).
	Tags []string `json:"tags"`
	// Roles are the node's roles, whose names count as tags at planning.
	Roles []string `json:"roles"`
	// Primary lists the has_primary tags this node is the primary of.
	Primary []string `json:"primary"`
}

// NodeTags shows a node's tags, roles and the tags it is primary for (as
// the next planning would decide).
func (s *Store) NodeTags(ctx context.Context, ref string) (*NodeTagView, error) {
	var out *NodeTagView
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, err := models.FindNode(tx, ref)
		if err != nil {
			return err
		}
		out, err = nodeTagView(tx, node)
		return err
	})
	return out, err
}

func nodeTagView(tx *gorm.DB, node *models.Node) (*NodeTagView, error) {
	dep, err := models.FindDeployment(tx, strconv.FormatInt(node.DeploymentID, 10))
	if err != nil {
		return nil, err
	}
	nodes, err := primaryCandidates(tx, dep.ID)
	if err != nil {
		return nil, err
	}
	chosen, err := choosePrimaries(tx, dep, nodes, false)
	if err != nil {
		return nil, err
	}
	out := &NodeTagView{Node: node.Name, Deployment: dep.Name, Tags: models.NonNil(node.Tags), Roles: models.NonNil(node.Roles), Primary: []string{}}
	for _, tag := range sortedKeys(chosen) {
		if chosen[tag] == node.ID {
			out.Primary = append(out.Primary, tag)
		}
	}
	return out, nil
}

var instanceNumber = regexp.MustCompile(`^[1-9][0-9]*$`)

// AssignTags adds tags to a node, all or nothing. Each must be visible in the
// node's deployment (a tag of its release or of the deployment, or a role
// name of the release), or be an instance tag "name:N" of such a tag with N
// a positive integer.
func (s *Store) AssignTags(ctx context.Context, ref string, tags []string) (*NodeTagView, error) {
	if len(tags) == 0 {
		return nil, models.Invalid("tags", "must list at least one tag")
	}
	if err := models.MaxItems("tags", len(tags), models.MaxListLen); err != nil {
		return nil, err
	}
	for i, tag := range tags {
		if err := models.ValidTagEntry(fmt.Sprintf("tags[%d]", i), tag, false); err != nil {
			return nil, err
		}
	}
	return s.changeNodeTags(ctx, ref, func(tx *gorm.DB, node *models.Node, dep *models.Deployment) ([]string, error) {
		visible, err := visibleTagNames(tx, dep)
		if err != nil {
			return nil, err
		}
		for i, tag := range tags {
			if err := checkAssignable(tag, visible, dep); err != nil {
				return nil, models.Invalid(fmt.Sprintf("tags[%d]", i), "%s", err.Error())
			}
		}
		out := slices.Clone(node.Tags)
		for _, tag := range tags {
			if !slices.Contains(out, tag) {
				out = append(out, tag)
			}
		}
		return out, nil
	})
}

// checkAssignable explains why tag cannot be assigned in dep, or is nil.
func checkAssignable(tag string, visible map[string]bool, dep *models.Deployment) error {
	switch {
	case tag == "":
		return errors.New("is empty")
	case visible[tag]:
		return nil
	case strings.HasPrefix(tag, PrimaryPrefix):
		return fmt.Errorf("%q: primary tags are computed at planning, not assigned", tag)
	}
	if base, n, ok := strings.Cut(tag, ":"); ok {
		if !visible[base] {
			return fmt.Errorf("instance tag %q: no tag %q is defined for deployment %q", tag, base, dep.Name)
		}
		if !instanceNumber.MatchString(n) {
			return fmt.Errorf("instance tag %q: %q is not a positive integer", tag, n)
		}
		return nil
	}
	return fmt.Errorf("no tag %q is defined for deployment %q: create it (POST /api/v1/tags) or use a tag of its release", tag, dep.Name)
}

// UnassignTags removes tags from a node; a tag the node does not hold is
// ignored, and removing every tag is allowed (the node's role names still
// count as tags at planning).
func (s *Store) UnassignTags(ctx context.Context, ref string, tags []string) (*NodeTagView, error) {
	if len(tags) == 0 {
		return nil, models.Invalid("tags", "must list at least one tag")
	}
	if err := models.MaxItems("tags", len(tags), models.MaxListLen); err != nil {
		return nil, err
	}
	for i, tag := range tags {
		if tag == "" {
			return nil, models.Invalid(fmt.Sprintf("tags[%d]", i), "is empty")
		}
		if err := models.ValidLine(fmt.Sprintf("tags[%d]", i), tag, models.MaxLineLen); err != nil {
			return nil, err
		}
	}
	return s.changeNodeTags(ctx, ref, func(_ *gorm.DB, node *models.Node, _ *models.Deployment) ([]string, error) {
		return slices.DeleteFunc(slices.Clone(node.Tags), func(t string) bool { return slices.Contains(tags, t) }), nil
	})
}

// changeNodeTags locks a node, computes its new tags and saves them, in one
// transaction.
func (s *Store) changeNodeTags(ctx context.Context, ref string, change func(*gorm.DB, *models.Node, *models.Deployment) ([]string, error)) (*NodeTagView, error) {
	var out *NodeTagView
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		node, dep, err := models.LockNode(tx, ref)
		if err != nil {
			return err
		}
		tags, err := change(tx, node, dep)
		if err != nil {
			return err
		}
		node.Tags = models.NonNil(tags)
		if err := tx.Model(&models.Node{}).Where("id = ?", node.ID).
			Updates(map[string]any{"tags": jsonList(node.Tags), "updated_at": models.Now()}).Error; err != nil {
			return fmt.Errorf("save tags of node %s: %w", ref, err)
		}
		out, err = nodeTagView(tx, node)
		return err
	})
	return out, err
}

// primaryCandidates loads every node of a deployment (alive or not) with
// what decides the primaries: id, roles and tags.
func primaryCandidates(tx *gorm.DB, deploymentID int64) ([]models.Node, error) {
	var nodes []models.Node
	if err := tx.Select("id", "name", "roles", "tags").Where("deployment_id = ?", deploymentID).
		Order("id").Find(&nodes).Error; err != nil {
		return nil, fmt.Errorf("load nodes of deployment %d: %w", deploymentID, err)
	}
	return nodes, nil
}

// choosePrimaries decides, for every has_primary tag visible in dep, which of
// nodes (all the nodes of dep) is primary: the recorded primary while it
// still holds the tag (role names count), else the holder with the lowest
// id; a tag nobody holds has none. With persist it records the decision in
// primary_tags, dropping rows of tags without a primary.
func choosePrimaries(tx *gorm.DB, dep *models.Deployment, nodes []models.Node, persist bool) (map[string]int64, error) {
	visible, err := deploymentTags(tx, dep)
	if err != nil {
		return nil, err
	}
	var rows []PrimaryTag
	if err := tx.Where("deployment_id = ?", dep.ID).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("load primary tags of deployment %s: %w", dep.Name, err)
	}
	current := make(map[string]int64, len(rows))
	for _, r := range rows {
		current[r.Tag] = r.NodeID
	}
	byID := slices.Clone(nodes)
	slices.SortFunc(byID, func(a, b models.Node) int { return cmp.Compare(a.ID, b.ID) })
	holds := make(map[int64]map[string]bool, len(byID))
	for _, n := range byID {
		set := map[string]bool{}
		for _, t := range plan.NodeTags(n.Roles, n.Tags) {
			set[t] = true
		}
		holds[n.ID] = set
	}
	chosen := map[string]int64{}
	for _, t := range visible {
		if !t.HasPrimary {
			continue
		}
		if _, done := chosen[t.Name]; done {
			continue
		}
		if id, ok := current[t.Name]; ok && holds[id][t.Name] {
			chosen[t.Name] = id
			continue
		}
		for _, n := range byID {
			if holds[n.ID][t.Name] {
				chosen[t.Name] = n.ID
				break
			}
		}
	}
	if !persist {
		return chosen, nil
	}
	var drop []string
	for _, tag := range sortedKeys(current) {
		if _, ok := chosen[tag]; !ok {
			drop = append(drop, tag)
		}
	}
	if len(drop) > 0 {
		if err := tx.Where("deployment_id = ? AND tag IN ?", dep.ID, drop).Delete(&PrimaryTag{}).Error; err != nil {
			return nil, fmt.Errorf("drop primary tags of deployment %s: %w", dep.Name, err)
		}
	}
	for _, tag := range sortedKeys(chosen) {
		if id, ok := current[tag]; ok && id == chosen[tag] {
			continue
		}
		row := PrimaryTag{DeploymentID: dep.ID, Tag: tag, NodeID: chosen[tag]}
		err := tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "deployment_id"}, {Name: "tag"}},
			DoUpdates: clause.AssignmentColumns([]string{"node_id"}),
		}).Create(&row).Error
		if err != nil {
			return nil, fmt.Errorf("record primary of tag %s in deployment %s: %w", tag, dep.Name, err)
		}
	}
	return chosen, nil
}

// primaryPlanningTags decides and records the primaries of a deployment (see
// choosePrimaries) and returns, per node id, the "primary-<tag>" tags the
// planner adds to that node. nodes are all the nodes of the deployment.
func primaryPlanningTags(tx *gorm.DB, deploymentID int64, nodes []models.Node) (map[int64][]string, error) {
	dep, err := models.FindDeployment(tx, strconv.FormatInt(deploymentID, 10))
	if err != nil {
		return nil, err
	}
	chosen, err := choosePrimaries(tx, dep, nodes, true)
	if err != nil {
		return nil, err
	}
	out := map[int64][]string{}
	for _, tag := range sortedKeys(chosen) {
		out[chosen[tag]] = append(out[chosen[tag]], PrimaryPrefix+tag)
	}
	return out, nil
}

// CheckWarning is a finding of the pre-deployment check.
type CheckWarning struct {
	Tag     string `json:"tag"`
	Message string `json:"message"`
}

// DeploymentCheck is the pre-deployment check of a deployment: which
// mandatory tags (those its release declares) no node holds. Deploying is
// allowed anyway.
type DeploymentCheck struct {
	Deployment string         `json:"deployment"`
	Release    string         `json:"release,omitempty"`
	OK         bool           `json:"ok"`
	Mandatory  []string       `json:"mandatory"`
	Warnings   []CheckWarning `json:"warnings"`
}

// CheckDeployment runs the pre-deployment check: every tag the release
// declares (tags_metadata keys and the tags its roles produce) should be
// held by some node of the deployment (role names count as held tags;
// instance tags "name:N" do not hold "name").
func (s *Store) CheckDeployment(ctx context.Context, ref string) (*DeploymentCheck, error) {
	db := s.DB.WithContext(ctx)
	dep, err := models.FindDeployment(db, ref)
	if err != nil {
		return nil, err
	}
	out := &DeploymentCheck{Deployment: dep.Name, OK: true, Mandatory: []string{}, Warnings: []CheckWarning{}}
	if dep.ReleaseID == nil {
		return out, nil
	}
	rel, err := (&models.Store{DB: db}).Release(ctx, strconv.FormatInt(*dep.ReleaseID, 10))
	if err != nil {
		return nil, err
	}
	out.Release = releaseLabel(rel)
	mandatory := map[string]bool{}
	for name := range rel.TagsMetadata {
		mandatory[name] = true
	}
	for _, r := range rel.Roles {
		for _, t := range r.Tags {
			mandatory[t] = true
		}
	}
	delete(mandatory, "")
	nodes, err := primaryCandidates(db, dep.ID)
	if err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, n := range nodes {
		for _, t := range plan.NodeTags(n.Roles, n.Tags) {
			held[t] = true
		}
	}
	for _, tag := range sortedKeys(mandatory) {
		out.Mandatory = append(out.Mandatory, tag)
		if !held[tag] {
			out.Warnings = append(out.Warnings, CheckWarning{Tag: tag,
				Message: fmt.Sprintf("no node of deployment %s holds the mandatory tag %s (declared by release %s)", dep.Name, tag, out.Release)})
		}
	}
	out.OK = len(out.Warnings) == 0
	return out, nil
}
