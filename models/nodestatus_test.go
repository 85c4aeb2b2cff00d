package models

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestComputedStatus(t *testing.T) {
	deploy := "deploy"
	empty := ""
	cases := []struct {
		node Node
		want string
	}{
		{Node{Status: NodeDiscover, Progress: 100}, NodeDiscover},
		{Node{Status: NodeDiscover, Progress: 0}, NodeProvisioning},
		{Node{Status: NodeProvisioned, Progress: 40}, NodeDeploying},
		{Node{Status: NodeDeployed, Progress: 100}, NodeDeployed},
		{Node{Status: NodeDeployed, Progress: 100, ErrorType: &deploy}, NodeError},
		{Node{Status: NodeProvisioned, Progress: 100, ErrorType: &empty}, NodeProvisioned},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, tc.node.ComputedStatus(), "%+v", tc.node)
	}
}
