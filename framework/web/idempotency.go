package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/idempotency"
)

// Header names of idempotent writes and read-your-writes.
const (
	// HeaderIdempotencyKey carries the client's idempotency key.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is "true" on a response replayed from the
	// idempotency store.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
	// HeaderConsistencyToken carries a write's consistency token in its
	// response, and back to the server in a query.
	HeaderConsistencyToken = "X-Kumiko-Consistency-Token"
)

// keyIdempotencyClaim stores the claim of a keyed write for [CallFrom].
const keyIdempotencyClaim = "kumiko.web.idempotency_claim"

// claimedKey is what [CallFrom] records of a claimed key in the events'
// metadata.
type claimedKey struct {
	key, owner, reclaimedFrom string
	// reclaimedSince is, for a key taken over, when it was first claimed,
	// at the earliest ([framework.Call].IdempotencyReclaimedSince).
	reclaimedSince time.Time
	claim          *idempotency.Claim
}

// finishTimeout bounds storing a response in the idempotency store.
const finishTimeout = 5 * time.Second

// SetIdempotency sets [Config].Idempotency. Call it before the server
// serves requests.
func (s *Server) SetIdempotency(store *idempotency.Store) { s.idem = store }

// keyedBody is what the idempotency middleware reads of a write or batch
// body: the key and what the fingerprint covers.
type keyedBody struct {
	RequestID *string          `json:"requestId"`
	Type      string           `json:"type"`
	Payload   json.RawMessage  `json:"payload"`
	Commands  []commandRequest `json:"commands"`
}

// idempotent is the route middleware of POST /api/write and /api/batch
// (after authentication). The key is the Idempotency-Key header or the
// body's requestId (both present and different: 400 bad_request), scoped
// by the caller's tenant and user. The first request with a key runs and
// its response (status, headers, body; success or failure) is stored; a
// later one with the same fingerprint (route, and type and payload of
// every command) gets that response byte for byte with Idempotent-Replayed:
// true, one running concurrently waits for it, one with another
// fingerprint is 422 idempotency_key_reused. A keyed request that cannot
// reach the store is 503 idempotency_unavailable and does not run. Once
// claimed, the request runs to the end even when the client goes away, so
// that its retry finds the outcome. The response is stored in the
// background while the client gets it ([idempotency.Claim.FinishAsync]);
// a duplicate arriving meanwhile waits for it. A 503 and the 409 of a
// deadlock or serialization failure (nothing committed) are not stored: the
// claim is released for a retry. The 500 of a write whose outcome is
// unknown ([framework.ErrCommitOutcomeUnknown]) is not stored either, and
// the claim is left to run out, so that the retry after it looks for the
// write's events first (unlessCommitted).
func (s *Server) idempotent(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.idem == nil {
			return next(c)
		}
		req := c.Request()
		body, err := readBody(c, s.bodyLimit)
		if err != nil {
			return err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		if len(req.Header.Values(HeaderIdempotencyKey)) > 1 {
			// Which one the client meant is unknown; running under either
			// could replay another request's answer.
			return &framework.Error{Code: framework.CodeBadRequest,
				Message: "the request has more than one Idempotency-Key header; send one Idempotency-Key"}
		}
		header := req.Header.Get(HeaderIdempotencyKey)
		var kb keyedBody
		parsed := json.Unmarshal(body, &kb) == nil
		key := header
		// A key given empty is refused like any invalid key: the client
		// meant to be protected, and running unkeyed would not protect it.
		keyed := len(req.Header.Values(HeaderIdempotencyKey)) == 1
		if parsed && kb.RequestID != nil {
			if keyed && header != *kb.RequestID {
				return &framework.Error{Code: framework.CodeBadRequest,
					Message: "the Idempotency-Key header and the body's requestId differ; send one key",
					Details: map[string]any{"header": shownKey(header), "requestId": shownKey(*kb.RequestID)}}
			}
			key, keyed = *kb.RequestID, true
		}
		if !keyed {
			return next(c)
		}
		if !idempotency.ValidKey(key) {
			return &framework.Error{Code: framework.CodeBadRequest,
				Message: fmt.Sprintf("an idempotency key must be 1 to %d printable ASCII characters without spaces", idempotency.MaxKeyLength)}
		}
		if !parsed {
			// Not a JSON object: the handler answers 400 and runs nothing.
			return next(c)
		}
		fp, err := fingerprint(c.Path(), kb)
		if err != nil {
			return next(c) // a malformed payload: the handler answers 400
		}
		p, _ := PrincipalFrom(c)
		claim, replay, err := s.idem.Begin(req.Context(), idempotency.Scope{TenantID: p.TenantID, UserID: p.UserID, Key: key}, fp)
		switch {
		case errors.Is(err, idempotency.ErrKeyReused):
			return &framework.Error{Code: framework.CodeIdempotencyKeyReused,
				Message: "this idempotency key was used for a different request (type or payload differ); use a new key",
				Details: map[string]any{"idempotencyKey": key}}
		case errors.Is(err, idempotency.ErrInProgress):
			return &framework.Error{Code: framework.CodeConflict,
				Message: "a request with this idempotency key is still in progress; retry later",
				Details: map[string]any{"idempotencyKey": key}}
		case errors.Is(err, idempotency.ErrUnavailable):
			return &framework.Error{Code: framework.CodeIdempotencyUnavailable,
				Message: "the idempotency store is unavailable; the request was not executed, retry later", Err: err}
		case err != nil:
			return err
		}
		if replay != nil {
			return s.replay(c, key, replay)
		}
		var reclaimedSince time.Time
		if claim.PreviousOwner() != "" {
			reclaimedSince = time.Now().Add(-s.reclaimWindow(claim))
			if next, err = s.unlessCommitted(c, next, claim, p, key); err != nil {
				return err
			}
		}
		return s.runClaimed(c, next, claim, key, reclaimedSince)
	}
}

// shownKey bounds how much of a client's key an error repeats: a valid key
// whole, a longer value cut (a megabyte of requestId is not echoed).
func shownKey(k string) string {
	if len(k) > idempotency.MaxKeyLength {
		return k[:idempotency.MaxKeyLength] + "..."
	}
	return k
}

// committedCheckTimeout bounds unlessCommitted's query; committedCheckMargin
// widens the span it searches.
const (
	committedCheckTimeout = 10 * time.Second
	committedCheckMargin  = 5 * time.Second
)

// unlessCommitted guards a keyed request whose claim was taken over from
// an owner that died (its lease ran out, as when its process was killed):
// that owner may have committed the write and died before its response
// was stored. The events carry the key in their metadata, so when the
// events table holds any of this caller's with the key, the write is not
// run again: the request is answered (and the key finished with) 409
// conflict, whose details list those events. Otherwise next runs. When the
// database cannot say, the request is answered 503 and the claim is left
// to run out (not released: a fresh claim would run without this check),
// so a retry after the lease asks again.
func (s *Server) unlessCommitted(c echo.Context, next echo.HandlerFunc, claim *idempotency.Claim, p framework.Principal, key string) (echo.HandlerFunc, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), committedCheckTimeout)
	defer cancel()
	evs, err := s.rt.KeyedEvents(ctx, p, key, s.reclaimWindow(claim))
	if err != nil {
		claim.Abandon()
		return nil, err
	}
	if len(evs) == 0 {
		return next, nil
	}
	s.logger.Warn("idempotent write committed by a dead owner is not run again", "request_id", RequestID(c),
		"idempotency_key", key, "previous_owner", claim.PreviousOwner(), "events", len(evs))
	return func(echo.Context) error {
		return &framework.Error{Code: framework.CodeConflict,
			Message: "a request with this idempotency key was committed, but its response was never stored (the process " +
				"that ran it stopped, or lost its database connection while committing); it is not run again " +
				"(details list the events it committed)",
			Details: map[string]any{"idempotencyKey": key, "committed": true, "events": evs}}
	}, nil
}

// reclaimWindow is the span before now in which the previous owners of a
// key taken over may have committed: a dead owner committed, if at all,
// after the first owner claimed the key, so the events of that span (plus
// a margin for the time between Redis's clock reading and Postgres's) are
// all to look at, not a TTL's worth.
func (s *Server) reclaimWindow(claim *idempotency.Claim) time.Duration {
	if since := claim.PreviousSince(); since > 0 {
		return since + committedCheckMargin
	}
	return s.idem.TTL()
}

// fingerprint hashes the route and every command's type and canonical
// payload (object keys sorted, insignificant white space dropped).
func fingerprint(route string, kb keyedBody) (string, error) {
	parts := [][]byte{[]byte(route)}
	add := func(typ string, payload json.RawMessage) error {
		canon, err := canonicalJSON(payload)
		if err != nil {
			return err
		}
		parts = append(parts, []byte(typ), canon)
		return nil
	}
	if err := add(kb.Type, kb.Payload); err != nil {
		return "", err
	}
	for _, cmd := range kb.Commands {
		if err := add(cmd.Type, cmd.Payload); err != nil {
			return "", err
		}
	}
	return idempotency.Fingerprint(parts...), nil
}

// canonicalJSON re-encodes a JSON value with sorted object keys; numbers
// keep their literal text. An absent payload is "null". A value with an
// object whose keys differ only in case is compacted instead, keeping its
// key order: the handler's decoder matches keys case-insensitively (the
// last one wins), so that order is part of the request.
func canonicalJSON(raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if hasCaseVariantKeys(v) {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	return json.Marshal(v)
}

// hasCaseVariantKeys reports whether an object in v has two keys that
// encoding/json takes for the same field (equal under Unicode case
// folding).
func hasCaseVariantKeys(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		seen := make(map[string]bool, len(v))
		for k, e := range v {
			f := foldKey(k)
			if seen[f] || hasCaseVariantKeys(e) {
				return true
			}
			seen[f] = true
		}
	case []any:
		for _, e := range v {
			if hasCaseVariantKeys(e) {
				return true
			}
		}
	}
	return false
}

// foldKey maps k to one representative of the strings equal to it under
// simple Unicode case folding (strings.EqualFold): each rune becomes the
// smallest rune of its folding orbit.
func foldKey(k string) string {
	var b strings.Builder
	for _, r := range k {
		low := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			low = min(low, f)
		}
		b.WriteRune(low)
	}
	return b.String()
}

// replay answers with a stored response.
func (s *Server) replay(c echo.Context, key string, r *idempotency.Response) error {
	h := c.Response().Header()
	for k, vs := range r.Header {
		h[k] = vs
	}
	h.Set(HeaderIdempotentReplayed, "true")
	s.logger.Info("idempotent replay", "request_id", RequestID(c), "correlation_id", CorrelationID(c),
		"idempotency_key", key, "status", r.Status)
	c.Response().WriteHeader(r.Status)
	_, err := c.Response().Write(r.Body)
	return err
}

// unreplayed lists the response headers that belong to one exchange and
// are never stored.
var unreplayed = []string{HeaderRequestID, HeaderCorrelationID, "Content-Length", "Date", "Set-Cookie", HeaderIdempotentReplayed}

// runClaimed runs the request under its claim, stores its response and
// sends it.
func (s *Server) runClaimed(c echo.Context, next echo.HandlerFunc, claim *idempotency.Claim, key string, reclaimedSince time.Time) error {
	c.Set(keyIdempotencyClaim, claimedKey{key: key, owner: claim.Owner(), reclaimedFrom: claim.PreviousOwner(),
		reclaimedSince: reclaimedSince, claim: claim})
	if s.logger.Enabled(c.Request().Context(), slog.LevelDebug) {
		s.logger.Debug("idempotency key claimed", "request_id", RequestID(c), "idempotency_key", key,
			"owner", claim.Owner(), "previous_owner", claim.PreviousOwner())
	}
	res := c.Response()
	orig := res.Writer
	rec := &recorder{header: orig.Header()}
	res.Writer = rec
	req := c.Request()
	// The client may go away: the request still runs to its end, so that
	// its retry finds the outcome instead of a half-known state.
	detached := context.WithoutCancel(req.Context())
	c.SetRequest(req.WithContext(detached))
	abort, herr := callRecovering(c, next)
	unknown := errors.Is(herr, framework.ErrCommitOutcomeUnknown)
	if unknown {
		herr = &framework.Error{Code: framework.CodeInternal, Err: herr,
			Message: "the database connection was lost while the write was committing: whether it committed is unknown; " +
				"retry with the same Idempotency-Key: once this request's claim has run out, the retry answers " +
				"409 conflict listing the write's events if it committed, and runs it otherwise",
			Details: map[string]any{"idempotencyKey": key}}
	}
	if abort == nil && herr != nil {
		// Rendered into the recorder, so that failures are stored too.
		if werr := WriteError(c, herr); werr != nil {
			s.logger.Warn("write error response", "request_id", RequestID(c), "error", werr)
		}
	}
	res.Writer = orig
	c.SetRequest(req)
	if abort != nil {
		s.releaseClaim(c, claim, key)
		panic(abort)
	}
	status := res.Status
	if !res.Committed {
		status = http.StatusOK
	}
	switch {
	case unknown:
		// Whether the write committed is unknown: its answer must not be
		// replayed, and the key must not be freed for a retry that would
		// run the write again. The claim is left to run out, as a dead
		// owner's: the next request with the key takes it over and looks
		// for the write's events first (unlessCommitted).
		// (WriteError logged it.)
		claim.Abandon()
	case status == http.StatusServiceUnavailable || transientConflict(herr):
		// Nothing committed (the database or a dependency was down, or
		// Postgres rolled the transaction back as a deadlock victim or on
		// a serialization failure, answered "retry"): a retry with the same
		// key should run, not replay the failure.
		s.releaseClaim(c, claim, key)
	default:
		stored := http.Header{}
		for k, vs := range orig.Header() {
			stored[k] = append([]string(nil), vs...)
		}
		for _, k := range unreplayed {
			stored.Del(k)
		}
		// Stored in the background: the client gets its answer without
		// waiting for Redis, a duplicate meanwhile waits for the result.
		rid, owner := RequestID(c), claim.Owner()
		claim.FinishAsync(idempotency.Response{Status: status, Header: stored, Body: rec.body.Bytes()}, func(err error) {
			switch {
			case errors.Is(err, idempotency.ErrNotOwner):
				s.logger.Warn("idempotency result not stored: the claim was taken over by a newer owner",
					"request_id", rid, "idempotency_key", key, "owner", owner)
			case err != nil:
				s.logger.Error("idempotency result not stored", "request_id", rid, "idempotency_key", key, "error", err)
			}
		})
	}
	orig.WriteHeader(status)
	// A write error means the client went away; its retry replays the
	// stored response.
	_, _ = orig.Write(rec.body.Bytes())
	return nil
}

// transientConflict reports whether err is a deadlock or a serialization
// failure of Postgres: the transaction was rolled back, and the same
// request may well succeed when retried.
func transientConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

func (s *Server) releaseClaim(c echo.Context, claim *idempotency.Claim, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), finishTimeout)
	defer cancel()
	if err := claim.Release(ctx); err != nil {
		s.logger.Warn("idempotency claim not released", "request_id", RequestID(c), "idempotency_key", key, "error", err)
	}
}

// callRecovering runs next, turning a panic into a *panicError (rendered
// and stored as an internal error like any other); http.ErrAbortHandler is
// returned as abort, to be re-panicked.
func callRecovering(c echo.Context, next echo.HandlerFunc) (abort any, err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // net/http compares it by identity too
				abort = v
				return
			}
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return nil, next(c)
}

// recorder is the http.ResponseWriter of a claimed request: it keeps the
// body, and shares the header map of the real writer.
type recorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(int)             {}
