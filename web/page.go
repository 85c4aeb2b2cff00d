package web

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/anneal-dev/anneal/models"
)

// list is the answer of every list endpoint: one page of items and the
// cursor of the next page ("" on the last page). A client pages by passing
// next_cursor back as ?cursor= until it is empty.
type list[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"next_cursor"`
}

// listOf answers a page; nil items are answered as [].
func listOf[T any](c echo.Context, items []T, next string) error {
	if items == nil {
		items = []T{}
	}
	return c.JSON(http.StatusOK, list[T]{Items: items, NextCursor: next})
}

// pageParams reads ?limit= (default models.DefaultPageLimit, at most
// models.MaxPageLimit) and ?cursor=.
func pageParams(c echo.Context) (models.Page, error) {
	p := models.Page{Limit: models.DefaultPageLimit, Cursor: c.QueryParam("cursor")}
	if raw := c.QueryParam("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > models.MaxPageLimit {
			return p, &models.InputError{Status: http.StatusBadRequest, Field: "limit",
				Reason: fmt.Sprintf("%q is not a page size from 1 to %d", raw, models.MaxPageLimit)}
		}
		p.Limit = n
	}
	return p, nil
}

// pageSlice answers one page of a list the store returns whole: the lists
// of catalogue-sized things (roles, plugins, scenarios, tags, snapshots...).
// Items are ordered by key, ascending, which must be unique; the cursor is
// the last key of the page, so a page starts right after it even if items
// were added or removed meanwhile.
func pageSlice[T any, K cmp.Ordered](c echo.Context, items []T, key func(T) K) error {
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	slices.SortStableFunc(items, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	if p.Cursor != "" {
		var after K
		if err := models.DecodeCursor(p.Cursor, &after); err != nil {
			return err
		}
		i, found := slices.BinarySearchFunc(items, after, func(t T, k K) int { return cmp.Compare(key(t), k) })
		if found {
			i++
		}
		items = items[i:]
	}
	next := ""
	if len(items) > p.Limit {
		items = items[:p.Limit]
		next = models.EncodeCursor(key(items[len(items)-1]))
	}
	return listOf(c, items, next)
}
