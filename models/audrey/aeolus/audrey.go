// Package aeolus is the pure logic of Aeolus Audrey (seed 003): templates,
// assemblies and deployables read from the seed's XML (or the same structure
// in YAML), their validation, the instance configurations they produce,
// reference resolution (by assembly name, by assembly type with match-type
// all/first, by service) and deadlock (cycle) detection. It imports neither
// GORM nor Temporal.
package aeolus

import (
	"fmt"
	"sort"
	"strings"
)

// Parameter is a template service parameter: an input (required or not), an
// output ("provided") or both.
type Parameter struct {
	Name     string `json:"name" yaml:"name"`
	Type     string `json:"type,omitempty" yaml:"type,omitempty"` // scalar (default) or list
	Required bool   `json:"required,omitempty" yaml:"required,omitempty"`
	Provided bool   `json:"provided,omitempty" yaml:"provided,omitempty"`
}

// Service is something a configuration engine configures: scripts (puppet
// classes, recipes...) and parameters.
type Service struct {
	Name       string      `json:"name" yaml:"name"`
	Scripts    []string    `json:"scripts,omitempty" yaml:"scripts,omitempty"`
	Parameters []Parameter `json:"parameters,omitempty" yaml:"parameters,omitempty"`
}

// OS is a template's operating system.
type OS struct {
	Name    string `json:"name,omitempty" yaml:"name,omitempty"`
	Version string `json:"version,omitempty" yaml:"version,omitempty"`
}

// Template is a class of instances: an OS and services, without values.
type Template struct {
	Name        string    `json:"name" yaml:"name"`
	OS          OS        `json:"os" yaml:"os,omitempty"`
	Description string    `json:"description,omitempty" yaml:"description,omitempty"`
	Services    []Service `json:"services" yaml:"services"`
}

// Match types of a reference by assembly type or by service.
const (
	MatchAll   = "all"
	MatchFirst = "first"
)

// Reference points at another assembly's provided parameter: exactly one of
// Assembly (an instance name in the deployable), AssemblyType or Service.
type Reference struct {
	Assembly          string `json:"assembly,omitempty" yaml:"assembly,omitempty"`
	AssemblyType      string `json:"assembly_type,omitempty" yaml:"assembly_type,omitempty"`
	Service           string `json:"service,omitempty" yaml:"service,omitempty"`
	MatchType         string `json:"match_type,omitempty" yaml:"match_type,omitempty"`
	ProvidedParameter string `json:"provided_parameter" yaml:"provided_parameter"`
}

// List reports whether the reference yields a list (type or service, all).
func (r *Reference) List() bool {
	return r.Assembly == "" && r.MatchType != MatchFirst
}

// String is the reference as the seed's XML attributes, for messages.
func (r *Reference) String() string {
	var parts []string
	if r.Assembly != "" {
		parts = append(parts, fmt.Sprintf("assembly=%q", r.Assembly))
	}
	if r.AssemblyType != "" {
		parts = append(parts, fmt.Sprintf("assembly-type=%q", r.AssemblyType))
	}
	if r.Service != "" {
		parts = append(parts, fmt.Sprintf("service=%q", r.Service))
	}
	if r.MatchType != "" {
		parts = append(parts, fmt.Sprintf("match-type=%q", r.MatchType))
	}
	parts = append(parts, fmt.Sprintf("provided-parameter=%q", r.ProvidedParameter))
	return strings.Join(parts, " ")
}

// ParamValue is a parameter given a value or a reference in an assembly.
type ParamValue struct {
	Name      string     `json:"name" yaml:"name"`
	Value     *string    `json:"value,omitempty" yaml:"value,omitempty"`
	Reference *Reference `json:"reference,omitempty" yaml:"reference,omitempty"`
}

// AssemblyService gives values to one service of the assembly's template.
type AssemblyService struct {
	Name string `json:"name" yaml:"name"`
	// AllowPartial overrides the assembly's partial-config policy for this
	// service (nil: inherit).
	AllowPartial *bool        `json:"allow_partial,omitempty" yaml:"allow_partial,omitempty"`
	Parameters   []ParamValue `json:"parameters,omitempty" yaml:"parameters,omitempty"`
}

// Assembly is a template with values: its name is the assembly type.
type Assembly struct {
	Name     string `json:"name" yaml:"name"`
	Template string `json:"template" yaml:"template"`
	// AllowPartial: may an instance get a partial config while references
	// are unresolved (202) rather than nothing (204)? Default false.
	AllowPartial *bool             `json:"allow_partial,omitempty" yaml:"allow_partial,omitempty"`
	Services     []AssemblyService `json:"services,omitempty" yaml:"services,omitempty"`
}

// DeployableAssembly is one instance of an assembly type in a deployable.
type DeployableAssembly struct {
	Name string `json:"name" yaml:"name"`
	Type string `json:"type" yaml:"type"`
	HWP  string `json:"hwp,omitempty" yaml:"hwp,omitempty"`
}

// Deployable groups assembly instances into a system.
type Deployable struct {
	Name       string               `json:"name" yaml:"name"`
	Assemblies []DeployableAssembly `json:"assemblies" yaml:"assemblies"`
}

// Document is one import: templates, assemblies and a deployable.
type Document struct {
	Templates  []Template `json:"templates" yaml:"templates"`
	Assemblies []Assembly `json:"assemblies" yaml:"assemblies"`
	Deployable Deployable `json:"deployable" yaml:"deployable"`
}

// InstanceService is a service as an instance sees it.
type InstanceService struct {
	Name         string       `json:"name"`
	AllowPartial *bool        `json:"allow_partial,omitempty"`
	Scripts      []string     `json:"scripts,omitempty"`
	Parameters   []ParamValue `json:"parameters,omitempty"`
}

// InstanceConfig is the slice of a deployable relevant to one instance (the
// seed's instance-config document).
type InstanceConfig struct {
	ID             string            `json:"id"`
	Type           string            `json:"type"`
	Name           string            `json:"name"`
	DeployableName string            `json:"deployable_name"`
	DeployableID   string            `json:"deployable_id"`
	Template       string            `json:"template"`
	AllowPartial   *bool             `json:"allow_partial,omitempty"`
	Provided       []string          `json:"provided"`
	Services       []InstanceService `json:"services"`
}

// ServiceAllowsPartial is the effective policy of service i: the service's
// own setting, else the assembly's, else false.
func (ic *InstanceConfig) ServiceAllowsPartial(i int) bool {
	if p := ic.Services[i].AllowPartial; p != nil {
		return *p
	}
	if ic.AllowPartial != nil {
		return *ic.AllowPartial
	}
	return false
}

// Provides reports whether the instance provides parameter name.
func (ic *InstanceConfig) Provides(name string) bool {
	for _, p := range ic.Provided {
		if p == name {
			return true
		}
	}
	return false
}

// HasService reports whether the instance has service name.
func (ic *InstanceConfig) HasService(name string) bool {
	for _, s := range ic.Services {
		if s.Name == name {
			return true
		}
	}
	return false
}

// Error is one validation problem: the element/field and the reason; Cycle
// is set for a deadlock.
type Error struct {
	Field  string   `json:"field"`
	Reason string   `json:"reason"`
	Cycle  []string `json:"cycle,omitempty"`
}

func (e *Error) Error() string { return e.Field + ": " + e.Reason }

// Errors is every problem found, in document order.
type Errors []*Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Err returns nil for no errors.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

type collector struct{ errs Errors }

func (c *collector) add(field, format string, args ...any) {
	c.errs = append(c.errs, &Error{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Validate checks a document completely: names present and unique, every
// assembly's template, services and parameters exist, every required input
// has a value or a reference, references point at existing assemblies,
// assembly types, services and provided parameters, and the deployable's
// instances exist. Reference cycles are checked by ValidateInstances.
func Validate(doc *Document) Errors {
	c := &collector{}
	templates := map[string]*Template{}
	for i := range doc.Templates {
		t := &doc.Templates[i]
		f := fmt.Sprintf("templates[%d]", i)
		if t.Name == "" {
			c.add(f+".name", "is required")
		} else if templates[t.Name] != nil {
			c.add(f+".name", "template %q is defined twice", t.Name)
		} else {
			templates[t.Name] = t
			f = fmt.Sprintf("template[%s]", t.Name)
		}
		services := map[string]bool{}
		provided := map[string]string{}
		for j, s := range t.Services {
			sf := fmt.Sprintf("%s.services[%d]", f, j)
			if s.Name == "" {
				c.add(sf+".name", "is required")
			} else if services[s.Name] {
				c.add(sf+".name", "service %q is defined twice", s.Name)
			} else {
				services[s.Name] = true
				sf = fmt.Sprintf("%s.service[%s]", f, s.Name)
			}
			params := map[string]bool{}
			for k, p := range s.Parameters {
				pf := fmt.Sprintf("%s.parameters[%d]", sf, k)
				switch {
				case p.Name == "":
					c.add(pf+".name", "is required")
				case params[p.Name]:
					c.add(pf+".name", "parameter %q is defined twice", p.Name)
				default:
					params[p.Name] = true
				}
				if p.Type != "" && p.Type != "scalar" && p.Type != "list" {
					c.add(pf+".type", "must be scalar or list, not %q", p.Type)
				}
				if p.Provided && p.Name != "" {
					if other, ok := provided[p.Name]; ok {
						c.add(pf+".provided", "provided parameter %q is already provided by service %q of this template (provided parameters are per instance)", p.Name, other)
					} else {
						provided[p.Name] = s.Name
					}
				}
			}
		}
	}

	assemblies := map[string]*Assembly{}
	for i := range doc.Assemblies {
		a := &doc.Assemblies[i]
		if a.Name == "" {
			c.add(fmt.Sprintf("assemblies[%d].name", i), "is required")
		} else if assemblies[a.Name] != nil {
			c.add(fmt.Sprintf("assemblies[%d].name", i), "assembly %q is defined twice", a.Name)
		} else {
			assemblies[a.Name] = a
		}
	}
	instances := map[string]string{} // instance name → type
	seen := map[string]bool{}
	typeCount := map[string]int{}
	dep := &doc.Deployable
	if dep.Name == "" {
		c.add("deployable.name", "is required")
	}
	if len(dep.Assemblies) == 0 {
		c.add("deployable.assemblies", "a deployable needs at least one assembly")
	}
	for i, da := range dep.Assemblies {
		f := fmt.Sprintf("deployable.assemblies[%d]", i)
		switch {
		case da.Name == "":
			c.add(f+".name", "is required")
		case seen[da.Name]:
			c.add(f+".name", "assembly name %q is used twice in the deployable (names are unique per deployable)", da.Name)
		}
		if da.Type == "" {
			c.add(f+".type", "is required")
		} else if assemblies[da.Type] == nil {
			c.add(f+".type", "no assembly named %q is defined", da.Type)
		}
		if da.Name != "" && !seen[da.Name] {
			seen[da.Name] = true
			instances[da.Name] = da.Type
			typeCount[da.Type]++
		}
	}
	serviceProvides := func(service, param string) (bool, bool) {
		found := false
		for _, t := range templates {
			for _, s := range t.Services {
				if s.Name != service {
					continue
				}
				found = true
				for _, p := range s.Parameters {
					if p.Name == param && p.Provided {
						return true, true
					}
				}
			}
		}
		return found, false
	}
	templateProvides := func(t *Template, param string) bool {
		if t == nil {
			return false
		}
		for _, s := range t.Services {
			for _, p := range s.Parameters {
				if p.Name == param && p.Provided {
					return true
				}
			}
		}
		return false
	}

	for i := range doc.Assemblies {
		a := &doc.Assemblies[i]
		f := fmt.Sprintf("assemblies[%d]", i)
		if a.Name != "" {
			f = fmt.Sprintf("assembly[%s]", a.Name)
		}
		t := templates[a.Template]
		if a.Template == "" {
			c.add(f+".template", "is required")
			continue
		}
		if t == nil {
			c.add(f+".template", "no template named %q is defined", a.Template)
			continue
		}
		given := map[string]*AssemblyService{}
		for j := range a.Services {
			s := &a.Services[j]
			sf := fmt.Sprintf("%s.services[%d]", f, j)
			if given[s.Name] != nil {
				c.add(sf+".name", "service %q is given twice", s.Name)
				continue
			}
			if !hasService(t, s.Name) {
				c.add(sf+".name", "template %q has no service %q", t.Name, s.Name)
				continue
			}
			given[s.Name] = s
		}
		for _, ts := range t.Services {
			sf := fmt.Sprintf("%s.service[%s]", f, ts.Name)
			as := given[ts.Name]
			values := map[string]*ParamValue{}
			if as != nil {
				for k := range as.Parameters {
					pv := &as.Parameters[k]
					pf := fmt.Sprintf("%s.parameter[%s]", sf, pv.Name)
					if pv.Name == "" {
						c.add(fmt.Sprintf("%s.parameters[%d].name", sf, k), "is required")
						continue
					}
					if values[pv.Name] != nil {
						c.add(pf, "parameter %q is given twice", pv.Name)
						continue
					}
					tp := findParam(&ts, pv.Name)
					if tp == nil {
						c.add(pf, "service %q of template %q has no parameter %q", ts.Name, t.Name, pv.Name)
						continue
					}
					values[pv.Name] = pv
					if pv.Value != nil && pv.Reference != nil {
						c.add(pf, "has both a value and a reference; give one")
						continue
					}
					if r := pv.Reference; r != nil {
						checkReference(c, pf+".reference", r, instances, typeCount, assemblies, templates, serviceProvides, templateProvides)
					}
				}
			}
			for _, tp := range ts.Parameters {
				if !tp.Required {
					continue
				}
				pv := values[tp.Name]
				if pv == nil || (pv.Value == nil && pv.Reference == nil) {
					c.add(fmt.Sprintf("%s.parameter[%s]", sf, tp.Name), "required input parameter has neither a value nor a reference")
				}
			}
		}
	}
	return c.errs
}

func hasService(t *Template, name string) bool {
	for _, s := range t.Services {
		if s.Name == name {
			return true
		}
	}
	return false
}

func findParam(s *Service, name string) *Parameter {
	for i := range s.Parameters {
		if s.Parameters[i].Name == name {
			return &s.Parameters[i]
		}
	}
	return nil
}

func checkReference(c *collector, f string, r *Reference, instances map[string]string, typeCount map[string]int,
	assemblies map[string]*Assembly, templates map[string]*Template,
	serviceProvides func(string, string) (bool, bool), templateProvides func(*Template, string) bool) {
	kinds := 0
	for _, v := range []string{r.Assembly, r.AssemblyType, r.Service} {
		if v != "" {
			kinds++
		}
	}
	if kinds != 1 {
		c.add(f, "must name exactly one of assembly, assembly-type or service (got %s)", r)
		return
	}
	if r.ProvidedParameter == "" {
		c.add(f+".provided-parameter", "is required")
		return
	}
	switch r.MatchType {
	case "", MatchAll, MatchFirst:
	default:
		c.add(f+".match-type", "must be all or first, not %q", r.MatchType)
		return
	}
	if r.Assembly != "" && r.MatchType != "" {
		c.add(f+".match-type", "only applies to references by assembly-type or service (a reference by assembly name is one value)")
		return
	}
	switch {
	case r.Assembly != "":
		typ, ok := instances[r.Assembly]
		if !ok {
			c.add(f+".assembly", "the deployable has no assembly named %q", r.Assembly)
			return
		}
		if a := assemblies[typ]; a != nil && !templateProvides(templates[a.Template], r.ProvidedParameter) {
			c.add(f+".provided-parameter", "assembly %q (type %q) provides no parameter %q", r.Assembly, typ, r.ProvidedParameter)
		}
	case r.AssemblyType != "":
		a := assemblies[r.AssemblyType]
		if a == nil {
			c.add(f+".assembly-type", "no assembly type %q is defined", r.AssemblyType)
			return
		}
		if typeCount[r.AssemblyType] == 0 {
			c.add(f+".assembly-type", "the deployable has no assembly of type %q", r.AssemblyType)
			return
		}
		if !templateProvides(templates[a.Template], r.ProvidedParameter) {
			c.add(f+".provided-parameter", "assembly type %q provides no parameter %q", r.AssemblyType, r.ProvidedParameter)
		}
	default:
		found, provides := serviceProvides(r.Service, r.ProvidedParameter)
		if !found {
			c.add(f+".service", "no template defines a service %q", r.Service)
		} else if !provides {
			c.add(f+".provided-parameter", "service %q provides no parameter %q", r.Service, r.ProvidedParameter)
		}
	}
}

// BuildInstances turns a valid document into one instance config per
// deployable assembly, in deployable order; newID mints instance UUIDs.
func BuildInstances(doc *Document, deployableID string, newID func() string) []InstanceConfig {
	templates := map[string]*Template{}
	for i := range doc.Templates {
		templates[doc.Templates[i].Name] = &doc.Templates[i]
	}
	assemblies := map[string]*Assembly{}
	for i := range doc.Assemblies {
		assemblies[doc.Assemblies[i].Name] = &doc.Assemblies[i]
	}
	var out []InstanceConfig
	for _, da := range doc.Deployable.Assemblies {
		a := assemblies[da.Type]
		t := templates[a.Template]
		ic := InstanceConfig{
			ID: newID(), Type: da.Type, Name: da.Name, DeployableName: doc.Deployable.Name,
			DeployableID: deployableID, Template: t.Name, AllowPartial: a.AllowPartial, Provided: []string{},
		}
		for _, ts := range t.Services {
			is := InstanceService{Name: ts.Name, Scripts: ts.Scripts}
			var given *AssemblyService
			for j := range a.Services {
				if a.Services[j].Name == ts.Name {
					given = &a.Services[j]
				}
			}
			if given != nil {
				is.AllowPartial = given.AllowPartial
			}
			for _, tp := range ts.Parameters {
				if tp.Provided {
					ic.Provided = append(ic.Provided, tp.Name)
				}
				if given == nil {
					continue
				}
				for _, pv := range given.Parameters {
					if pv.Name == tp.Name && (pv.Value != nil || pv.Reference != nil) {
						is.Parameters = append(is.Parameters, pv)
					}
				}
			}
			ic.Services = append(ic.Services, is)
		}
		out = append(out, ic)
	}
	return out
}

// Candidates returns the indices of the instances a reference may take its
// value from, in instance order.
func Candidates(instances []InstanceConfig, r *Reference) []int {
	var out []int
	for i := range instances {
		ic := &instances[i]
		var match bool
		switch {
		case r.Assembly != "":
			match = ic.Name == r.Assembly
		case r.AssemblyType != "":
			match = ic.Type == r.AssemblyType
		case r.Service != "":
			match = ic.HasService(r.Service)
		}
		if match && ic.Provides(r.ProvidedParameter) {
			out = append(out, i)
		}
	}
	return out
}

// Edge orders two instances: From provides a parameter To references.
type Edge struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Parameter string `json:"parameter"` // the consumer's service.parameter
	Provided  string `json:"provided_parameter"`
}

// Edges lists every ordering edge, deduplicated, in instance order.
func Edges(instances []InstanceConfig) []Edge {
	var out []Edge
	seen := map[Edge]bool{}
	for _, ic := range instances {
		for _, s := range ic.Services {
			for _, p := range s.Parameters {
				if p.Reference == nil {
					continue
				}
				for _, ci := range Candidates(instances, p.Reference) {
					e := Edge{From: instances[ci].Name, To: ic.Name, Parameter: s.Name + "." + p.Name, Provided: p.Reference.ProvidedParameter}
					if !seen[e] {
						seen[e] = true
						out = append(out, e)
					}
				}
			}
		}
	}
	return out
}

// ValidateInstances checks the references of instance configs against each
// other (every reference has a provider in the deployable) and refuses
// reference cycles — the seed's deadlock, where every instance waits for
// another's provided parameter — naming the cycle.
func ValidateInstances(instances []InstanceConfig) Errors {
	c := &collector{}
	names := map[string]bool{}
	for i, ic := range instances {
		if names[ic.Name] {
			c.add(fmt.Sprintf("instances[%d].name", i), "assembly name %q is used twice in the deployable", ic.Name)
		}
		names[ic.Name] = true
	}
	for _, ic := range instances {
		for _, s := range ic.Services {
			for _, p := range s.Parameters {
				if p.Reference == nil {
					continue
				}
				if len(Candidates(instances, p.Reference)) == 0 {
					c.add(fmt.Sprintf("instance[%s].service[%s].parameter[%s].reference", ic.Name, s.Name, p.Name),
						"no assembly in the deployable provides it (%s)", p.Reference)
				}
			}
		}
	}
	if len(c.errs) > 0 {
		return c.errs
	}
	if cycle := FindCycle(instances); cycle != nil {
		c.errs = append(c.errs, &Error{
			Field:  fmt.Sprintf("instance[%s]", cycle[0]),
			Reason: fmt.Sprintf("reference cycle (deadlock: each waits for a parameter the next provides only once configured): %s", strings.Join(cycle, " -> ")),
			Cycle:  cycle,
		})
	}
	return c.errs
}

// FindCycle returns a cycle of instance names (first name repeated at the
// end) in the provider → consumer graph, or nil.
func FindCycle(instances []InstanceConfig) []string {
	adj := map[string][]string{}
	for _, e := range Edges(instances) {
		adj[e.From] = append(adj[e.From], e.To)
	}
	for k := range adj {
		sort.Strings(adj[k])
	}
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, m := range adj[n] {
			switch color[m] {
			case grey:
				for i, s := range stack {
					if s == m {
						found = append(append([]string{}, stack[i:]...), m)
						return true
					}
				}
			case white:
				if visit(m) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, ic := range instances {
		if color[ic.Name] == white && visit(ic.Name) {
			return found
		}
	}
	return nil
}
