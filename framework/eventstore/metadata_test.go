package eventstore_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// metadataSeeds are shapes the fast path takes and shapes it must leave to
// encoding/json.
var metadataSeeds = []string{
	`{}`,
	` { } `,
	`{"userId": "alice", "requestId": "r-1", "causationId": "42", "correlationId": "c-1", "idempotencyKey": "k"}`,
	`{"idempotencyKey": "k", "idempotencyOwner": "o-2", "idempotencyReclaimedFrom": "o-1"}`,
	`{"idempotencyowner": "case-insensitive match"}`,
	`{"userId":"alice","userId":"bob"}`,
	`{"userid": "case-insensitive match"}`,
	`{"USERID": "x", "unknown": 1}`,
	`{"userId": "esc\"aped\\n", "requestId": "\u00e9"}`,
	`{"userId": "ünïcödé ✓"}`,
	"{\"userId\": \"bad \xff utf8\"}",
	`{"userId": null}`,
	`{"userId": 7}`,
	`{"userId": "a",}`,
	`{"userId": "a"} x`,
	`{"userId" "a"}`,
	`[]`,
	`null`,
	``,
	`{"userId": "a", "nested": {"userId": "b"}}`,
	"{\"userId\": \"tab\there\"}",
}

// scanLikeJSON compares ScanBytes with encoding/json on one input.
func scanLikeJSON(t *testing.T, in []byte) {
	var want eventstore.Metadata
	wantErr := json.Unmarshal(in, &want)
	var got eventstore.Metadata
	gotErr := got.ScanBytes(in)
	if wantErr != nil {
		require.Error(t, gotErr, "input %q", in)
		return
	}
	require.NoError(t, gotErr, "input %q", in)
	require.Equal(t, want, got, "input %q", in)
}

func TestMetadataScanMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range metadataSeeds {
		scanLikeJSON(t, []byte(s))
	}
	var m eventstore.Metadata
	require.Error(t, m.ScanBytes(nil), "NULL")
}

func FuzzMetadataScan(f *testing.F) {
	for _, s := range metadataSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { scanLikeJSON(t, in) })
}

// TestMetadataRoundTrip reads metadata back through pgx (binary jsonb),
// including values the fast path hands to encoding/json.
func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	metas := []eventstore.Metadata{
		{},
		{UserID: "alice", RequestID: "r-1", CorrelationID: "c-1", CausationID: "7", IdempotencyKey: "k-1"},
		{UserID: "alice", IdempotencyKey: "k-2", IdempotencyOwner: "o-2", IdempotencyReclaimedFrom: "o-1"},
		{UserID: "quote \" back\\slash \n newline", CorrelationID: "ünïcödé"},
	}
	stream := eventstore.StreamRef{TenantID: "t1", Type: "s", ID: "meta"}
	evs := make([]eventstore.NewEvent, len(metas))
	for i, m := range metas {
		evs[i] = eventstore.NewEvent{Type: "test:event:noted", Payload: json.RawMessage(`{}`), Metadata: m}
	}
	_, err := eventstore.Append(ctx, db.Pool, stream, eventstore.AnyVersion, evs)
	require.NoError(t, err)
	recs, err := eventstore.ReadStream(ctx, db.Pool, stream, eventstore.AsOf{})
	require.NoError(t, err)
	require.Len(t, recs, len(metas))
	for i, r := range recs {
		require.Equal(t, metas[i], r.Metadata)
	}
}
