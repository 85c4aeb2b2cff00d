// Package codec encrypts every Temporal payload anneal writes: a
// converter.PayloadCodec sealing each payload with the keyring's first key
// (AES-256-GCM), the data converter and failure converter built on it for
// every Temporal client, and the codec server handler that lets an
// authorised operator read payloads in the Temporal Web UI.
package codec

import (
	"fmt"
	"net/http"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"

	"github.com/anneal-dev/anneal/models/secrets"
)

// Metadata of an encrypted payload.
const (
	// Encoding is the encoding an encrypted payload declares; a payload
	// with another encoding is not this codec's and passes through.
	Encoding = "binary/encrypted"
	// MetadataKeyID names the key that sealed the payload.
	MetadataKeyID = "encryption-key-id"
)

// aad binds a payload's ciphertext to this use of the key.
var aad = []byte("anneal temporal payload")

// Codec is the PayloadCodec: Encode seals each whole payload (its metadata
// and data, as protobuf) with the keyring's first key; Decode opens the
// payloads it sealed and leaves any other payload as it is, so that
// histories written before encryption (or by plain test clients) still
// decode.
type Codec struct {
	Keys *secrets.Keyring
}

var _ converter.PayloadCodec = (*Codec)(nil)

// Encode implements converter.PayloadCodec.
func (c *Codec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		plain, err := proto.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		id, sealed, err := c.Keys.Seal(plain, aad)
		if err != nil {
			return nil, fmt.Errorf("encrypt payload: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				converter.MetadataEncoding: []byte(Encoding),
				MetadataKeyID:              []byte(id),
			},
			Data: sealed,
		}
	}
	return out, nil
}

// Decode implements converter.PayloadCodec.
func (c *Codec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if string(p.GetMetadata()[converter.MetadataEncoding]) != Encoding {
			out[i] = p // not ours: a plain payload passes through
			continue
		}
		plain, err := c.Keys.Open(string(p.Metadata[MetadataKeyID]), p.Data, aad)
		if err != nil {
			return nil, fmt.Errorf("decrypt payload: %w", err)
		}
		dec := &commonpb.Payload{}
		if err := proto.Unmarshal(plain, dec); err != nil {
			return nil, fmt.Errorf("decode decrypted payload: %w", err)
		}
		out[i] = dec
	}
	return out, nil
}

// DataConverter is the SDK's default data converter with every payload
// going through Codec. A nil keyring gives the default converter (plain
// payloads): only for tools reading unencrypted histories.
func DataConverter(keys *secrets.Keyring) converter.DataConverter {
	if keys == nil {
		return converter.GetDefaultDataConverter()
	}
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), &Codec{Keys: keys})
}

// FailureConverter encodes failure messages and stack traces with the data
// converter too (they may quote what a task printed), so that histories
// hold no plain text of a run's errors either.
func FailureConverter(keys *secrets.Keyring) converter.FailureConverter {
	if keys == nil {
		return temporal.GetDefaultFailureConverter()
	}
	return temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{
		DataConverter: DataConverter(keys), EncodeCommonAttributes: true,
	})
}

// Handler serves the Temporal codec server protocol (POST .../encode and
// .../decode with a JSON Payloads body) with Codec. Authorisation and CORS
// are the caller's.
func Handler(keys *secrets.Keyring) http.Handler {
	return converter.NewPayloadCodecHTTPHandler(&Codec{Keys: keys})
}
