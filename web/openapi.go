package web

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"

	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"
)

// openAPIYAML is the API's OpenAPI 3.1 document, written by hand next to
// the routes; openapi_test.go checks it documents exactly the routes New
// registers.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIJSON converts the embedded document to JSON.
func openAPIJSON() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	doc, err := jsonKeys(doc)
	if err != nil {
		return nil, fmt.Errorf("convert openapi.yaml: %w", err)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode openapi.yaml as JSON: %w", err)
	}
	return out, nil
}

// jsonKeys turns the maps YAML decodes with non-string keys (an unquoted
// status code such as 200) into maps JSON can encode.
func jsonKeys(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			c, err := jsonKeys(e)
			if err != nil {
				return nil, err
			}
			t[k] = c
		}
		return t, nil
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			switch k.(type) {
			case string, int, int64, uint64, bool, float64:
			default:
				return nil, fmt.Errorf("unsupported map key %v (%T)", k, k)
			}
			c, err := jsonKeys(e)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(k)] = c
		}
		return m, nil
	case []any:
		for i, e := range t {
			c, err := jsonKeys(e)
			if err != nil {
				return nil, err
			}
			t[i] = c
		}
		return t, nil
	}
	return v, nil
}

// openAPIHandler serves the document, converted once when the server is
// built. A document that does not convert (caught by the tests) is
// answered as an internal error rather than stopping the server.
func (s *Server) openAPIHandler() echo.HandlerFunc {
	doc, err := openAPIJSON()
	if err != nil {
		s.log.Error("the OpenAPI document is broken", "error", err)
	}
	return func(c echo.Context) error {
		if err != nil {
			return err
		}
		return c.JSONBlob(http.StatusOK, doc)
	}
}

// Routes lists the routes the server registers, as "METHOD /path" with
// Echo's path syntax (":id"), sorted; Echo's internal not-found routes of
// groups are left out. It exists for the test that keeps the OpenAPI
// document in step with the routes.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		if r.Method == echo.RouteNotFound {
			continue
		}
		out = append(out, r.Method+" "+r.Path)
	}
	sort.Strings(out)
	return out
}
