package models

import (
	"fmt"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The limits every route applies to what it is given, checked before any
// arithmetic or database call (and listed in web/openapi.yaml and the README).
const (
	// MaxNameLen bounds a name: deployments, releases, roles, tags,
	// plugins, scenarios, software configs, deployables and instances.
	MaxNameLen = 63
	// MaxVersionLen bounds a release or plugin version.
	MaxVersionLen = 63
	// MaxTaskIDLen bounds a task id (Fuel's task ids are longer than names).
	MaxTaskIDLen = 128
	// MaxLineLen bounds a one-line text: titles, descriptions, addresses,
	// selectors, references.
	MaxLineLen = 1024
	// MaxTextLen bounds a long text: commands, scripts, file contents,
	// configs, outputs (the body limit of 2 MiB bounds them all anyway).
	MaxTextLen = 1 << 20
	// MaxListLen bounds a list in a request: node ids, task names, tags,
	// roles, graphs, tasks, inputs.
	MaxListLen = 1000
	// MaxTimeoutSec bounds a timeout: one week.
	MaxTimeoutSec = 7 * 24 * 3600
	// MaxRetries bounds a task's retries.
	MaxRetries = 100
	// MaxNodesInFlight bounds a transaction's max_nodes_in_flight.
	MaxNodesInFlight = 100000
	// MaxInstance bounds the N of an instance tag "name:N".
	MaxInstance = 10000
)

// nameRe is the grammar of a name: a letter or digit, then letters,
// digits, '.', '_' or '-' — safe in a URL path segment, a file name and a
// log line.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidName checks a name of the given kind against the name grammar and
// MaxNameLen; an empty name is "is required".
func ValidName(field, kind, s string) error {
	switch {
	case s == "":
		return Invalid(field, "is required")
	case len(s) > MaxNameLen:
		return Invalid(field, "a %s name must be at most %d characters, got %d", kind, MaxNameLen, len(s))
	case !nameRe.MatchString(s):
		return Invalid(field, "%s name %q may contain only letters, digits, '.', '_' and '-', and must start with a letter or digit", kind, Clip(s))
	}
	return nil
}

// ValidVersion checks a version: like a name, '+' allowed, may be empty.
func ValidVersion(field, s string) error {
	if s == "" {
		return nil
	}
	if len(s) > MaxVersionLen {
		return Invalid(field, "must be at most %d characters, got %d", MaxVersionLen, len(s))
	}
	if !versionRe.MatchString(s) {
		return Invalid(field, "version %q may contain only letters, digits, '.', '_', '+' and '-', and must start with a letter or digit", Clip(s))
	}
	return nil
}

var versionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// ValidLine checks a one-line text: at most max bytes of valid UTF-8 with
// no control characters.
func ValidLine(field, s string, max int) error {
	if len(s) > max {
		return Invalid(field, "must be at most %d characters, got %d", max, len(s))
	}
	if !utf8.ValidString(s) {
		return Invalid(field, "is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return Invalid(field, "must not contain control characters (found %U)", r)
		}
	}
	return nil
}

// ValidText checks a long text: at most max bytes of valid UTF-8, no NUL
// (Postgres cannot store one); newlines and tabs are fine.
func ValidText(field, s string, max int) error {
	if len(s) > max {
		return Invalid(field, "must be at most %d bytes, got %d", max, len(s))
	}
	if !utf8.ValidString(s) {
		return Invalid(field, "is not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return Invalid(field, "must not contain a NUL character")
	}
	return nil
}

// InRange checks min <= v <= max.
func InRange(field string, v, min, max int64) error {
	if v < min || v > max {
		return Invalid(field, "must be between %d and %d, got %d", min, max, v)
	}
	return nil
}

// MaxItems checks that a list has at most max entries.
func MaxItems(field string, n, max int) error {
	if n > max {
		return Invalid(field, "may list at most %d entries, got %d", max, n)
	}
	return nil
}

// OneOf checks that v is exactly one of allowed (case matters).
func OneOf(field, v string, allowed ...string) error {
	if !slices.Contains(allowed, v) {
		return Invalid(field, "%q is not one of %s (exactly, case matters)", Clip(v), strings.Join(allowed, ", "))
	}
	return nil
}

// ValidRelPath checks a path confined to a node's work directory: relative,
// no ".." component, no control characters.
func ValidRelPath(field, p string) error {
	if p == "" {
		return Invalid(field, "is required")
	}
	if err := ValidLine(field, p, MaxLineLen); err != nil {
		return err
	}
	if strings.HasPrefix(p, "/") || strings.HasPrefix(p, "~") {
		return Invalid(field, "%q must be relative to the node's work directory, not absolute", Clip(p))
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return Invalid(field, "%q must stay inside the node's work directory (no '..')", Clip(p))
		}
	}
	if path.Clean(p) == "." {
		return Invalid(field, "%q names the work directory itself, not a file in it", Clip(p))
	}
	return nil
}

// ValidTagEntry checks one entry of a tag list or selector: a tag name, an
// instance tag "name:N" (N from 1 to MaxInstance), or, when regex is true, a
// "/regex/" (compiled by the planner) or "*".
func ValidTagEntry(field, s string, regex bool) error {
	if regex && (s == "*" || (len(s) >= 2 && strings.HasPrefix(s, "/") && strings.HasSuffix(s, "/"))) {
		return ValidLine(field, s, MaxLineLen)
	}
	name, n, instance := strings.Cut(s, ":")
	if err := ValidName(field, "tag", name); err != nil {
		return err
	}
	if instance {
		v, err := strconv.Atoi(n)
		if err != nil || v < 1 || v > MaxInstance || n != strconv.Itoa(v) {
			return Invalid(field, "instance tag %q must be name:N with N from 1 to %d", Clip(s), MaxInstance)
		}
	}
	return nil
}

// KnownJigs are the jigs a role may name: the ones anneal runs (agent,
// local, noop, ssh) and Crowbar's others, which import but never become active.
var KnownJigs = []string{"agent", "local", "noop", "ssh", "chef", "puppet", "salt", "ansible", "script", "test"}

// clip shortens a value quoted back in an error.
func Clip(s string) string {
	if len(s) <= 80 {
		return s
	}
	return s[:77] + "..."
}

// ValidateMap walks a JSON object given by a client (attributes, metadata,
// templates) and bounds its depth, size and strings.
func ValidateMap(field string, m map[string]any) error {
	count := 0
	return walkJSON(field, m, 0, &count)
}

const (
	maxJSONDepth = 32
	maxJSONNodes = 100000
)

func walkJSON(field string, v any, depth int, count *int) error {
	*count++
	if *count > maxJSONNodes {
		return Invalid(field, "has more than %d values", maxJSONNodes)
	}
	if depth > maxJSONDepth {
		return Invalid(field, "is nested deeper than %d levels", maxJSONDepth)
	}
	switch x := v.(type) {
	case string:
		return ValidText(field, x, MaxTextLen)
	case map[string]any:
		for k, e := range x {
			if err := ValidText(field+"."+Clip(k), k, MaxLineLen); err != nil {
				return err
			}
			if err := walkJSON(field+"."+k, e, depth+1, count); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := walkJSON(fmt.Sprintf("%s[%d]", field, i), e, depth+1, count); err != nil {
				return err
			}
		}
	}
	return nil
}

// ValidAddress checks where peers reach an agent: empty, a host, or
// host:port with a port from 1 to 65535 (an IPv6 host in brackets).
func ValidAddress(field, s string) error {
	if s == "" {
		return nil
	}
	if err := ValidLine(field, s, 261); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = s, ""
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 || port != strconv.Itoa(p) {
			return Invalid(field, "%q: the port must be a number from 1 to 65535", Clip(s))
		}
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if host == "" || len(host) > 253 {
		return Invalid(field, "%q is not host or host:port", Clip(s))
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if !hostLabel.MatchString(label) {
			return Invalid(field, "%q is not host or host:port (host label %q)", Clip(s), Clip(label))
		}
	}
	return nil
}

var hostLabel = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// ValidBootID checks an agent's boot id: one line of at most 128 bytes.
func ValidBootID(field, s string) error { return ValidLine(field, s, 128) }
