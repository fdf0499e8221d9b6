package sse_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestRepeatedLastEventIDIsRefused: ?lastEventId=a&lastEventId=b is 400
// naming the parameter, not a resume from the first id.
func TestRepeatedLastEventIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.note(t, "acme", "memo", 1, "")
	b.note(t, "acme", "memo", 2, "")
	log := b.logOf(t, "acme")
	require.Len(t, log, 2)
	for _, q := range []string{"lastEventId=" + log[0] + "&lastEventId=" + log[1], "lastEventId=" + log[0] + "&lastEventId=" + log[0]} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, body, `"code":"bad_request"`, q)
		require.Contains(t, body, "lastEventId", q)
	}
}

// TestEmptyFilterListIsRefused: a types or streamTypes parameter that
// names nothing (only separators or blanks, or no value at all) is a 400,
// as a prune's empty types list is: a client whose list came out empty
// must not get every event type. An absent parameter is no filter.
func TestEmptyFilterListIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, q := range []string{"types=,,,", "types=", "types=%20,%20", "types=&types=,", "streamTypes=,", "streamTypes=",
		"types=orders:event:placed&streamTypes=,"} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, body, `"code":"validation_error"`, q)
		require.Contains(t, body, "names no", q)
	}
	for _, q := range []string{"", "types=orders:event:placed,,", "streamTypes=,memo", "types=orders:event:placed&types="} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusOK, code, "%s: %s", q, body)
	}
}

// TestRepeatedLastEventIDHeaderIsRefused: two Last-Event-ID headers are a
// 400 naming the header, as two lastEventId parameters are, not a resume
// from whichever came first.
func TestRepeatedLastEventIDHeaderIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.note(t, "acme", "memo", 1, "")
	b.note(t, "acme", "memo", 2, "")
	log := b.logOf(t, "acme")
	require.Len(t, log, 2)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req := b.newRequest(t, ctx, request{tenant: "acme", lastID: log[0]})
	req.Header.Add(sse.HeaderLastEventID, log[1])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "the stream resumed")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `"code":"bad_request"`)
	require.Contains(t, string(body), "Last-Event-ID")
}

// TestBlankLastEventIDIsRefused: ?lastEventId= given without a value (a
// page whose stored id came out empty, an unset variable in a script) is a
// 400 like any other id that names no event, as ?lastEventId=%20 is: it
// must not start a fresh stream at the present, which silently skips
// everything written since the client's real last event. Left out, the
// stream starts at the present.
func TestBlankLastEventIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, q := range []string{"lastEventId=", "lastEventId", "lastEventId=%20", "types=orders:event:placed&lastEventId="} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusBadRequest, code, "%s: the stream started at the present", q)
		require.Contains(t, body, `"code":"bad_request"`, q)
		require.Contains(t, body, "lastEventId", q)
	}
	code, body := b.status(t, request{tenant: "acme", query: "types=orders:event:placed"})
	require.Equal(t, http.StatusOK, code, body)
	// The header wins over the parameter, blank or not: an EventSource
	// opened with a blank one reconnects with the header.
	b.note(t, "acme", "memo", 1, "")
	b.note(t, "acme", "memo", 2, "")
	log := b.logOf(t, "acme")
	c := b.connect(t, request{tenant: "acme", query: "lastEventId=", lastID: log[0]})
	require.Equal(t, log[1:], ids(c.waitFor(t, 1)))
}
