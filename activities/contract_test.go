package activities_test

import (
	"reflect"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/activities"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// The worker registers the methods of Activities under their names, and the
// workflows call them by the names in the contract: both lists must match,
// or a workflow schedules an activity no worker knows.
func TestActivityNamesMatchTheContract(t *testing.T) {
	var methods []string
	typ := reflect.TypeOf(&activities.Activities{})
	for i := range typ.NumMethod() {
		methods = append(methods, typ.Method(i).Name)
	}
	names := append([]string(nil), contract.ActivityNames...)
	sort.Strings(methods)
	sort.Strings(names)
	require.Equal(t, names, methods)
}
