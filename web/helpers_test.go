package web_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// getList GETs every page of a list endpoint with the admin token,
// following next_cursor, and decodes the items into out (nil when the
// first page's items are JSON null, which the API never answers). It
// returns the status and body of the last page it read (of a failing one).
func getList[T any](t testing.TB, st *testenv.Stack, path string, out *[]T) (int, []byte) {
	t.Helper()
	*out = nil
	cursor := ""
	for first := true; ; first = false {
		p := path
		if cursor != "" {
			sep := "?"
			if strings.Contains(p, "?") {
				sep = "&"
			}
			p += sep + "cursor=" + url.QueryEscape(cursor)
		}
		status, raw := st.Do(t, http.MethodGet, p, nil, nil)
		if status != http.StatusOK {
			return status, raw
		}
		var page struct {
			Items      []T     `json:"items"`
			NextCursor *string `json:"next_cursor"`
		}
		require.NoError(t, json.Unmarshal(raw, &page), "decode a page of %s: %s", path, raw)
		require.NotNil(t, page.NextCursor, "%s: a list answers next_cursor", path)
		if first {
			*out = page.Items
		} else {
			*out = append(*out, page.Items...)
		}
		if *page.NextCursor == "" {
			return status, raw
		}
		cursor = *page.NextCursor
	}
}
