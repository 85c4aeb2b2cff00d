package models

import (
	"encoding/base64"
	"encoding/json"
)

// Page asks for one page of a list: at most Limit items after the position
// Cursor names ("" is the first page). Lists are keyset-paginated: a cursor
// names the last item of the previous page, so pages neither skip nor repeat
// items when others are added meanwhile.
type Page struct {
	Limit  int
	Cursor string
}

// Pagination bounds of every list endpoint.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// EncodeCursor makes an opaque cursor of an item's sort key.
func EncodeCursor(key any) string {
	b, err := json.Marshal(key)
	if err != nil {
		panic("encode cursor: " + err.Error()) // keys are plain values
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor reads a cursor made by EncodeCursor into key; a cursor that
// does not decode is bad input naming the "cursor" parameter.
func DecodeCursor(cursor string, key any) error {
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err == nil {
		err = json.Unmarshal(b, key)
	}
	if err != nil {
		return &InputError{Status: 400, Field: "cursor", Reason: "is not a cursor this server gave (pass next_cursor of the previous page unchanged)"}
	}
	return nil
}

// PageLimit is the page's limit, defaulted and capped (the API checks the
// bounds first; this keeps other callers safe).
func (p Page) PageLimit() int {
	switch {
	case p.Limit <= 0:
		return DefaultPageLimit
	case p.Limit > MaxPageLimit:
		return MaxPageLimit
	}
	return p.Limit
}
