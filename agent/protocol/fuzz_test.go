package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/anneal-dev/anneal/agent/protocol"
)

// decodeStrict decodes one JSON value the way the API reads an agent's
// body (web's bindStrict): unknown fields refused, nothing after the value.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// checkDecodeError checks that a refused body says where or what: a byte
// offset inside the body, the field of a type mismatch or the unknown
// field's name, the end of the body, or the time value that did not parse.
func checkDecodeError(t *testing.T, data []byte, err error) {
	t.Helper()
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var perr *time.ParseError
	switch {
	case errors.As(err, &syntax):
		if syntax.Offset < 0 || syntax.Offset > int64(len(data)) {
			t.Fatalf("syntax error offset %d outside the body of %d bytes", syntax.Offset, len(data))
		}
	case errors.As(err, &typ):
		if typ.Field == "" && (typ.Offset <= 0 || typ.Offset > int64(len(data))) {
			t.Fatalf("type error %v names neither a field nor an offset inside the body", err)
		}
	case strings.HasPrefix(err.Error(), "json: unknown field \""):
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
	case errors.As(err, &perr):
		if perr.Value == "" && len(bytes.TrimSpace(data)) == 0 {
			t.Fatalf("time error %v without the value", err)
		}
	case err.Error() == "trailing data after the JSON value":
	default:
		t.Fatalf("decode error %T %v says neither where nor which field", err, err)
	}
}

// FuzzRunResult decodes result bodies as the API does. A refused body gets
// an error naming a position or field; an accepted one either fails
// Validate with a *FieldError naming a field of RunResult, or encodes and
// decodes back to the same result.
func FuzzRunResult(f *testing.F) {
	for _, s := range []string{
		// What the agent sends (agent/daemon), a noderole run's attrs, errors.
		`{"attempt":1,"exit_code":0,"stdout_tail":"ok\n","stderr_tail":"","outputs":{"url":"http://n1:8080"},"started_at":"2024-05-01T10:00:00Z","finished_at":"2024-05-01T10:00:02.5+02:00"}`,
		`{"attempt":2,"exit_code":1,"stdout_tail":"","stderr_tail":"boom","error":"timed out after 60s","started_at":"2024-05-01T10:00:00Z","finished_at":"2024-05-01T10:01:00Z"}`,
		`{"attempt":1,"exit_code":0,"attrs":{"db":{"url":"postgres://n1:5432/sample"}},"started_at":"0001-01-01T00:00:00Z","finished_at":"0001-01-01T00:00:00Z"}`,
		`{"attempt":1,"attrs":[1,2]}`,
		`{"attempt":1,"attrs":null}`,
		`{"attempt":"1"}`,
		`{"attempt":1,"bogus":true}`,
		`{"outputs":{"k":1}}`,
		`{"started_at":"2024-05-01T10:00:00+24:00"}`,
		`{"started_at":"yesterday"}`,
		`{"exit_code":1e400}`,
		`{"stdout_tail":"\u0000\ud800 invalid \xff"}`,
		`{} {}`,
		`[]`,
		`null`,
		``,
		`{"attempt":1`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var res protocol.RunResult
		if err := decodeStrict(data, &res); err != nil {
			checkDecodeError(t, data, err)
			return
		}
		if err := res.Validate(); err != nil {
			var fe *protocol.FieldError
			if !errors.As(err, &fe) || !hasJSONField(reflect.TypeFor[protocol.RunResult](), fe.Field) || fe.Reason == "" {
				t.Fatalf("Validate error %#v does not name a field of the result", err)
			}
			return
		}
		out, err := json.Marshal(res)
		if err != nil {
			t.Fatalf("a valid result does not encode: %v", err)
		}
		var back protocol.RunResult
		if err := decodeStrict(out, &back); err != nil {
			t.Fatalf("the encoded result %s does not decode: %v", out, err)
		}
		// Encoding compacts raw attrs; compare them as compacted JSON.
		res.Attrs, back.Attrs = compact(t, res.Attrs), compact(t, back.Attrs)
		if !res.StartedAt.Equal(back.StartedAt) || !res.FinishedAt.Equal(back.FinishedAt) {
			t.Fatalf("times changed in a round trip: %v %v -> %v %v", res.StartedAt, res.FinishedAt, back.StartedAt, back.FinishedAt)
		}
		res.StartedAt, res.FinishedAt, back.StartedAt, back.FinishedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !reflect.DeepEqual(res, back) {
			t.Fatalf("round trip changed the result:\n%#v\n%#v", res, back)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("a valid result is invalid after a round trip: %v", err)
		}
	})
}

// hasJSONField reports whether typ has a field with this JSON name.
func hasJSONField(typ reflect.Type, name string) bool {
	for f := range typ.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return true
		}
	}
	return false
}

func compact(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if raw == nil {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		t.Fatalf("decoded attrs are not JSON: %v", err)
	}
	return buf.Bytes()
}

// FuzzSoftwareSignal decodes software signals (the flat Heat form). A
// refused signal names the reserved key of the wrong type or is malformed
// JSON; an accepted one encodes to a form that decodes to the same signal
// and encodes to the same bytes again (one round trip reaches a fixpoint).
func FuzzSoftwareSignal(f *testing.F) {
	for _, s := range []string{
		`{"deploy_stdout":"done","deploy_stderr":"","deploy_status_code":0,"result":"ok"}`,
		`{"deploy_stdout":"","deploy_stderr":"boom","deploy_status_code":"1","deploy_status_reason":"failed","deploy_round":2}`,
		`{"deploy_status_code":" 3 ","n":42,"f":1.5,"big":1e400,"neg":-0.0,"one":1.0,"nested":{"a":[1,2.0,null]}}`,
		`{"deploy_status_code":1.5}`,
		`{"deploy_stdout":7}`,
		`{"deploy_round":"x"}`,
		`{"deploy_status_code":99999999999999999999}`,
		`[]`,
		`null`,
		`{"a":1}{"b":2}`,
		`{"a":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var sig protocol.SoftwareSignal
		if err := json.Unmarshal(data, &sig); err != nil {
			msg := err.Error()
			var syntax *json.SyntaxError
			var typ *json.UnmarshalTypeError
			named := strings.Contains(msg, "must be") &&
				(strings.HasPrefix(msg, protocol.SignalStdout) || strings.HasPrefix(msg, protocol.SignalStderr) ||
					strings.HasPrefix(msg, protocol.SignalStatusCode) || strings.HasPrefix(msg, protocol.SignalStatusReason) ||
					strings.HasPrefix(msg, protocol.SignalRound) || strings.Contains(msg, "JSON object"))
			if !named && !errors.As(err, &syntax) && !errors.As(err, &typ) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("signal error %T %q names neither a key nor a position", err, msg)
			}
			return
		}
		out, err := json.Marshal(sig)
		if err != nil {
			t.Fatalf("a decoded signal does not encode: %v", err)
		}
		var back protocol.SoftwareSignal
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("the encoded signal %s does not decode: %v", out, err)
		}
		if back.Stdout != sig.Stdout || back.Stderr != sig.Stderr || back.StatusCode != sig.StatusCode ||
			back.StatusReason != sig.StatusReason || back.Round != sig.Round || len(back.Outputs) != len(sig.Outputs) {
			t.Fatalf("round trip changed the signal:\n%#v\n%#v", sig, back)
		}
		again, err := json.Marshal(back)
		if err != nil || !bytes.Equal(out, again) {
			t.Fatalf("encoding is not stable after a round trip:\n%s\n%s (%v)", out, again, err)
		}
	})
}
