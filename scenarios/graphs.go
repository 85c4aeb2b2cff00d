package scenarios

import (
	"embed"
	"io/fs"
	"sort"
)

//go:embed graphs/*.yaml
var graphFiles embed.FS

// BuiltinGraphs returns the built-in graphs (provision, verification,
// deletion), one YAML document each, in file-name order. Load them at start
// with fuel.EnsureBuiltinGraphs.
func BuiltinGraphs() [][]byte {
	names, err := fs.Glob(graphFiles, "graphs/*.yaml")
	if err != nil {
		panic(err) // the pattern is constant
	}
	sort.Strings(names)
	docs := make([][]byte, 0, len(names))
	for _, name := range names {
		raw, err := graphFiles.ReadFile(name)
		if err != nil {
			panic(err) // embedded: cannot fail
		}
		docs = append(docs, raw)
	}
	return docs
}
