package models

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestValidationVocabulary: each check of validate.go accepts what the
// documented limits allow and refuses the rest with an InputError naming
// the field.
func TestValidationVocabulary(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		name string
		err  error
		ok   bool
	}{
		{"name", ValidName("name", "deployment", "prod-eu_1.x"), true},
		{"name upper case", ValidName("name", "deployable", "Deployable1"), true},
		{"name at the cap", ValidName("name", "release", long(MaxNameLen)), true},
		{"name over the cap", ValidName("name", "release", long(MaxNameLen+1)), false},
		{"name empty", ValidName("name", "role", ""), false},
		{"name with a space", ValidName("name", "role", "a b"), false},
		{"name traversal", ValidName("name", "tag", "../../etc/passwd"), false},
		{"name slash", ValidName("name", "tag", "a/b"), false},
		{"name control character", ValidName("name", "tag", "a\nb"), false},
		{"name SQL", ValidName("name", "tag", "x'; DROP TABLE nodes;--"), false},
		{"name leading dot", ValidName("name", "tag", ".hidden"), false},
		{"version", ValidVersion("version", "1.0+build-2"), true},
		{"version empty", ValidVersion("version", ""), true},
		{"version space", ValidVersion("version", "1 0"), false},
		{"line", ValidLine("title", "Compute node — ünïcode", MaxLineLen), true},
		{"line over", ValidLine("title", long(MaxLineLen+1), MaxLineLen), false},
		{"line tab", ValidLine("title", "a\tb", MaxLineLen), false},
		{"line NUL", ValidLine("title", "a\x00b", MaxLineLen), false},
		{"line bad UTF-8", ValidLine("title", "a\xffb", MaxLineLen), false},
		{"text newlines", ValidText("cmd", "echo a\n\techo b\n", MaxTextLen), true},
		{"text NUL", ValidText("cmd", "a\x00", MaxTextLen), false},
		{"text over", ValidText("cmd", long(MaxTextLen+1), MaxTextLen), false},
		{"range low", InRange("timeout", -1, 0, MaxTimeoutSec), false},
		{"range high", InRange("timeout", MaxTimeoutSec+1, 0, MaxTimeoutSec), false},
		{"range 2^63-1", InRange("timeout", 1<<63-1, 0, MaxTimeoutSec), false},
		{"range in", InRange("timeout", 60, 0, MaxTimeoutSec), true},
		{"items", MaxItems("nodes", MaxListLen, MaxListLen), true},
		{"items over", MaxItems("nodes", 65536, MaxListLen), false},
		{"enum exact", OneOf("action", "DEPLOY", "DEPLOY", "UNDEPLOY"), true},
		{"enum case", OneOf("action", "deploy", "DEPLOY", "UNDEPLOY"), false},
		{"path", ValidRelPath("path", "conf/app.conf"), true},
		{"path absolute", ValidRelPath("path", "/etc/passwd"), false},
		{"path home", ValidRelPath("path", "~/x"), false},
		{"path traversal", ValidRelPath("path", "conf/../../etc/passwd"), false},
		{"path dot dot", ValidRelPath("path", ".."), false},
		{"path dot", ValidRelPath("path", "./"), false},
		{"path empty", ValidRelPath("path", ""), false},
		{"tag", ValidTagEntry("tags[0]", "mysql", false), true},
		{"tag instance", ValidTagEntry("tags[0]", "mysql:2", false), true},
		{"tag instance zero", ValidTagEntry("tags[0]", "mysql:0", false), false},
		{"tag instance huge", ValidTagEntry("tags[0]", "mysql:99999999999999999999", false), false},
		{"tag instance leading zero", ValidTagEntry("tags[0]", "mysql:01", false), false},
		{"tag regex where allowed", ValidTagEntry("tags[0]", "/db-.*/", true), true},
		{"tag regex where not", ValidTagEntry("tags[0]", "/db-.*/", false), false},
		{"tag any", ValidTagEntry("tags[0]", "*", true), true},
		{"address host:port", ValidAddress("address", "10.0.0.5:7070"), true},
		{"address IPv6", ValidAddress("address", "[::1]:7070"), true},
		{"address host", ValidAddress("address", "node-1.anneal.test"), true},
		{"address empty", ValidAddress("address", ""), true},
		{"address port too big", ValidAddress("address", "x:99999"), false},
		{"address port zero", ValidAddress("address", "x:0"), false},
		{"address port text", ValidAddress("address", "x:http"), false},
		{"address junk host", ValidAddress("address", "a b:80"), false},
		{"map", ValidateMap("data", map[string]any{"a": []any{"x", map[string]any{"b": 1.0}}}), true},
		{"map NUL value", ValidateMap("data", map[string]any{"a": []any{"x\x00"}}), false},
		{"map NUL key", ValidateMap("data", map[string]any{"a\x00": 1.0}), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ok {
				assert.NoError(t, tc.err)
				return
			}
			var ie *InputError
			require.True(t, errors.As(tc.err, &ie), "want an InputError, got %v", tc.err)
			assert.NotEmpty(t, ie.Field)
			assert.Less(t, len(ie.Reason), 400, "the reason quotes a clipped value")
		})
	}
	var ie *InputError
	require.True(t, errors.As(ValidName("roles_metadata.x", "role", "a b"), &ie))
	assert.Equal(t, "roles_metadata.x", ie.Field)

	deep := map[string]any{}
	cur := deep
	for range 40 {
		next := map[string]any{}
		cur["k"] = next
		cur = next
	}
	assert.Error(t, ValidateMap("data", deep), "nesting is bounded")
}
