package plan

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// regexBody returns the expression inside a "/regex/" entry. Exactly one
// slash is stripped at each end: Fuel strips every leading and trailing slash
// (Python's strip('/')), which only differs for a regex that itself starts or
// ends with '/', where Fuel's behaviour is a bug rather than a feature.
func regexBody(entry string) (string, bool) {
	if len(entry) < 2 || entry[0] != '/' || entry[len(entry)-1] != '/' {
		return "", false
	}
	return entry[1 : len(entry)-1], true
}

// isInstanceTag reports whether a node tag is an instance tag ("mysql:1"):
// those are never matched by a regex, only by an exact plain entry, so a
// "/mysql.*/" selector does not spread a task to every mysql instance.
func isInstanceTag(tag string) bool {
	return strings.IndexByte(tag, ':') >= 0
}

// compileRegex compiles the body of a "/regex/" entry. It is matched at the
// start of the tag, like Python's re.match in the Fuel TagsResolver (a prefix
// match: "/contr/" matches "controller"; add "$" to match the whole tag), by
// matchPrefix. The syntax is Go's RE2, not Python's: lookarounds and
// backreferences are rejected.
//
// The body is not wrapped as "^(?:body)" to anchor it: a body with an
// unterminated \Q quotes the wrapper's closing parenthesis, so a valid
// regex such as `\Qa` would be refused (found by FuzzResolves).
func compileRegex(body string) (*regexp.Regexp, error) {
	return regexp.Compile(body)
}

// matchPrefix reports whether re matches a prefix of s: the leftmost match
// starts at 0 exactly when some match does.
func matchPrefix(re *regexp.Regexp, s string) bool {
	loc := re.FindStringIndex(s)
	return loc != nil && loc[0] == 0
}

// regexCache memoises compiled selector regexes for Resolves and AppliesTo,
// which callers invoke once per node; the cap bounds memory if patterns are
// ever user-generated at high cardinality.
var regexCache struct {
	sync.RWMutex
	m map[string]*regexp.Regexp // nil value: the body does not compile
}

const regexCacheCap = 4096

// cachedRegex returns the compiled regex for body, or nil when it
// does not compile (Validate reports those; resolution treats them as
// matching nothing).
func cachedRegex(body string) *regexp.Regexp {
	regexCache.RLock()
	re, ok := regexCache.m[body]
	regexCache.RUnlock()
	if ok {
		return re
	}
	re, err := compileRegex(body)
	if err != nil {
		re = nil
	}
	regexCache.Lock()
	if regexCache.m == nil {
		regexCache.m = make(map[string]*regexp.Regexp)
	}
	if len(regexCache.m) < regexCacheCap {
		regexCache.m[body] = re
	}
	regexCache.Unlock()
	return re
}

// Resolves implements the Fuel TagsResolver: it reports whether a selector
// (a task's tags, or a cross dependency filter) selects a node with nodeTags.
//
// A plain entry matches when nodeTags contains it; a "/regex/" entry matches
// when the regex matches a prefix of some node tag (Python re.match
// semantics), except instance tags ("name:N"), which only a plain entry
// matches; "*" matches any node. An invalid regex matches nothing — Validate
// rejects it before a plan is built.
func Resolves(selector []string, nodeTags []string) bool {
	for _, entry := range selector {
		if entry == Any {
			return true
		}
		body, isRegex := regexBody(entry)
		if !isRegex {
			if contains(nodeTags, entry) {
				return true
			}
			continue
		}
		re := cachedRegex(body)
		if re == nil {
			continue
		}
		for _, tag := range nodeTags {
			if !isInstanceTag(tag) && matchPrefix(re, tag) {
				return true
			}
		}
	}
	return false
}

// AppliesTo reports whether task t runs on a node with nodeTags, selecting by
// Tags, else Role, else Groups. It ignores the task type: Build additionally
// skips group and stage markers.
func AppliesTo(t Task, nodeTags []string) bool {
	return Resolves(t.Selector(), nodeTags)
}

// contains reports whether list holds s; node tag lists are short, so a scan
// beats building a set per node.
func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// matcher is a selector compiled once per graph so that Build does not
// re-parse entries for each of its nodes.
type matcher struct {
	any   bool             // "*" present
	self  bool             // "self" present (filters only)
	plain []string         // exact entries
	res   []*regexp.Regexp // "/regex/" entries, matched by matchPrefix
}

// newMatcher compiles a selector; allowSelf makes "self" special (only in
// cross dependency filters). A bad regex is returned as *badRegexError.
func newMatcher(entries []string, allowSelf bool) (matcher, error) {
	var m matcher
	for _, entry := range entries {
		switch {
		case entry == Any:
			m.any = true
			continue
		case allowSelf && entry == Self:
			m.self = true
			continue
		}
		body, isRegex := regexBody(entry)
		if !isRegex {
			m.plain = append(m.plain, entry)
			continue
		}
		re, err := compileRegex(body)
		if err != nil {
			return matcher{}, &badRegexError{entry: entry, err: err}
		}
		m.res = append(m.res, re)
	}
	return m, nil
}

// empty reports whether the selector has no entries at all.
func (m *matcher) empty() bool {
	return !m.any && !m.self && len(m.plain) == 0 && len(m.res) == 0
}

// matches is Resolves for a compiled selector ("self" is handled by the
// caller, since it depends on the dependent run).
func (m *matcher) matches(nodeTags []string) bool {
	if m.any {
		return true
	}
	for _, p := range m.plain {
		if contains(nodeTags, p) {
			return true
		}
	}
	for _, tag := range nodeTags {
		if isInstanceTag(tag) {
			continue
		}
		for _, re := range m.res {
			if matchPrefix(re, tag) {
				return true
			}
		}
	}
	return false
}

// selecting returns the node tags through which the selector picks the node;
// they define "self" for cross dependencies. With "*" every tag of the node
// counts, since any of them would do.
func (m *matcher) selecting(nodeTags []string) []string {
	if m.any {
		return nodeTags
	}
	var out []string
	for _, tag := range nodeTags {
		if contains(m.plain, tag) {
			out = append(out, tag)
			continue
		}
		if isInstanceTag(tag) {
			continue
		}
		for _, re := range m.res {
			if matchPrefix(re, tag) {
				out = append(out, tag)
				break
			}
		}
	}
	return out
}

// badRegexError reports a "/regex/" entry that does not compile.
type badRegexError struct {
	entry string
	err   error
}

// Error quotes the entry as written, with the parser's reason.
func (e *badRegexError) Error() string {
	return fmt.Sprintf("invalid regex %q: %v", e.entry, e.err)
}

// Unwrap exposes the regexp/syntax error.
func (e *badRegexError) Unwrap() error { return e.err }
