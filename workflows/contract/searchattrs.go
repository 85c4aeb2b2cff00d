package contract

import (
	"context"
	"errors"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// Custom search attributes anneal's workflows carry, so that the Temporal
// Web UI and `temporal workflow list --query` filter by them, e.g.
// `Deployment="sample" AND ExecutionStatus="Failed"`. They must be
// registered on the namespace before a workflow sets them (`go run ./dev
// search-attributes` does it; `dev up` and `dev test` do it for their
// servers). The names avoid Temporal's built-ins (ExecutionStatus,
// WorkflowType, TaskQueue, ...) and anything prefixed "Temporal".
var (
	// SearchAttrDeployment is the name of the deployment a workflow works on.
	SearchAttrDeployment = temporal.NewSearchAttributeKeyKeyword("Deployment")
	// SearchAttrGraphType is the graph type a transaction or node workflow runs
	// (deployment, provision, ...).
	SearchAttrGraphType = temporal.NewSearchAttributeKeyKeyword("GraphType")
	// SearchAttrNode is the node name a node, noderole or software-deployment
	// workflow works on.
	SearchAttrNode = temporal.NewSearchAttributeKeyKeyword("Node")
	// SearchAttrTransaction is the uuid of the transaction a workflow belongs to.
	SearchAttrTransaction = temporal.NewSearchAttributeKeyKeyword("Transaction")
	// SearchAttrStatus is anneal's own status of the workflow's subject
	// (a transaction's or noderole's state); Temporal's ExecutionStatus is
	// the workflow's.
	SearchAttrStatus = temporal.NewSearchAttributeKeyKeyword("AnnealStatus")
)

// searchAttributeKeys lists every custom search attribute above.
var searchAttributeKeys = []temporal.SearchAttributeKey{
	SearchAttrDeployment, SearchAttrGraphType, SearchAttrNode, SearchAttrTransaction, SearchAttrStatus,
}

// SearchAttributes returns every custom search attribute anneal uses, by
// name with its type, as the operator service's AddSearchAttributes takes
// them. A new one is added here (and so registered everywhere); a
// registered one is never renamed or retyped.
func SearchAttributes() map[string]enumspb.IndexedValueType {
	out := make(map[string]enumspb.IndexedValueType, len(searchAttributeKeys))
	for _, k := range searchAttributeKeys {
		out[k.GetName()] = k.GetValueType()
	}
	return out
}

// executeWorkflow starts a workflow with opts; when the namespace refuses
// its search attributes because they were never registered there, it starts
// it again without them, so that an installation that has not registered
// them (`go run ./dev search-attributes`) still runs, only unfilterable.
func executeWorkflow(ctx context.Context, tc client.Client, opts client.StartWorkflowOptions, workflow string, args ...any) error {
	_, err := tc.ExecuteWorkflow(ctx, opts, workflow, args...)
	if err != nil && opts.TypedSearchAttributes.Size() > 0 && SearchAttributesMissing(err) {
		opts.TypedSearchAttributes = temporal.SearchAttributes{}
		_, err = tc.ExecuteWorkflow(ctx, opts, workflow, args...)
	}
	return err
}

// SearchAttributesMissing reports whether err is Temporal refusing a start
// because a search attribute is not registered on the namespace.
func SearchAttributesMissing(err error) bool {
	var invalid *serviceerror.InvalidArgument
	return errors.As(err, &invalid) && strings.Contains(strings.ToLower(invalid.Error()), "search attribute")
}

// SearchAttributesOf builds the search attributes of a workflow from the
// values given, skipping empty ones.
func SearchAttributesOf(deployment, graphType, node, transaction, status string) temporal.SearchAttributes {
	var updates []temporal.SearchAttributeUpdate
	for _, kv := range []struct {
		key temporal.SearchAttributeKeyKeyword
		v   string
	}{{SearchAttrDeployment, deployment}, {SearchAttrGraphType, graphType}, {SearchAttrNode, node},
		{SearchAttrTransaction, transaction}, {SearchAttrStatus, status}} {
		if kv.v != "" {
			updates = append(updates, kv.key.ValueSet(kv.v))
		}
	}
	return temporal.NewSearchAttributes(updates...)
}
