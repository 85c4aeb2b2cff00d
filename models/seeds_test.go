package models_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The seeds meet only through the kernel: a seed's store that imports
// another seed's would tie their vocabularies together again, and the
// kernel importing a seed would make every seed depend on it.
func TestSeedsImportOnlyTheKernel(t *testing.T) {
	const root = "github.com/anneal-dev/anneal/models/"
	seeds := []string{"crowbar", "fuel", "heat", "audrey"}
	for _, pkg := range append([]string{"github.com/anneal-dev/anneal/models"}, prefixed(root, seeds)...) {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		require.NoError(t, err, "go list -deps %s", pkg)
		for _, dep := range strings.Fields(string(out)) {
			for _, seed := range prefixed(root, seeds) {
				if dep == pkg || !(dep == seed || strings.HasPrefix(dep, seed+"/")) {
					continue
				}
				if strings.HasPrefix(dep, pkg+"/") { // a seed's own subpackage (audrey/aeolus)
					continue
				}
				t.Errorf("%s imports %s: seeds meet only through the kernel (package models)", pkg, dep)
			}
		}
	}
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}
