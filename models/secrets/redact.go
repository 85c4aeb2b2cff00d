package secrets

import (
	"sort"
	"strings"
)

// Redacted replaces a secret value wherever anneal shows or stores text.
const Redacted = "***"

// MinLen is the shortest secret value accepted: a shorter one could not be
// told apart from ordinary output when redacting.
const MinLen = 6

// Redactor replaces known secret values in text. The zero value and nil
// redact nothing.
type Redactor struct {
	values   []string
	replacer *strings.Replacer
}

// NewRedactor redacts the given values (empty ones are ignored). Longer
// values are replaced first, so a secret containing another one is
// replaced whole.
func NewRedactor(values ...string) *Redactor {
	var vs []string
	seen := map[string]bool{}
	for _, v := range values {
		if v != "" && !seen[v] {
			seen[v] = true
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return nil
	}
	sort.Slice(vs, func(i, j int) bool { return len(vs[i]) > len(vs[j]) })
	pairs := make([]string, 0, 2*len(vs))
	for _, v := range vs {
		pairs = append(pairs, v, Redacted)
	}
	return &Redactor{values: vs, replacer: strings.NewReplacer(pairs...)}
}

// Empty reports whether r redacts nothing.
func (r *Redactor) Empty() bool { return r == nil || len(r.values) == 0 }

// String returns s with every known value replaced by Redacted.
func (r *Redactor) String(s string) string {
	if r.Empty() || s == "" {
		return s
	}
	return r.replacer.Replace(s)
}

// Bytes is String over bytes.
func (r *Redactor) Bytes(b []byte) []byte {
	if r.Empty() || len(b) == 0 {
		return b
	}
	return []byte(r.replacer.Replace(string(b)))
}

// Contains reports whether s holds a known value.
func (r *Redactor) Contains(s string) bool {
	if r.Empty() {
		return false
	}
	for _, v := range r.values {
		if strings.Contains(s, v) {
			return true
		}
	}
	return false
}

// Map redacts the keys and values of a string map (a new map; nil stays nil).
func (r *Redactor) Map(m map[string]string) map[string]string {
	if r.Empty() || m == nil {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[r.String(k)] = r.String(v)
	}
	return out
}

// Value redacts the strings inside a decoded JSON value (a new value).
func (r *Redactor) Value(v any) any {
	if r.Empty() {
		return v
	}
	switch x := v.(type) {
	case string:
		return r.String(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[r.String(k)] = r.Value(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = r.Value(e)
		}
		return out
	}
	return v
}
