package fuel

import (
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/anneal-dev/anneal/models"
	"github.com/anneal-dev/anneal/models/plan"
)

// Jigs: how a run reaches its node.
const (
	// JigAgent hands the run to the node's agent (pull).
	JigAgent = "agent"
	// JigOrchestrator runs it in the worker, with the node's context.
	JigOrchestrator = "orchestrator"
	// JigNone has nothing to execute.
	JigNone = "none"
	// JigSSH runs it in the worker on the node over SSH (parameters.jig).
	JigSSH = "ssh"
)

// Task types beyond shell (Fuel's special tasks).
const (
	TaskNoop            = "noop"
	TaskSkipped         = "skipped"
	TaskUploadFile      = "upload_file"
	TaskSync            = "sync"
	TaskEraseNode       = "erase_node"
	TaskMasterShell     = "master_shell"
	TaskMoveToBootstrap = "move_to_bootstrap"
	TaskReboot          = "reboot"
)

var octalMode = regexp.MustCompile(`^0?[0-7]{3}$`)

// envVarName is what a task's parameters.secrets may name: a portable
// environment variable name.
var envVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxTaskSecrets bounds the secrets one task references.
const maxTaskSecrets = 100

// validateSecretRefs checks a task's parameters.secrets: environment
// variable names (not ANNEAL_*, which anneal sets) to secret names.
func validateSecretRefs(field string, refs map[string]plan.SecretRef) error {
	if err := models.MaxItems(field, len(refs), maxTaskSecrets); err != nil {
		return err
	}
	for _, env := range sortedKeys(refs) {
		f := field + "." + env
		switch {
		case len(env) > models.MaxTaskIDLen || !envVarName.MatchString(env):
			return models.Invalid(field, "%q is not an environment variable name (letters, digits and _, not starting with a digit)", models.Clip(env))
		case strings.HasPrefix(strings.ToUpper(env), "ANNEAL_"):
			return models.Invalid(f, "ANNEAL_* variables are set by anneal; pick another name")
		}
		if err := models.ValidName(f+".secret", "secret", refs[env].Secret); err != nil {
			return err
		}
	}
	return nil
}

// SecretNames lists the secrets the given tasks reference, sorted, once
// each.
func SecretNames(tasks []*plan.Task) []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range tasks {
		for _, ref := range t.Parameters.Secrets {
			if !seen[ref.Secret] {
				seen[ref.Secret] = true
				out = append(out, ref.Secret)
			}
		}
	}
	sort.Strings(out)
	return out
}

// runSpec turns a task into what its jig executes. Tasks the agent runs
// become a shell command here, so the agent needs to know only shell:
// upload_file writes its data, sync copies a directory, erase_node wipes
// the node's state (its credential and logs stay, so it can come back).
func runSpec(t *plan.Task) (models.RunSpec, error) {
	p := t.Parameters
	spec := models.RunSpec{Jig: JigAgent, Cmd: p.Cmd, TimeoutSec: p.Timeout, Retries: p.Retries}
	for env, ref := range p.Secrets {
		if spec.Secrets == nil {
			spec.Secrets = map[string]string{}
		}
		spec.Secrets[env] = ref.Secret
	}
	if spec.TimeoutSec <= 0 {
		spec.TimeoutSec = models.DefaultTaskTimeoutSec
	}
	switch t.Kind() {
	case plan.TypeShell:
		if p.Cmd == "" {
			spec.Jig = JigNone
		}
	case TaskNoop, TaskSkipped:
		spec.Jig = JigNone
	case TaskUploadFile:
		if p.Path == "" {
			return spec, fmt.Errorf("task %q: upload_file needs parameters.path", t.ID)
		}
		mode := p.Permissions
		if mode == "" {
			mode = "0644"
		}
		if !octalMode.MatchString(mode) {
			return spec, fmt.Errorf("task %q: parameters.permissions %q is not an octal mode like 0644", t.ID, mode)
		}
		spec.Cmd = fmt.Sprintf("mkdir -p \"$(dirname %[1]s)\" && printf '%%s' '%[2]s' | base64 -d > %[1]s && chmod %[3]s %[1]s",
			shellQuote(p.Path), base64.StdEncoding.EncodeToString([]byte(p.Data)), mode)
	case TaskSync:
		if p.Src == "" || p.Dst == "" {
			return spec, fmt.Errorf("task %q: sync needs parameters.src and parameters.dst", t.ID)
		}
		spec.Cmd = fmt.Sprintf("mkdir -p %[2]s && cp -a %[1]s/. %[2]s/", shellQuote(p.Src), shellQuote(p.Dst))
	case TaskEraseNode:
		spec.Cmd = `find "$ANNEAL_WORKDIR" -mindepth 1 -maxdepth 1 ! -name credential.json ! -name logs -exec rm -rf {} + && echo "node state erased"`
	case TaskMasterShell:
		if p.Cmd == "" {
			return spec, fmt.Errorf("task %q: master_shell needs parameters.cmd", t.ID)
		}
		spec.Jig = JigOrchestrator
	case TaskMoveToBootstrap:
		spec.Jig = JigOrchestrator
	case TaskReboot:
		// The agent reboots; Timeout bounds how long the orchestrator waits
		// for the node to come back with a new boot id.
	default:
		return spec, fmt.Errorf("task %q: unknown task type %q", t.ID, t.Type)
	}
	switch p.Jig {
	case "", JigAgent:
	case JigSSH:
		// Only what the agent would run as a shell command goes over SSH;
		// a reboot waits for the agent's new boot id.
		if spec.Jig == JigAgent && t.Kind() != TaskReboot {
			spec.Jig = JigSSH
		} else if spec.Jig != JigNone {
			return spec, fmt.Errorf("task %q: a %s task cannot use parameters.jig ssh", t.ID, t.Kind())
		}
	default:
		return spec, fmt.Errorf("task %q: parameters.jig must be agent or ssh, not %q", t.ID, p.Jig)
	}
	return spec, nil
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// taskTypes are the task types anneal runs, markers included; "" is shell.
var taskTypes = []string{plan.TypeShell, plan.TypeGroup, plan.TypeStage, TaskNoop, TaskSkipped, TaskUploadFile,
	TaskSync, TaskEraseNode, TaskMasterShell, TaskMoveToBootstrap, TaskReboot}

// maxGraphTasks bounds the tasks of one graph.
const maxGraphTasks = 5000

// ValidateTasks checks the shape of a graph's tasks as written, before the
// planner's checks (plan.Validate): the list's size, each task's id, a known
// type with the parameters it needs (runSpec decides), a command or file
// contents within models.MaxTextLen, paths confined to the node's work
// directory, octal permissions, timeouts and retries in range, selector and
// dependency lists bounded. field prefixes the errors ("tasks",
// "graphs.deployment.tasks"); each names its task and parameter.
func ValidateTasks(field string, tasks []plan.Task) error {
	if err := models.MaxItems(field, len(tasks), maxGraphTasks); err != nil {
		return err
	}
	for i := range tasks {
		if err := validateTask(fmt.Sprintf("%s[%d]", field, i), &tasks[i]); err != nil {
			return err
		}
	}
	return nil
}

func validateTask(field string, t *plan.Task) error {
	bad := func(err error) error {
		var ie *models.InputError
		if errors.As(err, &ie) {
			if ie.Details == nil {
				ie.Details = map[string]any{}
			}
			if t.ID != "" {
				ie.Details["task"] = t.ID
			}
		}
		return err
	}
	switch {
	case strings.TrimSpace(t.ID) == "":
		return bad(models.Invalid(field+".id", "is required (a task needs a non-blank id)"))
	case len(t.ID) > models.MaxTaskIDLen:
		return bad(models.Invalid(field+".id", "must be at most %d characters, got %d", models.MaxTaskIDLen, len(t.ID)))
	case strings.HasPrefix(t.ID, "/"):
		return bad(models.Invalid(field+".id", "%q must not start with '/' (that is a /regex/ in a reference)", models.Clip(t.ID)))
	}
	if err := models.ValidLine(field+".id", t.ID, models.MaxTaskIDLen); err != nil {
		return bad(err)
	}
	if t.Type != "" {
		if err := models.OneOf(field+".type", t.Type, taskTypes...); err != nil {
			return bad(err)
		}
	}
	for _, l := range []struct {
		name string
		list []string
	}{{"tags", t.Tags}, {"role", t.Role}, {"groups", t.Groups}, {"requires", t.Requires}, {"required_for", t.RequiredFor}} {
		if err := models.MaxItems(field+"."+l.name, len(l.list), models.MaxListLen); err != nil {
			return bad(err)
		}
		for k, e := range l.list {
			if err := models.ValidLine(fmt.Sprintf("%s.%s[%d]", field, l.name, k), e, models.MaxLineLen); err != nil {
				return bad(err)
			}
		}
	}
	for _, l := range []struct {
		name string
		deps []plan.CrossDep
	}{{"cross_depends", t.CrossDepends}, {"cross_depended_by", t.CrossDependedBy}} {
		if err := models.MaxItems(field+"."+l.name, len(l.deps), models.MaxListLen); err != nil {
			return bad(err)
		}
		for k, d := range l.deps {
			f := fmt.Sprintf("%s.%s[%d]", field, l.name, k)
			if err := models.ValidLine(f+".name", d.Name, models.MaxLineLen); err != nil {
				return bad(err)
			}
			if err := models.MaxItems(f+".tags", len(d.Tags)+len(d.Role), models.MaxListLen); err != nil {
				return bad(err)
			}
		}
	}
	p := &t.Parameters
	params := field + ".parameters"
	if err := models.InRange(params+".timeout", int64(p.Timeout), 0, models.MaxTimeoutSec); err != nil {
		return bad(err)
	}
	if err := models.InRange(params+".retries", int64(p.Retries), 0, models.MaxRetries); err != nil {
		return bad(err)
	}
	for _, s := range []struct{ name, v string }{{"cmd", p.Cmd}, {"data", p.Data}} {
		if err := models.ValidText(params+"."+s.name, s.v, models.MaxTextLen); err != nil {
			return bad(err)
		}
	}
	if err := validateSecretRefs(params+".secrets", p.Secrets); err != nil {
		return bad(err)
	}
	if t.IsMarker() {
		return nil
	}
	switch t.Kind() {
	case plan.TypeShell:
		// A task without a type and command is a placeholder that runs
		// nothing; one that says it is a shell task must say what to run.
		if t.Type == plan.TypeShell && strings.TrimSpace(p.Cmd) == "" {
			return bad(models.Invalid(params+".cmd", "a shell task needs a command"))
		}
	case TaskUploadFile:
		if err := models.ValidRelPath(params+".path", p.Path); err != nil {
			return bad(err)
		}
		if p.Permissions != "" && !octalMode.MatchString(p.Permissions) {
			return bad(models.Invalid(params+".permissions", "%q is not an octal mode like 0644", models.Clip(p.Permissions)))
		}
	case TaskSync:
		if err := models.ValidRelPath(params+".src", p.Src); err != nil {
			return bad(err)
		}
		if err := models.ValidRelPath(params+".dst", p.Dst); err != nil {
			return bad(err)
		}
	case TaskMasterShell:
		if strings.TrimSpace(p.Cmd) == "" {
			return bad(models.Invalid(params+".cmd", "a master_shell task needs a command"))
		}
	}
	if err := models.OneOf(params+".jig", p.Jig, "", JigAgent, JigSSH); err != nil {
		return bad(err)
	}
	// What the run would execute: the same rules planning applies.
	if _, err := runSpec(t); err != nil {
		return bad(models.Invalid(field, "%v", err))
	}
	return nil
}
