// Package attrs implements the attribute algebra of the Crowbar 2.0 model:
// how the JSON handed to a jig is assembled from the noderole graph
// (DeepMerge, Visible) and how what the jig hands back is reduced to the
// noderole's "wall" (Diff, Apply).
//
// Values are JSON-like: what encoding/json decodes into an any, that is
// nil, bool, float64, string, []any and map[string]any. Only
// map[string]any and []any are treated as containers; every other value,
// including other map or slice types, is an opaque scalar compared with
// reflect.DeepEqual and copied as is. A nil map[string]any is treated as
// an empty map, and results never contain nil maps, because JSON cannot
// tell an absent object from an empty one once it is stored.
//
// Every function returns fresh values and never mutates its inputs, so a
// caller may hand in blobs loaded from the database and keep using them.
package attrs

import (
	"reflect"
	"slices"
)

// DeepMerge merges layers from first to last and returns a new map.
//
// Later layers win. When both the accumulated value and the later value
// at a key are maps, they are merged recursively, so a later layer only
// needs to carry the keys it wants to change. Any other later value
// replaces the earlier one outright, including nil (JSON null) and lists:
// lists are never concatenated or merged element by element, matching
// Crowbar's and Chef's deep merge, because a list usually means "exactly
// these items" and merging would make it impossible to remove an item
// from a default. A map replacing a scalar (or a scalar replacing a map)
// is also a plain replacement.
//
// A nil layer is skipped. The result is never nil, and it shares no map or
// list with any layer, so neither the inputs nor the result can be
// changed through the other.
func DeepMerge(layers ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, layer := range layers {
		if layer == nil {
			continue
		}
		mergeInto(out, layer)
	}
	return out
}

// mergeInto merges src into dst, which must be owned by the caller (a
// copy built by DeepMerge), so updating it in place is safe.
func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				mergeInto(dv, sv)
				continue
			}
		}
		dst[k] = deepCopy(v)
	}
}

// Visible returns the attributes a noderole's jig run sees, following the
// rule of the Crowbar 2.0 design ("How we determine what information is
// visible to a node during a jig run"). It deep-merges, lowest precedence
// first:
//
//  1. onNode: the blobs of every ACTIVE noderole on the same node;
//  2. parentsMostDistantFirst: the blobs of the parent noderoles and of
//     their deployment roles, one set per distance in the noderole graph,
//     starting from the most distant set and ending with the direct
//     parents, so that closer ancestors override more distant ones;
//  3. own: the noderole's own blobs (its user data, its system data, ...),
//     which therefore override everything else.
//
// Within one slice, later blobs win as in DeepMerge. The seed does not fix
// an order inside a set, so the caller must pass one that is
// deterministic (for example deployment-role data before noderole data,
// so that a binding's own settings beat the deployment defaults, and
// noderoles sorted by id), otherwise two runs could see different
// attributes. Nil blobs and nil sets are skipped.
func Visible(onNode []map[string]any, parentsMostDistantFirst [][]map[string]any, own []map[string]any) map[string]any {
	n := len(onNode) + len(own)
	for _, set := range parentsMostDistantFirst {
		n += len(set)
	}
	layers := make([]map[string]any, 0, n)
	layers = append(layers, onNode...)
	for _, set := range parentsMostDistantFirst {
		layers = append(layers, set...)
	}
	layers = append(layers, own...)
	return DeepMerge(layers...)
}

// DeletedKey is the only key of the deletion marker that Diff puts in a
// wall where the jig removed a key it had been sent.
const DeletedKey = "$deleted"

// ValueKey is the only key of the escape wrapper Diff uses when the jig
// returned, as real data, a map that would otherwise read as a directive
// (a single-key map whose key is DeletedKey or ValueKey). Apply unwraps it
// and stores the wrapped value verbatim.
const ValueKey = "$value"

// Deleted returns a new deletion marker, map[string]any{"$deleted": true}.
//
// The marker is an ordinary JSON object rather than a Go sentinel so that
// a wall survives being stored as JSON (jsonb) and read back. It is a
// function, not a variable, because Go maps are mutable and a shared
// marker could be altered by any caller.
func Deleted() map[string]any {
	return map[string]any{DeletedKey: true}
}

// IsDeleted reports whether v is a deletion marker, that is a map whose
// only key is DeletedKey.
func IsDeleted(v any) bool {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return false
	}
	_, ok = m[DeletedKey]
	return ok
}

// isDirective reports whether m would be read by Apply as an instruction
// (a deletion marker or an escape wrapper) instead of as data.
func isDirective(m map[string]any) bool {
	if len(m) != 1 {
		return false
	}
	for k := range m {
		return k == DeletedKey || k == ValueKey
	}
	return false
}

// Diff returns the wall: what returned (the blob a jig handed back)
// changes relative to sent (the blob it was given). It is empty, never
// nil, when nothing changed.
//
//   - A key added, or whose value changed, appears with its returned value.
//   - When both the sent and returned values at a key are maps, the diff
//     recurses and only the changed sub-keys appear; the key is absent if
//     nothing below it changed.
//   - Lists are compared as wholes: a list that differs in any way appears
//     whole, as returned, mirroring DeepMerge, which replaces lists.
//   - A change of type (map to scalar, scalar or list to map, ...) is a
//     plain replacement with the returned value.
//   - A key present in sent but missing from returned appears as the
//     deletion marker Deleted(), {"$deleted": true}, at the level where
//     the key was removed.
//
// Because the marker is data, a returned map that itself looks like a
// directive ({"$deleted": ...} or {"$value": ...}, alone in its map) is
// written as {"$value": <that map>} wherever it appears in the diff, and
// a nested diff that would look like one (its only changed key is named
// "$deleted" or "$value") is replaced by {"$value": <whole returned map>}, so
// Apply(sent, Diff(sent, returned)) always deep-equals returned (with nil
// maps read as empty maps), including after the diff has been through a
// JSON round trip. Nil inputs are treated as empty maps.
func Diff(sent, returned map[string]any) map[string]any {
	out := map[string]any{}
	for k, r := range returned {
		s, ok := sent[k]
		if !ok {
			out[k] = encode(r)
			continue
		}
		sm, sIsMap := s.(map[string]any)
		rm, rIsMap := r.(map[string]any)
		if sIsMap && rIsMap {
			sub := Diff(sm, rm)
			switch {
			case len(sub) == 0:
			case isDirective(sub):
				// The only change is under a key named like a
				// directive, so the nested diff would read as one;
				// send the whole returned map, escaped, instead.
				out[k] = map[string]any{ValueKey: deepCopy(rm)}
			default:
				out[k] = sub
			}
			continue
		}
		if !reflect.DeepEqual(s, r) {
			out[k] = encode(r)
		}
	}
	for k := range sent {
		if _, ok := returned[k]; !ok {
			out[k] = Deleted()
		}
	}
	return out
}

// encode deep-copies a value that Diff emits whole, escaping every map
// that Apply would otherwise take for a directive. Maps are walked because
// Apply interprets the maps of a diff recursively; lists are not, because
// Apply copies lists verbatim.
func encode(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return deepCopy(v)
	}
	if isDirective(m) {
		return map[string]any{ValueKey: deepCopy(m)}
	}
	out := make(map[string]any, len(m))
	for k, e := range m {
		out[k] = encode(e)
	}
	return out
}

// Apply returns base with diff (as produced by Diff) applied, without
// mutating either. For each key of diff:
//
//   - a deletion marker removes the key (a no-op if it is absent);
//   - an escape wrapper {"$value": v} sets the key to a copy of v as is;
//   - any other map is applied recursively onto base's value when that is
//     a map, and onto an empty map otherwise (so nested markers never leak
//     into the result);
//   - any other value, lists included, replaces the key with a copy.
//
// Apply(sent, Diff(sent, returned)) deep-equals returned. A nil base is an
// empty map; the result is never nil.
func Apply(base, diff map[string]any) map[string]any {
	out := make(map[string]any, len(base)+len(diff))
	for k, v := range base {
		out[k] = deepCopy(v)
	}
	applyInto(out, diff)
	return out
}

// applyInto applies diff to dst, which the caller owns.
func applyInto(dst, diff map[string]any) {
	for k, d := range diff {
		dm, ok := d.(map[string]any)
		if !ok {
			dst[k] = deepCopy(d)
			continue
		}
		switch {
		case IsDeleted(dm):
			delete(dst, k)
		case isDirective(dm): // the escape wrapper
			dst[k] = deepCopy(dm[ValueKey])
		default:
			cur, ok := dst[k].(map[string]any)
			if !ok {
				cur = map[string]any{}
				dst[k] = cur
			}
			applyInto(cur, dm)
		}
	}
}

// deepCopy copies the JSON containers (map[string]any and []any)
// recursively so that results never alias inputs. A nil map becomes an
// empty map (see the package comment); a nil list stays nil because
// reflect.DeepEqual, which compares lists, tells the two apart.
func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		if t == nil {
			return t
		}
		out := slices.Clone(t)
		for i, e := range out {
			out[i] = deepCopy(e)
		}
		return out
	default:
		return v
	}
}

// Clone returns a deep copy of m (nil maps, at any depth, become empty
// maps). It is exported because callers that build layers for DeepMerge or
// Visible often need to hand out a blob without sharing it.
func Clone(m map[string]any) map[string]any {
	return deepCopy(map[string]any(m)).(map[string]any)
}
