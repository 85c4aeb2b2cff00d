package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/heat"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// softwareRoutes serves Heat's software configs and deployments to
// operators, and their delivery to node agents (long poll and signal).
func (s *Server) softwareRoutes(admin, agent *echo.Group) {
	admin.POST("/software_configs", s.createSoftwareConfig)
	admin.GET("/software_configs", s.listSoftwareConfigs)
	admin.GET("/software_configs/:id", s.getSoftwareConfig)
	admin.DELETE("/software_configs/:id", s.deleteSoftwareConfig)
	admin.PUT("/software_configs/:id", s.immutableSoftwareConfig)
	admin.PATCH("/software_configs/:id", s.immutableSoftwareConfig)
	admin.POST("/software_deployments", s.createSoftwareDeployment)
	admin.GET("/software_deployments", s.listSoftwareDeployments)
	admin.GET("/software_deployments/:id", s.getSoftwareDeployment)
	admin.PUT("/software_deployments/:id", s.updateSoftwareDeployment)
	admin.DELETE("/software_deployments/:id", s.deleteSoftwareDeployment)
	admin.PUT("/nodes/:id/software_policy", s.setSoftwarePolicy)

	agent.GET("/software_deployments", s.agentSoftwareDeployments)
	agent.POST("/software_deployments/:id/signal", s.agentSoftwareSignal)
}

func softwareIDParam(c echo.Context, what string) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, &models.InputError{Status: http.StatusBadRequest, Field: "id", Reason: fmt.Sprintf("%q is not a %s id", c.Param("id"), what)}
	}
	return id, nil
}

func (s *Server) createSoftwareConfig(c echo.Context) error {
	var req heat.SoftwareConfigInput
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	cfg, err := s.heat.CreateSoftwareConfig(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, cfg)
}

func (s *Server) listSoftwareConfigs(c echo.Context) error {
	cfgs, err := s.heat.SoftwareConfigs(c.Request().Context())
	if err != nil {
		return err
	}
	return pageSlice(c, cfgs, func(sc heat.SoftwareConfig) int64 { return sc.ID })
}

func (s *Server) getSoftwareConfig(c echo.Context) error {
	id, err := softwareIDParam(c, "software config")
	if err != nil {
		return err
	}
	cfg, err := s.heat.SoftwareConfig(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, cfg)
}

func (s *Server) deleteSoftwareConfig(c echo.Context) error {
	id, err := softwareIDParam(c, "software config")
	if err != nil {
		return err
	}
	if err := s.heat.DeleteSoftwareConfig(c.Request().Context(), id); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// immutableSoftwareConfig answers PUT and PATCH: configs never change.
func (s *Server) immutableSoftwareConfig(c echo.Context) error {
	c.Response().Header().Set("Allow", "GET, DELETE")
	return apiError(http.StatusMethodNotAllowed, "immutable",
		"software configs are immutable: create a new config with POST /api/v1/software_configs (and point deployments at it) instead of changing this one")
}

type softwareDeploymentRequest struct {
	ConfigID    int64          `json:"config_id"`
	ServerID    idOrName       `json:"server_id"`
	InputValues map[string]any `json:"input_values"`
	Action      string         `json:"action"`
	TimeoutSec  int            `json:"timeout_sec"`
	Deployment  idOrName       `json:"deployment"`
}

func (s *Server) createSoftwareDeployment(c echo.Context) error {
	var req softwareDeploymentRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	d, err := s.heat.CreateSoftwareDeployment(ctx, heat.SoftwareDeploymentInput{
		ConfigID: req.ConfigID, Server: string(req.ServerID), InputValues: req.InputValues,
		Action: req.Action, TimeoutSec: req.TimeoutSec, Deployment: string(req.Deployment),
	}, func(d *heat.SoftwareDeployment) error { return s.startSoftwareRound(ctx, d, false) })
	if err != nil {
		return err
	}
	s.log.Info("software deployment created", "software_deployment", d.ID, "node", d.ServerName, "config", d.ConfigID,
		"action", d.Action, "workflow_id", d.WorkflowID)
	return c.JSON(http.StatusCreated, d)
}

// startSoftwareRound starts the round's run of workflow swd-<id> (prefixed
// with "<task queue>/" when the task queue is not the default "anneal"); a
// new round replaces a run of an earlier round that is still open.
func (s *Server) startSoftwareRound(ctx context.Context, d *heat.SoftwareDeployment, replace bool) error {
	cfgName := ""
	if d.Config != nil {
		cfgName = d.Config.Name
	}
	if !replace && s.cfg.TaskQueue != "" && s.cfg.TaskQueue != "anneal" {
		d.WorkflowID = s.cfg.TaskQueue + "/" + contract.SoftwareWorkflowID(d.ID)
	}
	// The node's and its deployment's names, for the summary and the
	// search attributes (best effort: the ids do if the lookup fails).
	nodeName, nodeAttr, depName := fmt.Sprintf("node %d", d.NodeID), "", ""
	if n, err := s.cfg.Store.Node(ctx, strconv.FormatInt(d.NodeID, 10)); err == nil {
		nodeName, nodeAttr = n.Name, n.Name
		if dep, err := s.cfg.Store.Deployment(ctx, strconv.FormatInt(n.DeploymentID, 10)); err == nil {
			depName = dep.Name
		}
	}
	opts := client.StartWorkflowOptions{
		ID:        d.WorkflowID,
		TaskQueue: s.cfg.TaskQueue,
		Memo: map[string]any{
			"software_deployment": d.ID, "round": d.Round, "action": d.Action, "config": cfgName, "node_id": d.NodeID,
		},
		StaticSummary:                            fmt.Sprintf("%s software config %q on %s (round %d)", d.Action, cfgName, nodeName, d.Round),
		TypedSearchAttributes:                    contract.SearchAttributesOf(depName, "", nodeAttr, "", ""),
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
	}
	if replace {
		opts.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING
	}
	in := contract.SoftwareInput{DeploymentID: d.ID, Round: d.Round, Action: d.Action, Delete: d.Deleting}
	if err := contract.StartSoftwareRound(ctx, s.cfg.Temporal, opts, in); err != nil {
		return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "could not start the software deployment workflow; nothing was recorded: "+err.Error())
	}
	return nil
}

func (s *Server) listSoftwareDeployments(c echo.Context) error {
	ctx := c.Request().Context()
	var ds []heat.SoftwareDeployment
	var err error
	if server := c.QueryParam("server_id"); server != "" {
		ds, err = s.heat.ServerSoftwareDeployments(ctx, server)
	} else {
		ds, err = s.heat.SoftwareDeployments(ctx)
	}
	if err != nil {
		return err
	}
	return pageSlice(c, ds, func(d heat.SoftwareDeployment) int64 { return d.ID })
}

func (s *Server) getSoftwareDeployment(c echo.Context) error {
	id, err := softwareIDParam(c, "software deployment")
	if err != nil {
		return err
	}
	d, err := s.heat.SoftwareDeployment(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}

type softwareRoundRequest struct {
	Action      string         `json:"action"`
	InputValues map[string]any `json:"input_values"`
	TimeoutSec  int            `json:"timeout_sec"`
}

// updateSoftwareDeployment starts a new round: REDEPLOY or UNDEPLOY.
func (s *Server) updateSoftwareDeployment(c echo.Context) error {
	id, err := softwareIDParam(c, "software deployment")
	if err != nil {
		return err
	}
	var req softwareRoundRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	d, err := s.heat.UpdateSoftwareDeployment(ctx, id, heat.SoftwareDeploymentUpdate{
		Action: req.Action, InputValues: req.InputValues, TimeoutSec: req.TimeoutSec,
	}, func(d *heat.SoftwareDeployment) error { return s.startSoftwareRound(ctx, d, true) })
	if err != nil {
		return err
	}
	s.log.Info("software deployment round started", "software_deployment", d.ID, "round", d.Round, "action", d.Action)
	d, err = s.heat.SoftwareDeployment(ctx, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}

// deleteSoftwareDeployment deletes a deployment as Heat does: UNDEPLOY runs
// on its server first (a new round), and the deployment is removed once
// the agent signals it, or once the round times out (logged). The answer
// is 202 with the round; GET shows it meanwhile (heat_status
// DELETE_IN_PROGRESS). A failed UNDEPLOY keeps the deployment, FAILED.
// ?force=true removes it at once without UNDEPLOY (204); ?timeout_sec=
// bounds the UNDEPLOY round (default the deployment's timeout_sec).
func (s *Server) deleteSoftwareDeployment(c echo.Context) error {
	id, err := softwareIDParam(c, "software deployment")
	if err != nil {
		return err
	}
	force, err := boolQuery(c, "force")
	if err != nil {
		return err
	}
	timeout := 0
	if v := c.QueryParam("timeout_sec"); v != "" {
		if timeout, err = strconv.Atoi(v); err != nil || timeout < 1 || timeout > 7*24*3600 {
			return &models.InputError{Status: http.StatusBadRequest, Field: "timeout_sec", Reason: fmt.Sprintf("%q is not a number of seconds between 1 and 604800", models.Clip(v))}
		}
	}
	ctx := c.Request().Context()
	if !force {
		d, started, err := s.heat.StartSoftwareDelete(ctx, id, timeout, func(d *heat.SoftwareDeployment) error {
			return s.startSoftwareRound(ctx, d, true)
		})
		if err != nil {
			return err
		}
		if started {
			s.log.Info("software deployment delete started: UNDEPLOY first", "software_deployment", d.ID, "round", d.Round, "timeout_sec", d.TimeoutSec)
		}
		return c.JSON(http.StatusAccepted, d)
	}
	d, err := s.heat.DeleteSoftwareDeployment(ctx, id)
	if err != nil {
		return err
	}
	err = s.cfg.Temporal.TerminateWorkflow(ctx, d.WorkflowID, "", "software deployment deleted")
	var nf *serviceerror.NotFound
	if err != nil && !errors.As(err, &nf) {
		s.log.Warn("could not stop the workflow of a deleted software deployment", "workflow_id", d.WorkflowID, "error", err)
	}
	s.log.Info("software deployment removed without UNDEPLOY (force)", "software_deployment", d.ID)
	return c.NoContent(http.StatusNoContent)
}

type softwarePolicyRequest struct {
	AcceptForeignConfigs bool `json:"accept_foreign_configs"`
}

// setSoftwarePolicy sets the node's deployment policy: whether it accepts
// software deployments from other deployments (clusters) than its own.
func (s *Server) setSoftwarePolicy(c echo.Context) error {
	var req softwarePolicyRequest
	if err := bindStrict(c, &req); err != nil {
		return err
	}
	node, err := s.heat.SetAcceptForeignConfigs(c.Request().Context(), c.Param("id"), req.AcceptForeignConfigs)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, node)
}

// agentSoftwareDeployments is the agent's long poll for its node's software
// deployments awaiting it. ?version= (or If-None-Match) is the version the
// agent last saw: a different current version is answered at once with the
// list; the same one is held until it changes (a NOTIFY on the work channel
// wakes the poll) or ?wait= (default 25s) passes, then answered 304.
func (s *Server) agentSoftwareDeployments(c echo.Context) error {
	nodeID := principal(c).NodeID
	have := c.QueryParam("version")
	if have == "" {
		have = strings.Trim(c.Request().Header.Get("If-None-Match"), `"`)
	}
	wait, err := pollWait(c)
	if err != nil {
		return err
	}
	var version string
	changed, err := s.longPoll(c.Request().Context(), models.WakeSoftware, nodeID, wait, func(ctx context.Context) (bool, error) {
		v, err := s.heat.AgentSoftwareVersion(ctx, nodeID)
		version = strconv.FormatInt(v, 10)
		return version != have, err
	})
	if err != nil {
		return err
	}
	c.Response().Header().Set("ETag", `"`+version+`"`)
	if !changed {
		return c.NoContent(http.StatusNotModified)
	}
	ds, err := s.heat.AgentSoftwareDeployments(c.Request().Context(), nodeID)
	if err != nil {
		return err
	}
	resp := protocol.SoftwareDeploymentsResponse{Version: version, Deployments: make([]protocol.SoftwareDeployment, 0, len(ds))}
	for _, d := range ds {
		// Secret references among the inputs are resolved here, for this
		// node's agent only; one no longer set stays a reference (the
		// hook sees {"get_secret": ...}) and is logged.
		names := models.SecretRefsIn(any(d.ResolvedInputs))
		vals, err := s.cfg.Store.NodeSecrets(c.Request().Context(), nodeID, names)
		if err != nil {
			s.log.Warn("software deployment handed out with unresolved secrets", "software_deployment", d.ID, "error", err)
			vals = map[string]string{}
		}
		out := agentSoftware(d, vals)
		resp.Deployments = append(resp.Deployments, out)
	}
	return c.JSON(http.StatusOK, resp)
}

// agentSoftware is a deployment as the agent's hooks see it: the config's
// inputs with their resolved values, plus deploy_server_id, deploy_action
// and deploy_round.
// Secret references are replaced with their values in secrets, which are
// listed in Redact.
func agentSoftware(d heat.SoftwareDeployment, secrets map[string]string) protocol.SoftwareDeployment {
	out := protocol.SoftwareDeployment{
		ID: d.ID, Round: d.Round, Action: d.Action, Server: d.ServerName, TimeoutSec: d.TimeoutSec,
		InputValues: map[string]any{}, Inputs: []protocol.SoftwareIO{}, Outputs: []protocol.SoftwareIO{}, Options: map[string]any{},
	}
	if d.Config != nil {
		out.Name, out.Group, out.Config = d.Config.Name, d.Config.Group, d.Config.Config
		if d.Config.Options != nil {
			out.Options = d.Config.Options
		}
		for _, in := range d.Config.Inputs {
			v, ok := d.ResolvedInputs[in.Name]
			if ok {
				v = models.ResolveSecretRefs(v, secrets)
				out.InputValues[in.Name] = v
			}
			out.Inputs = append(out.Inputs, protocol.SoftwareIO{Name: in.Name, Type: in.Type, Description: in.Description, Default: in.Default, Value: v})
		}
		for _, o := range d.Config.Outputs {
			out.Outputs = append(out.Outputs, protocol.SoftwareIO{Name: o.Name, Type: o.Type, Description: o.Description, ErrorOutput: o.ErrorOutput})
		}
	}
	for _, extra := range []protocol.SoftwareIO{
		{Name: "deploy_server_id", Type: "String", Description: "the node's name", Value: d.ServerName},
		{Name: "deploy_action", Type: "String", Description: "DEPLOY, REDEPLOY or UNDEPLOY", Value: d.Action},
		{Name: "deploy_round", Type: "Number", Description: "the round of the deployment the signal is for", Value: d.Round},
	} {
		out.Inputs = append(out.Inputs, extra)
		out.InputValues[extra.Name] = extra.Value
	}
	for _, v := range secrets {
		out.Redact = append(out.Redact, v)
	}
	sort.Strings(out.Redact)
	return out
}

// agentSoftwareSignal takes the agent's signal for a deployment of its own
// node: stored in Postgres, then sent to the deployment's workflow. A
// repeated signal for the same round changes nothing and answers 200.
func (s *Server) agentSoftwareSignal(c echo.Context) error {
	id, err := softwareIDParam(c, "software deployment")
	if err != nil {
		return err
	}
	// A signal is one flat JSON object of outputs with deploy_stdout,
	// deploy_stderr and deploy_status_code; its output may hold NUL
	// characters, which the store strips.
	var sig protocol.SoftwareSignal
	body, err := readBody(c)
	if err != nil {
		return err
	}
	if err := decodeStrict(body, &sig, false, true); err != nil {
		return err
	}
	ctx := c.Request().Context()
	rec, err := s.heat.RecordSoftwareSignal(ctx, principal(c).NodeID, id, sig)
	if err != nil {
		return err
	}
	d := rec.Deployment
	log := s.log.With("software_deployment", d.ID, "round", rec.Summary.Round, "workflow_id", d.WorkflowID)
	if d.Status == contract.SoftwareInProgress {
		// Sent again for a repeated signal too: the first send may have
		// failed; the workflow takes only the first one of its round.
		err := contract.SignalSoftwareDeployment(ctx, s.cfg.Temporal, d.WorkflowID, rec.Summary)
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			log.Warn("signal for a round no longer awaited", "error", err)
			return apiError(http.StatusConflict, "round_not_awaited", fmt.Sprintf("software deployment %d round %d is no longer awaited (its workflow has ended)", d.ID, rec.Summary.Round))
		case err != nil:
			return apiError(http.StatusServiceUnavailable, "temporal_unavailable", "signal stored but the workflow could not be told; send it again: "+err.Error())
		}
	}
	log.Info("software deployment signalled", "status_code", rec.Summary.StatusCode, "repeated", !rec.Fresh)
	return c.JSON(http.StatusOK, map[string]any{"id": d.ID, "round": rec.Summary.Round, "status": d.Status, "repeated": !rec.Fresh})
}

// boolQuery reads an optional true/false query parameter.
func boolQuery(c echo.Context, name string) (bool, error) {
	v := c.QueryParam(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &models.InputError{Status: http.StatusBadRequest, Field: name, Reason: fmt.Sprintf("%q is not true or false", models.Clip(v))}
	}
	return b, nil
}
