package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
)

// fieldAnnotation prefixes a command annotation mapping an API request
// field onto the flag or argument that sets it, e.g. "field:graphs[0].type"
// → "--type", so that an API error can say which flag to fix.
const fieldAnnotation = "field:"

// fieldFlags returns the annotations mapping API fields to flags.
func fieldFlags(pairs ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[fieldAnnotation+pairs[i]] = pairs[i+1]
	}
	return m
}

// describe renders any error as one line: what went wrong, the field the
// server named, and what to do about it.
func describe(err error, cmd *cobra.Command) string {
	var ae *APIError
	var ce *ConnError
	var line string
	switch {
	case errors.As(err, &ae):
		line = describeAPI(ae, cmd)
	case errors.As(err, &ce):
		line = fmt.Sprintf("%v; is the server running? Check --url, %s or 'anneal login'", ce, EnvURL)
	case errors.Is(err, context.Canceled):
		line = "interrupted"
	default:
		line = err.Error()
	}
	return oneLine(line)
}

func describeAPI(e *APIError, cmd *cobra.Command) string {
	msg := e.Error()
	field := e.Field()
	var hint string
	switch {
	case e.RouteMissing():
		return fmt.Sprintf("this server has no %s %s endpoint; it is older than this CLI: upgrade the server", e.Method, stripQuery(e.Path))
	case field != "":
		flag := flagFor(cmd, field)
		if flag != "" {
			hint = "fix " + flag
		} else {
			hint = "fix the value of " + field
		}
		if !strings.Contains(msg, field) {
			msg = field + ": " + msg
		}
		return fmt.Sprintf("%s (field %s; %s)", msg, field, hint)
	case e.Status == http.StatusUnauthorized:
		hint = fmt.Sprintf("check the token: set %s, pass --token, or run 'anneal login'", EnvToken)
	case e.Status == http.StatusForbidden:
		hint = "this token's scope may not do that: use an admin token"
	case e.Status == http.StatusNotFound:
		hint = "check the name or id ('anneal nodes', 'anneal status', 'anneal tx list' list them)"
	case e.Status == http.StatusConflict:
		hint = "the current state does not allow it: wait for or change what it names, then try again"
	case e.Status == http.StatusServiceUnavailable:
		hint = "a service behind the API is unavailable: try again shortly"
	case e.Status >= 500:
		hint = "a server fault: see the server's log"
	default:
		hint = fmt.Sprintf("%s %s answered HTTP %d", e.Method, stripQuery(e.Path), e.Status)
	}
	return msg + " (" + hint + ")"
}

// flagFor finds the flag mapped to an API field on the command, trying the
// field itself and then its prefixes (graphs[0].nodes[2] → graphs[0].nodes).
func flagFor(cmd *cobra.Command, field string) string {
	if cmd == nil {
		return ""
	}
	for f := field; f != ""; {
		if flag, ok := cmd.Annotations[fieldAnnotation+f]; ok {
			return flag
		}
		i := strings.LastIndexAny(f, ".[")
		if i <= 0 {
			break
		}
		f = f[:i]
	}
	return ""
}

func stripQuery(p string) string {
	if i := strings.IndexByte(p, '?'); i >= 0 {
		return p[:i]
	}
	return p
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
