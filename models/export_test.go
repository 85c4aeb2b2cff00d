package models

// The agents' work queries, for the test of their plans
// (TestWorkQueriesUseAnIndex).
const (
	ClaimWorkSQL = claimWorkSQL
	NextOfferSQL = nextOfferSQL
)
