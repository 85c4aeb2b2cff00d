package devenv

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
)

// RegisterSearchAttributes makes sure the namespace has every custom search
// attribute in attrs with its type, adding the missing ones through the
// operator service, and waits until the server lists them. It is
// idempotent: attributes already there with the same type are left alone.
// One that exists with another type, or that collides with a system
// attribute, is an error naming it (a search attribute cannot be retyped).
// It returns the names it added, sorted.
func RegisterSearchAttributes(ctx context.Context, c client.Client, namespace string, attrs map[string]enumspb.IndexedValueType) ([]string, error) {
	op := c.OperatorService()
	list, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return nil, fmt.Errorf("list the search attributes of namespace %q: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	var conflicts []string
	for name, want := range attrs {
		if have, ok := list.GetSystemAttributes()[name]; ok {
			conflicts = append(conflicts, fmt.Sprintf("%s is a Temporal system attribute (%s)", name, have))
			continue
		}
		have, ok := list.GetCustomAttributes()[name]
		switch {
		case !ok:
			missing[name] = want
		case have != want:
			conflicts = append(conflicts, fmt.Sprintf("%s is registered as %s, anneal needs %s", name, have, want))
		}
	}
	if len(conflicts) > 0 {
		sort.Strings(conflicts)
		return nil, fmt.Errorf("search attributes of namespace %q: %s", namespace, strings.Join(conflicts, "; "))
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if _, err := op.AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: namespace, SearchAttributes: missing,
	}); err != nil {
		return nil, fmt.Errorf("add search attributes %s to namespace %q: %w", strings.Join(sortedKeys(missing), ", "), namespace, err)
	}
	// The server registers them asynchronously on some backends: wait until
	// it lists them, so that a workflow started next may set them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
		if err == nil {
			all := true
			for name := range missing {
				if _, ok := list.GetCustomAttributes()[name]; !ok {
					all = false
				}
			}
			if all {
				return sortedKeys(missing), nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("search attributes %s added to namespace %q but not listed after 30s (last error: %v)",
				strings.Join(sortedKeys(missing), ", "), namespace, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
