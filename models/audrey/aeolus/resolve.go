package aeolus

import (
	"time"
)

// Reply is a provided parameter's value as an instance reported it (PUT
// /reply); At is when it was first reported, which decides match-type first.
type Reply struct {
	Value string    `json:"value"`
	At    time.Time `json:"at"`
}

// Replies holds every instance's reported values: instance ID → parameter →
// reply.
type Replies map[string]map[string]Reply

// ResolvedParam is a parameter of an instance's config with what is known.
type ResolvedParam struct {
	Name      string
	Values    []string // one for a scalar; the known ones for a list
	List      bool
	Resolved  bool
	Reference *Reference // the reference it came from, if any
}

// ResolvedService is a service of an instance's config, resolved.
type ResolvedService struct {
	Name         string
	Scripts      []string
	AllowPartial bool
	Params       []ResolvedParam
	Complete     bool
}

// Resolution is an instance's config with its references resolved as far
// as the replies so far allow.
type Resolution struct {
	Config   *InstanceConfig
	Services []ResolvedService
	// Complete: every reference is resolved (GET /configs answers 200).
	Complete bool
	// PartialAllowed: every incomplete service allows a partial config
	// (202); otherwise the config server answers 204.
	PartialAllowed bool
	// Missing names the unresolved parameters as service.parameter.
	Missing []string
}

// Resolve resolves instance idx's references against the replies. A
// reference by assembly name takes that instance's value; by assembly type
// or service with match-type all, the list of every matching instance's
// value (complete once all have reported), in deployable order; with first,
// the value reported earliest (ties: deployable order).
func Resolve(instances []InstanceConfig, idx int, replies Replies) Resolution {
	ic := &instances[idx]
	res := Resolution{Config: ic, Complete: true, PartialAllowed: true}
	for si, s := range ic.Services {
		rs := ResolvedService{Name: s.Name, Scripts: s.Scripts, AllowPartial: ic.ServiceAllowsPartial(si), Complete: true}
		for _, p := range s.Parameters {
			rp := ResolvedParam{Name: p.Name, Reference: p.Reference}
			switch {
			case p.Reference == nil:
				if p.Value != nil {
					rp.Values = []string{*p.Value}
				}
				rp.Resolved = true
			default:
				r := p.Reference
				cands := Candidates(instances, r)
				rp.List = r.List()
				switch {
				case rp.List:
					rp.Resolved = len(cands) > 0
					rp.Values = []string{}
					for _, ci := range cands {
						rep, ok := replies[instances[ci].ID][r.ProvidedParameter]
						if !ok {
							rp.Resolved = false
							continue
						}
						rp.Values = append(rp.Values, rep.Value)
					}
				default:
					var best *Reply
					for _, ci := range cands {
						rep, ok := replies[instances[ci].ID][r.ProvidedParameter]
						if ok && (best == nil || rep.At.Before(best.At)) {
							rep := rep
							best = &rep
						}
					}
					if best != nil {
						rp.Values, rp.Resolved = []string{best.Value}, true
					}
				}
			}
			if !rp.Resolved {
				rs.Complete = false
				res.Missing = append(res.Missing, s.Name+"."+p.Name)
			}
			rs.Params = append(rs.Params, rp)
		}
		if !rs.Complete {
			res.Complete = false
			if !rs.AllowPartial {
				res.PartialAllowed = false
			}
		}
		res.Services = append(res.Services, rs)
	}
	return res
}

// PendingProvided lists the provided parameters instance ic has not
// reported yet, in its order.
func PendingProvided(ic *InstanceConfig, replies Replies) []string {
	out := []string{}
	for _, p := range ic.Provided {
		if _, ok := replies[ic.ID][p]; !ok {
			out = append(out, p)
		}
	}
	return out
}
