package codec

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/anneal-dev/anneal/models/secrets"
)

func TestCodecEncryptsAndPassesPlainPayloadsThrough(t *testing.T) {
	keys, err := secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	dc := DataConverter(keys)
	p, err := dc.ToPayload(map[string]string{"password": "hunter22-value"})
	require.NoError(t, err)
	assert.Equal(t, Encoding, string(p.Metadata[converter.MetadataEncoding]))
	assert.NotContains(t, string(p.Data), "hunter22-value")

	var back map[string]string
	require.NoError(t, dc.FromPayload(p, &back))
	assert.Equal(t, "hunter22-value", back["password"])

	// A plain payload (a history recorded before encryption) decodes.
	plain, err := converter.GetDefaultDataConverter().ToPayload("old")
	require.NoError(t, err)
	var s string
	require.NoError(t, dc.FromPayload(plain, &s))
	assert.Equal(t, "old", s)

	// Another keyring cannot read it.
	other, err := secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	assert.Error(t, DataConverter(other).FromPayload(p, &back))
}

func TestCodecHandlerDecodes(t *testing.T) {
	keys, err := secrets.ParseKeys(secrets.GenerateKey())
	require.NoError(t, err)
	p, err := DataConverter(keys).ToPayload("visible to operators")
	require.NoError(t, err)
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: []*commonpb.Payload{p}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	Handler(keys).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/v1/codec/decode", bytes.NewReader(body)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var out commonpb.Payloads
	require.NoError(t, protojson.Unmarshal(rec.Body.Bytes(), &out))
	require.Len(t, out.Payloads, 1)
	assert.True(t, strings.Contains(string(out.Payloads[0].Data), "visible to operators"))
}
