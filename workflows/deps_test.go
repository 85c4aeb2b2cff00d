package workflows_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deps lists the packages pkg links, its own included.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	require.NoError(t, err, "go list -deps %s", pkg)
	return strings.Fields(string(out))
}

// The workflows see Postgres only through activities they call by name:
// linking a persistence or expression package would let workflow code
// reach the database (and break determinism) without anyone noticing.
func TestWorkflowsLinkNoPersistence(t *testing.T) {
	for _, d := range deps(t, "github.com/anneal-dev/anneal/workflows") {
		for _, banned := range []string{"gorm.io/", "github.com/jackc/", "cel.dev/", "github.com/google/cel-go",
			"github.com/anneal-dev/anneal/models", "github.com/anneal-dev/anneal/activities", "github.com/anneal-dev/anneal/web"} {
			require.False(t, strings.HasPrefix(d, banned), "workflows links %s", d)
		}
	}
}

// The contract is a leaf: what Temporal sees must not depend on anything
// of anneal's that could change it behind the contract's back.
func TestContractIsALeaf(t *testing.T) {
	for _, d := range deps(t, "github.com/anneal-dev/anneal/workflows/contract") {
		if strings.HasPrefix(d, "github.com/anneal-dev/") {
			require.Equal(t, "github.com/anneal-dev/anneal/workflows/contract", d, "the contract imports %s", d)
		}
		require.False(t, strings.HasPrefix(d, "gorm.io/") || strings.HasPrefix(d, "github.com/jackc/") || strings.HasPrefix(d, "cel.dev/"),
			"the contract links %s", d)
	}
}
