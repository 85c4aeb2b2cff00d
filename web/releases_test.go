package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/crowbar"
)

// redundantRelease has two redundant requirements: web requires base and
// db, which it already requires through app.
const redundantRelease = `
name: redundant
version: "1"
roles_metadata:
  base: {}
  db: {requires: [base]}
  app: {requires: [db]}
  web: {name: Web, requires: [app, base, db]}
`

// releaseAnswer is the POST /api/v1/releases answer.
type releaseAnswer struct {
	ID       int64         `json:"id"`
	Name     string        `json:"name"`
	Version  string        `json:"version"`
	Roles    []models.Role `json:"roles"`
	Warnings []string      `json:"warnings"`
}

func TestImportReleaseAPIWarningsAndBindings(t *testing.T) {
	t.Parallel()
	st := testenv.NewStack(t, testenv.Options{})
	importYAML := func(t *testing.T, doc string) (int, []byte, releaseAnswer) {
		t.Helper()
		var out releaseAnswer
		status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(doc), &out)
		return status, body, out
	}

	// Redundant requirements: imported, with one warning per edge.
	status, body, first := importYAML(t, redundantRelease)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, "redundant", first.Name)
	assert.Equal(t, "1", first.Version)
	assert.NotZero(t, first.ID)
	require.Len(t, first.Roles, 4)
	assert.Equal(t, []string{
		`role "web" requires "base", which it already requires through "db"`,
		`role "web" requires "db", which it already requires through "app"`,
	}, first.Warnings)

	// Without them: "warnings": [] and, re-imported, the same roles.
	clean := strings.Replace(redundantRelease, "requires: [app, base, db]", "requires: [app]", 1)
	status, body, second := importYAML(t, clean)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Contains(t, string(body), `"warnings":[]`)
	assert.Empty(t, second.Warnings)
	assert.Equal(t, first.ID, second.ID)
	require.Len(t, second.Roles, 4)
	for i := range first.Roles {
		assert.Equal(t, first.Roles[i].ID, second.Roles[i].ID, "role %s keeps its id", first.Roles[i].Name)
	}

	// A re-import that drops a bound role: 409, naming it.
	ctx := context.Background()
	_, err := st.Store.CreateDeployment(ctx, models.DeploymentInput{Name: "red", Release: "redundant@1"})
	require.NoError(t, err)
	_, _, err = st.Store.CreateNode(ctx, models.NodeInput{Name: nodeName("r1"), Deployment: "red"}, true)
	require.NoError(t, err)
	snap, err := crowbar.New(st.Store).ProposeSnapshot(ctx, "red")
	require.NoError(t, err)
	for _, role := range []string{"base", "db"} {
		_, _, err = crowbar.New(st.Store).BindRole(ctx, snap.ID, crowbar.BindInput{Node: nodeName("r1"), Role: role})
		require.NoError(t, err)
	}
	dropped := strings.Replace(strings.Replace(clean, "  db: {requires: [base]}\n", "", 1), "requires: [db]", "requires: [base]", 1)
	status, body, _ = importYAML(t, dropped)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	var errBody errorAnswer
	require.NoError(t, jsonUnmarshal(body, &errBody))
	assert.Contains(t, errBody.Error.Message, `"db"`)
	assert.Contains(t, errBody.Error.Message, "unbind")
}
