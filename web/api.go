package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/fuel"
	"github.com/anneal-dev/anneal/workflows/contract"
)

func (s *Server) listNodes(c echo.Context) error {
	var depID int64
	if ref := c.QueryParam("deployment"); ref != "" {
		dep, err := s.cfg.Store.Deployment(c.Request().Context(), ref)
		if err != nil {
			return err
		}
		depID = dep.ID
	}
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	nodes, next, err := s.cfg.Store.NodesPage(c.Request().Context(), depID, p)
	if err != nil {
		return err
	}
	return listOf(c, nodes, next)
}

func (s *Server) getNode(c echo.Context) error {
	node, err := s.cfg.Store.Node(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, node)
}

// deleteNode destroys a node (its on_node_delete hooks run first) and
// answers with it as it was; 409 says what to wait for or stop first.
func (s *Server) deleteNode(c echo.Context) error {
	node, err := s.cfg.Store.DeleteNode(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	if node.AgentTokenHash != nil {
		s.auth.forget(*node.AgentTokenHash)
	}
	s.log.Info("node deleted", "node", node.Name, "node_id", node.ID)
	return c.JSON(http.StatusOK, node)
}

type createNodeRequest struct {
	Name       string `json:"name"`
	Admin      bool   `json:"admin"`
	Deployment string `json:"deployment"`
}

func (s *Server) createNode(c echo.Context) error {
	var req createNodeRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	node, _, err := s.cfg.Store.CreateNodeThen(c.Request().Context(), models.NodeInput{
		Name: req.Name, Admin: req.Admin, Deployment: req.Deployment,
	}, false, s.startBootstrap(c.Request().Context()))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, node)
}

type updateNodeRequest struct {
	Deployment *string   `json:"deployment"`
	Roles      *[]string `json:"roles"`
	Available  *bool     `json:"available"`
	Allocated  *bool     `json:"allocated"`
	// Attributes stays raw so that a value that is not an object is a 422
	// naming the field.
	Attributes json.RawMessage `json:"attributes"`
}

func (s *Server) updateNode(c echo.Context) error {
	var req updateNodeRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	up := models.NodeUpdate{Deployment: req.Deployment, Roles: req.Roles, Available: req.Available, Allocated: req.Allocated}
	if req.Attributes != nil {
		attributes, err := jsonObject("attributes", req.Attributes)
		if err != nil {
			return err
		}
		up.Attributes = attributes
	}
	node, err := s.cfg.Store.UpdateNode(c.Request().Context(), c.Param("id"), up)
	if err != nil {
		return err
	}
	if (req.Available != nil && *req.Available) || (req.Allocated != nil && *req.Allocated) {
		// Its todo noderoles may run now.
		s.kickAnnealer(c.Request().Context(), "node "+node.Name+" may be given work")
	}
	return c.JSON(http.StatusOK, node)
}

func (s *Server) listDeployments(c echo.Context) error {
	deps, err := s.cfg.Store.Deployments(c.Request().Context())
	if err != nil {
		return err
	}
	return pageSlice(c, deps, func(d models.Deployment) int64 { return d.ID })
}

func (s *Server) createDeployment(c echo.Context) error {
	var req models.DeploymentInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	dep, err := s.cfg.Store.CreateDeployment(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, dep)
}

// updateDeploymentRequest keeps attributes raw, so that a value that is not
// an object is a 422 naming the field.
type updateDeploymentRequest struct {
	Attributes json.RawMessage `json:"attributes"`
}

// updateDeployment replaces a deployment's attributes, which its graph
// tasks see in $ANNEAL_ATTRS from the next transaction on.
func (s *Server) updateDeployment(c echo.Context) error {
	var req updateDeploymentRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	attributes, err := jsonObject("attributes", req.Attributes)
	if err != nil {
		return err
	}
	dep, err := s.cfg.Store.SetDeploymentAttributes(c.Request().Context(), c.Param("id"), attributes)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, dep)
}

func (s *Server) getDeployment(c echo.Context) error {
	dep, err := s.cfg.Store.Deployment(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	counts, err := s.crowbar.NodeRoleCounts(c.Request().Context(), dep.ID)
	if err != nil {
		return err
	}
	// The noderoles of its committed snapshot by state: the annealer's
	// progress at a glance.
	return c.JSON(http.StatusOK, struct {
		*models.Deployment
		NodeRoles map[string]int `json:"noderoles"`
	}{dep, counts})
}

// importRelease takes a release in Fuel's shape as YAML or JSON. The answer
// is the stored release plus "warnings" (redundant role requirements), which
// do not stop the import.
func (s *Server) importRelease(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	spec, err := ParseRelease(body, c.Request().Header.Get(echo.HeaderContentType))
	if err != nil {
		return err
	}
	rel, err := s.cfg.Store.ImportReleaseWithWarnings(c.Request().Context(), *spec)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, rel)
}

// ParseRelease decodes a release document: JSON when the content type says
// so, YAML otherwise (YAML is a superset of JSON). Either must be exactly one
// document holding an object (a mapping): trailing data, a second document
// or null is a 400.
func ParseRelease(body []byte, contentType string) (*models.ReleaseSpec, error) {
	var spec models.ReleaseSpec
	if strings.Contains(contentType, "json") {
		if err := decodeStrict(body, &spec, true, false); err != nil {
			return nil, err
		}
		return &spec, nil
	}
	// The shape first: one document whose root is a mapping.
	var root yaml.Node
	shape := yaml.NewDecoder(bytes.NewReader(body))
	if err := shape.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "empty body; send a release document"}
		}
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "malformed release YAML: " + err.Error()}
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "a release document must be a mapping (name, version, roles_metadata, ...), not null, a list or a scalar"}
	}
	var next yaml.Node
	if err := shape.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "trailing data after the release document (send one document per request)"}
	}
	dec := yaml.NewDecoder(bytes.NewReader(body))
	dec.KnownFields(true)
	if err := dec.Decode(&spec); err != nil {
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body", Reason: "malformed release YAML: " + err.Error()}
	}
	// The release is stored and answered as JSON: YAML's non-string mapping
	// keys ({1: x}) and .nan/.inf cannot be, and would fail the import with a
	// 500 (found by FuzzParseRelease).
	if _, err := json.Marshal(spec); err != nil {
		return nil, &models.InputError{Status: http.StatusBadRequest, Field: "body",
			Reason: "release YAML is not representable as JSON (mapping keys must be strings, numbers finite): " + err.Error()}
	}
	return &spec, nil
}

func (s *Server) getRelease(c echo.Context) error {
	rel, err := s.cfg.Store.Release(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rel)
}

// idOrName is a node or deployment given by name or by numeric id.
type idOrName string

// UnmarshalJSON accepts a string or an integer; the JSON decoder names the
// field in the error.
func (r *idOrName) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*r = idOrName(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err == nil {
		if _, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			*r = idOrName(n)
			return nil
		}
	}
	return &json.UnmarshalTypeError{Value: string(b), Type: reflect.TypeOf("")}
}

type executeRequest struct {
	Deployment       idOrName            `json:"deployment"`
	Graphs           []fuel.GraphRequest `json:"graphs"`
	DryRun           bool                `json:"dry_run"`
	Force            bool                `json:"force"`
	MaxNodesInFlight int                 `json:"max_nodes_in_flight"`
	FailureThreshold *int                `json:"failure_threshold"`

	// The flags of `fuel2 graph execute`, mapped onto graphs: --env
	// (cluster), --graph-types, --nodes, --task-names.
	Cluster    idOrName `json:"cluster"`
	GraphTypes []string `json:"graph_types"`
	Nodes      []int64  `json:"nodes"`
	TaskNames  []string `json:"task_names"`
}

// toInput maps the request, including its fuel2-style flags, onto one
// execute input.
func (r executeRequest) toInput() (fuel.ExecuteInput, error) {
	in := fuel.ExecuteInput{Deployment: string(r.Deployment), Graphs: r.Graphs, DryRun: r.DryRun, Force: r.Force,
		MaxNodesInFlight: r.MaxNodesInFlight, FailureThreshold: r.FailureThreshold}
	if r.Cluster != "" {
		if in.Deployment != "" {
			return in, models.Invalid("cluster", "give either deployment or cluster (its Fuel name), not both")
		}
		in.Deployment = string(r.Cluster)
	}
	flags := len(r.GraphTypes) > 0 || len(r.Nodes) > 0 || len(r.TaskNames) > 0
	if !flags {
		return in, nil
	}
	if len(r.Graphs) > 0 {
		return in, models.Invalid("graph_types", "give either graphs or the flags graph_types/nodes/task_names, not both")
	}
	types := r.GraphTypes
	if len(types) == 0 {
		types = []string{"deployment"} // fuel2's default graph type
	}
	for _, typ := range types {
		in.Graphs = append(in.Graphs, fuel.GraphRequest{Type: typ, Nodes: r.Nodes, Tasks: r.TaskNames})
	}
	return in, nil
}

// execute is POST /graphs/execute: validate, record the transaction and
// start its workflow, all or nothing.
func (s *Server) execute(c echo.Context) error {
	var req executeRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	in, err := req.toInput()
	if err != nil {
		return err
	}
	txn, err := s.startTransaction(ctx, in, "", nil)
	if err != nil {
		return err
	}
	return s.transactionAccepted(c, txn, s.executeExtras(ctx, txn, in.Deployment, nil))
}

func uuidParam(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("uuid"))
	if err != nil {
		return id, &models.InputError{Status: http.StatusBadRequest, Field: "uuid", Reason: fmt.Sprintf("%q is not a transaction uuid", c.Param("uuid"))}
	}
	return id, nil
}

func (s *Server) getTransaction(c echo.Context) error {
	id, err := uuidParam(c)
	if err != nil {
		return err
	}
	st, err := s.fuel.TransactionStatus(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.transactionView(st))
}

var runStates = []string{contract.RunPlanned, contract.RunPending, contract.RunRunning, contract.RunSucceeded,
	contract.RunFailed, contract.RunBlocked, contract.RunSkipped, contract.RunCancelled}

func (s *Server) listRuns(c echo.Context) error {
	id, err := uuidParam(c)
	if err != nil {
		return err
	}
	f := fuel.RunFilter{Node: c.QueryParam("node"), State: c.QueryParam("state")}
	if f.State != "" && !contains(runStates, f.State) {
		return &models.InputError{Status: http.StatusBadRequest, Field: "state", Reason: fmt.Sprintf("%q is not one of %s", f.State, strings.Join(runStates, ", "))}
	}
	p, err := pageParams(c)
	if err != nil {
		return err
	}
	runs, next, err := s.fuel.RunsPage(c.Request().Context(), id, f, p)
	if err != nil {
		return err
	}
	return listOf(c, runs, next)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
