package models

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testDomain = "anneal.test"

func TestValidateNodeName(t *testing.T) {
	label := func(n int) string { return strings.Repeat("a", n) }
	// 63+1+63+1+63+1+49 = 241 characters, plus ".anneal.test" (12) = 253.
	longest := label(63) + "." + label(63) + "." + label(63) + "." + label(49) + "." + testDomain
	require.Len(t, longest, 253)

	tests := []struct {
		name   string
		input  string
		domain string
		ok     bool
		reason string // a fragment of the reason when !ok
	}{
		{name: "host in domain", input: "node1.anneal.test", ok: true},
		{name: "sub-domain in domain", input: "n1.rack2.anneal.test", ok: true},
		{name: "inner hyphen", input: "compute-01.anneal.test", ok: true},
		{name: "all digits label", input: "42.anneal.test", ok: true},
		{name: "single character", input: "a.anneal.test", ok: true},
		{name: "63 character label", input: label(63) + ".anneal.test", ok: true},
		{name: "exactly 253 characters", input: longest, ok: true},
		{name: "no domain configured", input: "localhost", domain: "-", ok: true},

		{name: "empty", input: "", reason: "is required"},
		{name: "upper case", input: "Node1.anneal.test", reason: "not a valid FQDN"},
		{name: "upper case domain", input: "node1.ANNEAL.test", reason: "not a valid FQDN"},
		{name: "underscore", input: "node_1.anneal.test", reason: "not a valid FQDN"},
		{name: "leading hyphen", input: "-node.anneal.test", reason: "not a valid FQDN"},
		{name: "trailing hyphen", input: "node-.anneal.test", reason: "not a valid FQDN"},
		{name: "64 character label", input: label(64) + ".anneal.test", reason: "not a valid FQDN"},
		{name: "longer than 253", input: "b" + longest, reason: "longer than 253"},
		{name: "empty label", input: "node..anneal.test", reason: "not a valid FQDN"},
		{name: "trailing dot", input: "node.anneal.test.", reason: "not a valid FQDN"},
		{name: "space", input: "no de.anneal.test", reason: "not a valid FQDN"},
		{name: "outside the domain", input: "node1.example.com", reason: "not inside the admin DNS domain"},
		{name: "suffix without a dot boundary", input: "evilanneal.test", reason: "not inside the admin DNS domain"},
		{name: "the domain itself", input: "anneal.test", reason: "not inside the admin DNS domain"},
		{name: "bare host name", input: "node1", reason: "not inside the admin DNS domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			domain := tt.domain
			switch domain {
			case "":
				domain = testDomain
			case "-":
				domain = ""
			}
			err := ValidateNodeName(tt.input, domain)
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			var ie *InputError
			require.True(t, errors.As(err, &ie), "want *InputError, got %v", err)
			assert.Equal(t, "name", ie.Field)
			assert.Contains(t, ie.Reason, tt.reason)
		})
	}
}

func TestReassignRoleTags(t *testing.T) {
	roles := map[string]Role{
		"controller": {Name: "controller", Tags: []string{"api", "db"}},
		"compute":    {Name: "compute", Tags: []string{"hypervisor", "db"}},
		"storage":    {Name: "storage", Tags: []string{}},
	}
	tests := []struct {
		name     string
		tags     []string
		old, new []string
		want     []string
	}{
		{
			name: "assign a role to a bare node adds its name and tags",
			new:  []string{"controller"},
			want: []string{"controller", "api", "db"},
		},
		{
			name: "user tags stay in front",
			tags: []string{"rack1"},
			new:  []string{"controller"},
			want: []string{"rack1", "controller", "api", "db"},
		},
		{
			name: "role without tags adds only its name",
			tags: []string{"rack1"},
			new:  []string{"storage"},
			want: []string{"rack1", "storage"},
		},
		{
			name: "replacing a role drops the old tags, keeps shared and user tags",
			tags: []string{"rack1", "controller", "api", "db"},
			old:  []string{"controller"},
			new:  []string{"compute"},
			want: []string{"rack1", "db", "compute", "hypervisor"},
		},
		{
			name: "tags shared by two roles are not repeated",
			new:  []string{"controller", "compute"},
			want: []string{"controller", "api", "db", "compute", "hypervisor"},
		},
		{
			name: "adding a role keeps the tags of the one still assigned",
			tags: []string{"controller", "api", "db"},
			old:  []string{"controller"},
			new:  []string{"controller", "compute"},
			want: []string{"controller", "api", "db", "compute", "hypervisor"},
		},
		{
			name: "the same roles again change nothing",
			tags: []string{"controller", "rack1", "api", "db"},
			old:  []string{"controller"},
			new:  []string{"controller"},
			want: []string{"controller", "rack1", "api", "db"},
		},
		{
			name: "duplicate tags collapse",
			tags: []string{"rack1", "rack1", "controller"},
			old:  []string{"controller"},
			new:  []string{"controller"},
			want: []string{"rack1", "controller", "api", "db"},
		},
		{
			name: "removing all roles keeps only user tags",
			tags: []string{"rack1", "controller", "api", "db", "compute", "hypervisor"},
			old:  []string{"controller", "compute"},
			new:  []string{},
			want: []string{"rack1"},
		},
		{
			name: "removing all roles of a node without user tags leaves an empty list",
			tags: []string{"storage"},
			old:  []string{"storage"},
			new:  nil,
			want: []string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := reassignRoleTags(tt.tags, tt.old, tt.new, roles)
			require.NotNil(t, got, "a nil list would be stored as JSON null")
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestSecrets(t *testing.T) {
	a, b := NewSecret("ann_"), NewSecret("ann_")
	assert.True(t, strings.HasPrefix(a, "ann_"))
	assert.NotEqual(t, a, b)
	assert.Len(t, HashSecret(a), 64)
	assert.Equal(t, HashSecret(a), HashSecret(a))
	assert.NotEqual(t, HashSecret(a), HashSecret(b))
	// The well-known SHA-256 of the empty string.
	assert.Equal(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", HashSecret(""))
}

func TestErrors(t *testing.T) {
	ie := Invalid("roles[0]", "role %q is unknown", "x")
	assert.Equal(t, `roles[0]: role "x" is unknown`, ie.Error())
	assert.Equal(t, "busy", (&ConflictError{Reason: "busy"}).Error())
	assert.ErrorIs(t, NotFound("node", 7), ErrNotFound)
	assert.Equal(t, "node 7: not found", NotFound("node", 7).Error())
	assert.Equal(t, "ab", StripNUL("a\x00b\x00"))
	assert.Equal(t, []string{}, NonNil(nil))
}
