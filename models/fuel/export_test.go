package fuel

import "fmt"

// NodePlanSQL is nodePlanSQL as StartNodePlan (start) or NodePlan runs it,
// for the test of its plan.
func NodePlanSQL(start bool) string {
	if start {
		return fmt.Sprintf(nodePlanSQL, startNodeSQL)
	}
	return fmt.Sprintf(nodePlanSQL, "")
}
