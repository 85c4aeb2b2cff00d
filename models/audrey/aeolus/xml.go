package aeolus

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// SyntaxError is malformed XML or YAML (the API answers 400); Line is 0 when
// unknown.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

type xmlTemplate struct {
	Name string `xml:"name,attr"`
	OS   struct {
		Name    string `xml:"name"`
		Version string `xml:"version"`
	} `xml:"os"`
	Description string        `xml:"description"`
	Services    []xmlTService `xml:"services>service"`
}

type xmlTService struct {
	Name       string      `xml:"name,attr"`
	Scripts    []string    `xml:"scripts>script"`
	Parameters []xmlTParam `xml:"parameter"`
}

type xmlTParam struct {
	Name     string `xml:"name,attr"`
	Type     string `xml:"type,attr"`
	Required string `xml:"required,attr"`
	Provided string `xml:"provided,attr"`
}

type xmlRef struct {
	Assembly          string `xml:"assembly,attr,omitempty"`
	AssemblyType      string `xml:"assembly-type,attr,omitempty"`
	Service           string `xml:"service,attr,omitempty"`
	MatchType         string `xml:"match-type,attr,omitempty"`
	ProvidedParameter string `xml:"provided-parameter,attr"`
}

type xmlText struct {
	Text string `xml:",chardata"`
}

type xmlAParam struct {
	Name      string    `xml:"name,attr"`
	Values    []xmlText `xml:"value"`
	Reference *xmlRef   `xml:"reference"`
}

type xmlAService struct {
	Name         string      `xml:"name,attr"`
	AllowPartial string      `xml:"allow-partial,attr"`
	Parameters   []xmlAParam `xml:"parameter"`
}

type xmlAssembly struct {
	Name         string `xml:"name,attr"`
	AllowPartial string `xml:"allow-partial,attr"`
	Template     struct {
		Type string `xml:"type,attr"`
	} `xml:"template"`
	Services []xmlAService `xml:"services>service"`
}

type xmlDeployable struct {
	Name       string `xml:"name,attr"`
	Assemblies []struct {
		Name string `xml:"name,attr"`
		Type string `xml:"type,attr"`
		HWP  string `xml:"hwp,attr"`
	} `xml:"assemblies>assembly"`
}

func parseBool(c *collector, field, v string) bool {
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		c.add(field, "must be true or false, not %q", v)
	}
	return b
}

func parseOptBool(c *collector, field, v string) *bool {
	if v == "" {
		return nil
	}
	b := parseBool(c, field, v)
	return &b
}

func (r *xmlRef) model() *Reference {
	if r == nil {
		return nil
	}
	return &Reference{Assembly: r.Assembly, AssemblyType: r.AssemblyType, Service: r.Service,
		MatchType: r.MatchType, ProvidedParameter: r.ProvidedParameter}
}

func refXML(r *Reference) *xmlRef {
	if r == nil {
		return nil
	}
	return &xmlRef{Assembly: r.Assembly, AssemblyType: r.AssemblyType, Service: r.Service,
		MatchType: r.MatchType, ProvidedParameter: r.ProvidedParameter}
}

func xmlSyntax(dec *xml.Decoder, err error) error {
	var se *xml.SyntaxError
	if errors.As(err, &se) {
		return &SyntaxError{Line: se.Line, Msg: se.Msg}
	}
	line, _ := dec.InputPos()
	return &SyntaxError{Line: line, Msg: err.Error()}
}

// ParseXML reads the seed's XML documents: <template>, <assembly> and
// <deployable> elements, either one after another at the top level or
// inside any wrapper element (e.g. <audrey>), optionally grouped in
// <templates> and <assemblies>. Exactly one deployable is expected.
// Syntax errors are *SyntaxError; wrong attribute values are Errors.
func ParseXML(data []byte) (*Document, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	doc := &Document{}
	c := &collector{}
	depth := 0 // wrapper depth
	var deployables int
	sawElement := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, xmlSyntax(dec, err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			sawElement = true
			switch t.Name.Local {
			case "template":
				var x xmlTemplate
				if err := dec.DecodeElement(&x, &t); err != nil {
					return nil, xmlSyntax(dec, err)
				}
				doc.Templates = append(doc.Templates, x.model(c, len(doc.Templates)))
			case "assembly":
				var x xmlAssembly
				if err := dec.DecodeElement(&x, &t); err != nil {
					return nil, xmlSyntax(dec, err)
				}
				doc.Assemblies = append(doc.Assemblies, x.model(c, len(doc.Assemblies)))
			case "deployable":
				var x xmlDeployable
				if err := dec.DecodeElement(&x, &t); err != nil {
					return nil, xmlSyntax(dec, err)
				}
				deployables++
				doc.Deployable = Deployable{Name: x.Name}
				for _, a := range x.Assemblies {
					doc.Deployable.Assemblies = append(doc.Deployable.Assemblies, DeployableAssembly{Name: a.Name, Type: a.Type, HWP: a.HWP})
				}
			default:
				depth++ // a wrapper (<audrey>, <templates>, <assemblies>...)
			}
		case xml.EndElement:
			depth--
		}
	}
	if !sawElement {
		return nil, &SyntaxError{Msg: "no XML element in the body"}
	}
	switch deployables {
	case 0:
		c.add("deployable", "the document has no <deployable> element")
	case 1:
	default:
		c.add("deployable", "the document has %d <deployable> elements; import one at a time", deployables)
	}
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	return doc, nil
}

func (x *xmlTemplate) model(c *collector, i int) Template {
	t := Template{Name: x.Name, OS: OS{Name: strings.TrimSpace(x.OS.Name), Version: strings.TrimSpace(x.OS.Version)},
		Description: strings.TrimSpace(x.Description)}
	for j, s := range x.Services {
		ms := Service{Name: s.Name}
		for _, sc := range s.Scripts {
			ms.Scripts = append(ms.Scripts, strings.TrimSpace(sc))
		}
		for k, p := range s.Parameters {
			f := fmt.Sprintf("templates[%d].services[%d].parameters[%d]", i, j, k)
			ms.Parameters = append(ms.Parameters, Parameter{Name: p.Name, Type: p.Type,
				Required: parseBool(c, f+".required", p.Required), Provided: parseBool(c, f+".provided", p.Provided)})
		}
		t.Services = append(t.Services, ms)
	}
	return t
}

func (x *xmlAssembly) model(c *collector, i int) Assembly {
	a := Assembly{Name: x.Name, Template: x.Template.Type,
		AllowPartial: parseOptBool(c, fmt.Sprintf("assemblies[%d].allow-partial", i), x.AllowPartial)}
	for j, s := range x.Services {
		ms := AssemblyService{Name: s.Name,
			AllowPartial: parseOptBool(c, fmt.Sprintf("assemblies[%d].services[%d].allow-partial", i, j), s.AllowPartial)}
		for k, p := range s.Parameters {
			pv := ParamValue{Name: p.Name, Reference: p.Reference.model()}
			switch len(p.Values) {
			case 0:
			case 1:
				v := p.Values[0].Text
				pv.Value = &v
			default:
				c.add(fmt.Sprintf("assemblies[%d].services[%d].parameters[%d].value", i, j, k), "has %d <value> elements; give one", len(p.Values))
			}
			ms.Parameters = append(ms.Parameters, pv)
		}
		a.Services = append(a.Services, ms)
	}
	return a
}

// ParseYAML reads the same structure as YAML (see Document's yaml tags),
// refusing unknown fields.
func ParseYAML(data []byte) (*Document, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	doc := &Document{}
	if err := dec.Decode(doc); err != nil {
		if err == io.EOF {
			return nil, &SyntaxError{Msg: "empty body"}
		}
		return nil, yamlSyntax(err)
	}
	var extra any
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, &SyntaxError{Msg: "more than one YAML document in the body"}
	}
	return doc, nil
}

func yamlSyntax(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = strings.Join(te.Errors, "; ")
	}
	line := 0
	if i := strings.Index(msg, "line "); i >= 0 {
		if _, err := fmt.Sscanf(msg[i:], "line %d", &line); err == nil && i == 0 {
			if j := strings.Index(msg, ": "); j >= 0 {
				msg = msg[j+2:]
			}
		}
	}
	return &SyntaxError{Line: line, Msg: msg}
}

// Instance config document (the seed's <instance-config>).

type xmlICScript struct {
	Name string `xml:"name,attr"`
}

type xmlICParam struct {
	Name      string    `xml:"name,attr"`
	Type      string    `xml:"type,attr,omitempty"`
	Values    []xmlText `xml:"value"`
	Reference *xmlRef   `xml:"reference"`
}

type xmlICService struct {
	Name         string        `xml:"name,attr"`
	AllowPartial string        `xml:"allow-partial,attr,omitempty"`
	Scripts      []xmlICScript `xml:"scripts>script"`
	Parameters   []xmlICParam  `xml:"parameter"`
}

type xmlNamed struct {
	Name string `xml:"name,attr"`
}

type xmlInstanceConfig struct {
	XMLName      xml.Name `xml:"instance-config"`
	ID           string   `xml:"id,attr"`
	Type         string   `xml:"type,attr"`
	Name         string   `xml:"name,attr"`
	AllowPartial string   `xml:"allow-partial,attr,omitempty"`
	Deployable   struct {
		Name string `xml:"name,attr"`
		ID   string `xml:"id,attr"`
	} `xml:"deployable"`
	Template xmlNamed       `xml:"template"`
	Provided []xmlNamed     `xml:"provided-parameters>provided-parameter"`
	Services []xmlICService `xml:"services>service"`
}

func boolAttr(b *bool) string {
	if b == nil {
		return ""
	}
	return strconv.FormatBool(*b)
}

// InstanceConfigXML renders an instance config as the seed's document, with
// values and references as given (not resolved).
func InstanceConfigXML(ic *InstanceConfig) []byte {
	x := xmlInstanceConfig{ID: ic.ID, Type: ic.Type, Name: ic.Name, AllowPartial: boolAttr(ic.AllowPartial), Template: xmlNamed{ic.Template}}
	x.Deployable.Name, x.Deployable.ID = ic.DeployableName, ic.DeployableID
	for _, p := range ic.Provided {
		x.Provided = append(x.Provided, xmlNamed{p})
	}
	for _, s := range ic.Services {
		xs := xmlICService{Name: s.Name, AllowPartial: boolAttr(s.AllowPartial)}
		for _, sc := range s.Scripts {
			xs.Scripts = append(xs.Scripts, xmlICScript{sc})
		}
		for _, p := range s.Parameters {
			xp := xmlICParam{Name: p.Name, Reference: refXML(p.Reference)}
			if p.Value != nil {
				xp.Values = []xmlText{{*p.Value}}
			}
			xs.Parameters = append(xs.Parameters, xp)
		}
		x.Services = append(x.Services, xs)
	}
	return marshal(x)
}

// ResolvedConfigXML renders the answer of GET /configs/:uuid: the instance
// config document with every resolved reference replaced by its value(s)
// (<parameter type="list"> with one <value> per instance for match-type
// all); an unresolved parameter keeps its <reference> (and the values known
// so far, for a list).
func ResolvedConfigXML(res Resolution) []byte {
	ic := res.Config
	x := xmlInstanceConfig{ID: ic.ID, Type: ic.Type, Name: ic.Name, AllowPartial: boolAttr(ic.AllowPartial), Template: xmlNamed{ic.Template}}
	x.Deployable.Name, x.Deployable.ID = ic.DeployableName, ic.DeployableID
	for _, p := range ic.Provided {
		x.Provided = append(x.Provided, xmlNamed{p})
	}
	for i, s := range res.Services {
		xs := xmlICService{Name: s.Name, AllowPartial: boolAttr(ic.Services[i].AllowPartial)}
		for _, sc := range s.Scripts {
			xs.Scripts = append(xs.Scripts, xmlICScript{sc})
		}
		for _, p := range s.Params {
			xp := xmlICParam{Name: p.Name}
			if p.List {
				xp.Type = "list"
			}
			for _, v := range p.Values {
				xp.Values = append(xp.Values, xmlText{v})
			}
			if !p.Resolved {
				xp.Reference = refXML(p.Reference)
			}
			xs.Parameters = append(xs.Parameters, xp)
		}
		x.Services = append(x.Services, xs)
	}
	return marshal(x)
}

// ParseInstanceConfig reads an <instance-config> document (POST
// /configs/:uuid). Syntax errors are *SyntaxError, missing parts Errors.
func ParseInstanceConfig(data []byte) (*InstanceConfig, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var x xmlInstanceConfig
	if err := dec.Decode(&x); err != nil {
		if err == io.EOF {
			return nil, &SyntaxError{Msg: "empty body; send an <instance-config> document"}
		}
		return nil, xmlSyntax(dec, err)
	}
	c := &collector{}
	ic := &InstanceConfig{ID: x.ID, Type: x.Type, Name: x.Name, DeployableName: x.Deployable.Name, DeployableID: x.Deployable.ID,
		Template: x.Template.Name, AllowPartial: parseOptBool(c, "instance-config.allow-partial", x.AllowPartial), Provided: []string{}}
	if x.ID == "" {
		c.add("instance-config.id", "is required")
	}
	if x.Name == "" {
		c.add("instance-config.name", "is required")
	}
	if x.Type == "" {
		c.add("instance-config.type", "is required")
	}
	seenP := map[string]bool{}
	for i, p := range x.Provided {
		if p.Name == "" || seenP[p.Name] {
			c.add(fmt.Sprintf("provided-parameters[%d].name", i), "is empty or given twice")
			continue
		}
		seenP[p.Name] = true
		ic.Provided = append(ic.Provided, p.Name)
	}
	seenS := map[string]bool{}
	for i, s := range x.Services {
		f := fmt.Sprintf("services[%d]", i)
		if s.Name == "" || seenS[s.Name] {
			c.add(f+".name", "is empty or given twice")
		}
		seenS[s.Name] = true
		is := InstanceService{Name: s.Name, AllowPartial: parseOptBool(c, f+".allow-partial", s.AllowPartial)}
		for _, sc := range s.Scripts {
			is.Scripts = append(is.Scripts, sc.Name)
		}
		for j, p := range s.Parameters {
			pf := fmt.Sprintf("%s.parameters[%d]", f, j)
			pv := ParamValue{Name: p.Name, Reference: p.Reference.model()}
			if p.Name == "" {
				c.add(pf+".name", "is required")
			}
			switch {
			case len(p.Values) == 1 && pv.Reference == nil:
				v := p.Values[0].Text
				pv.Value = &v
			case len(p.Values) == 0 && pv.Reference != nil:
				r := pv.Reference
				if r.ProvidedParameter == "" {
					c.add(pf+".reference.provided-parameter", "is required")
				}
				switch r.MatchType {
				case "", MatchAll, MatchFirst:
				default:
					c.add(pf+".reference.match-type", "must be all or first, not %q", r.MatchType)
				}
			default:
				c.add(pf, "needs exactly one <value> or one <reference>")
			}
			is.Parameters = append(is.Parameters, pv)
		}
		ic.Services = append(ic.Services, is)
	}
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	return ic, nil
}

// Provided parameters documents (GET /params answer, PUT /reply body):
//
//	<provided-parameters>
//	  <provided-parameter name="db_host"/>                       (GET /params)
//	  <provided-parameter name="db_host"><value><![CDATA[10.0.0.5]]></value></provided-parameter>  (PUT /reply)
//	</provided-parameters>

type xmlProvidedParam struct {
	Name  string   `xml:"name,attr"`
	Value *xmlText `xml:"value"`
}

type xmlProvidedParams struct {
	XMLName xml.Name           `xml:"provided-parameters"`
	Params  []xmlProvidedParam `xml:"provided-parameter"`
}

// ProvidedParamsXML renders the names of provided parameters still expected.
func ProvidedParamsXML(names []string) []byte {
	x := xmlProvidedParams{}
	for _, n := range names {
		x.Params = append(x.Params, xmlProvidedParam{Name: n})
	}
	return marshal(x)
}

// ReplyXML renders a reply body (for clients and tests).
func ReplyXML(values map[string]string, order []string) []byte {
	x := xmlProvidedParams{}
	for _, n := range order {
		v, ok := values[n]
		if !ok {
			continue
		}
		x.Params = append(x.Params, xmlProvidedParam{Name: n, Value: &xmlText{v}})
	}
	return marshal(x)
}

// ParseReply reads a PUT /reply body: name → value, in document order.
func ParseReply(data []byte) (map[string]string, []string, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var x xmlProvidedParams
	if err := dec.Decode(&x); err != nil {
		if err == io.EOF {
			return nil, nil, &SyntaxError{Msg: "empty body; send a <provided-parameters> document with a <value> per parameter"}
		}
		return nil, nil, xmlSyntax(dec, err)
	}
	c := &collector{}
	out := map[string]string{}
	var order []string
	for i, p := range x.Params {
		f := fmt.Sprintf("provided-parameters[%d]", i)
		switch {
		case p.Name == "":
			c.add(f+".name", "is required")
		case p.Value == nil:
			c.add(f+".value", "parameter %q has no <value>", p.Name)
		default:
			if _, dup := out[p.Name]; dup {
				c.add(f+".name", "parameter %q is given twice", p.Name)
				continue
			}
			out[p.Name] = p.Value.Text
			order = append(order, p.Name)
		}
	}
	if len(x.Params) == 0 {
		c.add("provided-parameters", "no <provided-parameter> given")
	}
	if len(c.errs) > 0 {
		return nil, nil, c.errs
	}
	return out, order, nil
}

func marshal(v any) []byte {
	b, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("audrey: marshal XML: %v", err)) // only fixed types are marshalled
	}
	return append([]byte(xml.Header), append(b, '\n')...)
}

// ResolvedConfig is what an instance reads from GET /configs/:uuid: its
// identity, the parameters it provides, and each service with its scripts
// and parameters as far as they are resolved.
type ResolvedConfig struct {
	ID       string
	Name     string
	Type     string
	Provided []string
	Services []ResolvedService
}

// ParseResolvedConfig reads the answer of GET /configs/:uuid (the
// instance-config document of ResolvedConfigXML): a parameter with a
// <reference> is unresolved; type="list" holds one <value> per instance.
// A service is complete when all its parameters are resolved.
func ParseResolvedConfig(data []byte) (*ResolvedConfig, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var x xmlInstanceConfig
	if err := dec.Decode(&x); err != nil {
		if err == io.EOF {
			return nil, &SyntaxError{Msg: "empty instance config"}
		}
		return nil, xmlSyntax(dec, err)
	}
	if x.ID == "" || x.Name == "" {
		return nil, Errors{{Field: "instance-config", Reason: "needs an id and a name"}}
	}
	rc := &ResolvedConfig{ID: x.ID, Name: x.Name, Type: x.Type, Provided: []string{}}
	for _, p := range x.Provided {
		rc.Provided = append(rc.Provided, p.Name)
	}
	for _, s := range x.Services {
		rs := ResolvedService{Name: s.Name, AllowPartial: s.AllowPartial == "true", Complete: true}
		for _, sc := range s.Scripts {
			rs.Scripts = append(rs.Scripts, sc.Name)
		}
		for _, p := range s.Parameters {
			rp := ResolvedParam{Name: p.Name, List: p.Type == "list", Resolved: p.Reference == nil, Reference: p.Reference.model()}
			for _, v := range p.Values {
				rp.Values = append(rp.Values, v.Text)
			}
			if !rp.Resolved {
				rs.Complete = false
			}
			rs.Params = append(rs.Params, rp)
		}
		rc.Services = append(rc.Services, rs)
	}
	return rc, nil
}
