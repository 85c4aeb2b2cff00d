// Package scenarios ships anneal's built-in YAML documents: the sample
// release that the dev environment imports, and (later) the built-in graphs
// and scenarios.
package scenarios

import _ "embed"

// SampleRelease is a small release in Fuel's shape with a controller and a
// compute role and a deployment graph with a cross-node dependency.
//
//go:embed sample-release.yaml
var SampleRelease []byte
