package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawPost is b.post for goroutines: it reports failures instead of
// stopping the test.
func (b *bundle) rawPost(path, token string, body any) (int, []byte, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(http.MethodPost, b.url+path, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := b.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	return res.StatusCode, out, err
}

// Concurrent cancels of one order at the same expected version: exactly one
// wins, every other one is a 409 version_conflict (never a 500, never a
// second cancellation event).
func TestConcurrentCancelsOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	id := b.place(t, tok, "Ada")
	const writers = 24
	type result struct {
		status int
		code   string
		err    error
	}
	results := make(chan result, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			status, body, err := b.rawPost("/api/write", tok, map[string]any{"type": "orders:write:cancel",
				"payload": map[string]any{"orderId": id, "expectedVersion": 1}})
			var env envelope
			if err == nil && status != http.StatusOK {
				err = json.Unmarshal(body, &env)
			}
			results <- result{status, env.Error.Code, err}
		})
	}
	wg.Wait()
	close(results)
	won := 0
	for r := range results {
		require.NoError(t, r.err)
		if r.status == http.StatusOK {
			won++
			continue
		}
		require.Equal(t, http.StatusConflict, r.status)
		require.Equal(t, "version_conflict", r.code)
	}
	require.Equal(t, 1, won)
	b.requireRows(t, 1, 2)
}

// Concurrent batches commit all of their commands or none: a batch whose
// last command is invalid leaves no row and no event, the others leave all
// of theirs.
func TestConcurrentBatchesAreAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	const batches = 30
	errs := make(chan error, batches)
	var wg sync.WaitGroup
	for i := range batches {
		wg.Go(func() {
			last := map[string]any{"customer": "ok", "amountCents": 1}
			if i%2 == 1 {
				last = map[string]any{"customer": "", "amountCents": 1}
			}
			status, body, err := b.rawPost("/api/batch", tok, map[string]any{"commands": []any{
				placeBody(map[string]any{"customer": "a", "amountCents": 1}),
				placeBody(map[string]any{"customer": "b", "amountCents": 1}),
				placeBody(last),
			}})
			switch {
			case err != nil:
			case i%2 == 0 && status != http.StatusOK, i%2 == 1 && status != http.StatusBadRequest:
				err = fmt.Errorf("batch %d: status %d: %s", i, status, body)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	b.requireRows(t, 3*batches/2, 3*batches/2)
}

// A handler that panics or fails after writing a row and flushing its event
// leaves nothing behind, and the server (and its pool) goes on serving.
func TestHandlerFailingAfterWritingPersistsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	for range 8 { // more than the pool's connections: none may leak
		b.post(t, "/api/write", tok, map[string]any{"type": "web-test:write:write-then-panic", "payload": map[string]any{}}).
			requireError(t, http.StatusInternalServerError, "internal")
		b.post(t, "/api/write", tok, map[string]any{"type": "web-test:write:write-then-fail", "payload": map[string]any{}}).
			requireError(t, http.StatusUnprocessableEntity, "unprocessable")
		b.post(t, "/api/batch", tok, map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "a", "amountCents": 1}),
			map[string]any{"type": "web-test:write:write-then-panic", "payload": map[string]any{}},
		}}).requireError(t, http.StatusInternalServerError, "internal")
	}
	b.requireRows(t, 0, 0)
	require.Zero(t, b.count(t, "streams"))
	b.place(t, tok, "Ada")
	b.requireRows(t, 1, 1)
}
