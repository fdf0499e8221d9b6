package sse

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/tenancy"
	"github.com/kumiko-go/kumiko/framework/web"
)

// Path is the route of the stream.
const Path = "/api/sse"

// Request parameters of the stream.
const (
	// HeaderLastEventID is the header a reconnecting EventSource sends.
	HeaderLastEventID = "Last-Event-ID"
	// QueryLastEventID is the query parameter for clients that cannot set
	// headers (a new EventSource created by page code); the header wins
	// when both are present.
	QueryLastEventID = "lastEventId"
)

// Mount adds GET [Path] to s, behind [web.Server.Authenticate].
func (h *Hub) Mount(s *web.Server) {
	s.Echo().GET(Path, h.Serve, s.Authenticate)
}

// Serve is the handler of GET /api/sse. The caller must be authenticated
// ([web.PrincipalFrom]); the tenant comes from the token only. It answers
// 400 for a bad filter, a malformed or foreign Last-Event-ID, or a
// lastEventId parameter given empty (without the header), 503 while the
// hub is not primed, after Close, when the resume id's check and the
// read of the opening frame's token (see [Open]) take longer than
// Config.ResumeWait, or when the database does not answer that read, and
// otherwise streams, opening with
// the [OpenEvent] frame, until the client goes away, the hub drops it, the
// hub closes, or the token expires ([web.TokenExpiry]: the stream ends
// normally and the client reconnects, with a fresh token or to a 401).
func (h *Hub) Serve(c echo.Context) error {
	p, ok := web.PrincipalFrom(c)
	if !ok || p.TenantID == "" {
		return &framework.Error{Code: framework.CodeUnauthorized, Message: "the event stream needs a token"}
	}
	req := c.Request()
	filter, err := ParseFilter(req.URL.Query(), h.reg)
	if err != nil {
		return err
	}
	queryID, err := web.QueryParam(c, QueryLastEventID)
	if err != nil {
		return err
	}
	if n := len(req.Header.Values(HeaderLastEventID)); n > 1 {
		return &framework.Error{Code: framework.CodeBadRequest,
			Message: fmt.Sprintf("the %s header is given %d times; send it once", HeaderLastEventID, n),
			Details: map[string]any{"header": HeaderLastEventID}}
	}
	var after eventstore.Cursor
	resume := false
	id := cmpOr(req.Header.Get(HeaderLastEventID), queryID)
	if _, given := req.URL.Query()[QueryLastEventID]; given && id == "" {
		// A page whose stored id came out empty: starting at the present
		// would skip, silently, everything since its real last event.
		return &framework.Error{Code: framework.CodeBadRequest,
			Message: "lastEventId is empty: send back an id this stream sent, or leave the parameter out to start at the present",
			Details: map[string]any{"lastEventId": ""}}
	}
	if id != "" {
		if after, err = ParseEventID(id); err != nil {
			return &framework.Error{Code: framework.CodeBadRequest,
				Message: "malformed Last-Event-ID: send back an id this stream sent", Details: map[string]any{"lastEventId": framework.Excerpt(id)}}
		}
		resume = true
	}
	// Close cancels it: a read the handler waits for must not hold the
	// server's shutdown up.
	ctx, release := h.withClose(req.Context())
	defer release()
	if err := h.waitReady(ctx); err != nil {
		return h.closedOr(err)
	}
	// The resume id's check and the opening token's read decide the
	// status, so the response cannot start (nor carry heartbeats) before
	// they end: bounded together, they leave no request silent until a
	// proxy cuts it.
	octx, cancel := context.WithTimeout(ctx, h.cfg.ResumeWait)
	defer cancel()
	if resume {
		err := h.checkCursor(octx, p.TenantID, filter, after)
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return &framework.Error{Code: framework.CodeUnavailable,
				Message: fmt.Sprintf("the event stream is busy: checking Last-Event-ID took longer than %s; retry", h.cfg.ResumeWait), Err: err}
		}
		if err != nil {
			return h.closedOr(err)
		}
	}

	w := c.Response()
	// The controller of the underlying writer: echo.Response.Flush swallows
	// errors.
	rc := http.NewResponseController(w.Writer)
	sub, err := h.subscribe(p.TenantID, filter, resume, func(d time.Time) { _ = rc.SetWriteDeadline(d) })
	if err != nil {
		return &framework.Error{Code: framework.CodeUnavailable, Message: "the event stream is shutting down", Err: err}
	}
	defer h.unsubscribe(sub)
	upTo := sub.from
	if upTo.Less(after) {
		upTo = after
	}
	token, err := h.openToken(octx, upTo)
	cancel()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return h.closedOr(ctx.Err())
		case octx.Err() != nil:
			return &framework.Error{Code: framework.CodeUnavailable,
				Message: fmt.Sprintf("the event stream is busy: opening it took longer than %s; retry", h.cfg.ResumeWait), Err: err}
		}
		return &framework.Error{Code: framework.CodeUnavailable, Message: "database unavailable", Err: err}
	}

	hd := w.Header()
	hd.Set(echo.HeaderContentType, "text/event-stream; charset=utf-8")
	hd.Set(echo.HeaderCacheControl, "no-cache")
	hd.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	// The connection's write deadline is ours now: never reuse it.
	hd.Set(echo.HeaderConnection, "close")
	hd.Set(web.HeaderConsistencyToken, token)
	w.WriteHeader(http.StatusOK)
	st := &stream{h: h, sub: sub, w: w, rc: rc, last: after}
	st.expires, _ = web.TokenExpiry(c)
	st.run(ctx, c, p.TenantID, filter, resume, token)
	select {
	case <-sub.gone: // dropped: the deadline already cuts the connection
	default:
		// Bound the final chunk net/http writes after we return.
		_ = rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
	}
	return nil
}

// run writes the stream (the retry hint and the opening frame with token,
// the replay when resuming, then live frames) until the client goes away,
// the hub drops it, the hub closes, or replay fails; the response has
// started, so whatever ends it, the handler just ends the response and the
// client resumes.
func (s *stream) run(ctx context.Context, c echo.Context, tenant string, f Filter, resume bool, token string) {
	if err := s.write([]byte("retry: "+strconv.FormatInt(s.h.cfg.Retry.Milliseconds(), 10)+"\n\n"), encodeOpen(token)); err != nil {
		return
	}
	if resume {
		stopBeats := s.beatDuringReplay(ctx)
		err := s.replay(ctx, tenant, f)
		stopBeats()
		if err != nil {
			switch {
			case errors.Is(err, errPrunedDuringReplay):
				s.h.log.Info("sse replay ended: a prune deleted events it had yet to send; the client's resume will be refused",
					"tenant_id", tenant, "request_id", web.RequestID(c))
			case ctx.Err() == nil && !errors.Is(err, errWrite) && !errors.Is(err, ErrClosed) && !errors.Is(err, errTokenExpired):
				s.h.log.Warn("sse replay failed", "tenant_id", tenant, "request_id", web.RequestID(c), "error", err)
			}
			return
		}
	}
	// Everything up to the subscription's position is sent (replayed) or
	// not wanted (a fresh client): from here on the hub's frames count.
	if s.last.Less(s.sub.from) {
		s.last = s.sub.from
	}
	s.live(ctx)
}

// replay replays the events after the client's cursor up to its
// subscription's position, and on in rounds while its queue overflowed
// during the previous one (see Hub.rejoin), until it can continue live.
func (s *stream) replay(ctx context.Context, tenant string, f Filter) error {
	upTo := s.sub.from
	for {
		if err := s.h.replay(ctx, tenant, f, s.last, upTo, s); err != nil {
			return err
		}
		// Everything up to upTo is sent or not wanted.
		if s.last.Less(upTo) {
			s.last = upTo
		}
		var again bool
		if upTo, again = s.h.rejoin(s.sub); !again {
			return nil
		}
	}
}

// beatDuringReplay writes a heartbeat every Config.Heartbeat until the
// returned stop is called (which waits for it to end). A replay may send
// nothing for long: its filter passes none of a backlog (or only internal
// and undeclared types are left), or a page's read is slow. Without
// heartbeats such a stream is idle to every proxy on its way, which cuts
// it, and the client, resuming from the same id, replays the same backlog
// again and never reaches the live part. The writes share the stream with
// the replay's (see stream.out).
func (s *stream) beatDuringReplay(ctx context.Context) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.h.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-s.h.done:
				return
			case <-s.sub.gone:
				return
			case <-t.C:
				if s.write(heartbeat) != nil {
					return
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// closedOr returns the 503 of a hub shutting down when Close ended the
// request (its context, or a wait for its turn to read), and err otherwise.
func (h *Hub) closedOr(err error) error {
	if h.isClosed() && (errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed)) {
		return &framework.Error{Code: framework.CodeUnavailable, Message: "the event stream is shutting down", Err: err}
	}
	return err
}

// waitReady waits for Prime, bounded by ReadyWait.
func (h *Hub) waitReady(ctx context.Context) error {
	select {
	case <-h.done:
		return &framework.Error{Code: framework.CodeUnavailable, Message: "the event stream is shutting down"}
	case <-h.ready:
		return nil
	default:
	}
	t := time.NewTimer(h.cfg.ReadyWait)
	defer t.Stop()
	select {
	case <-h.ready:
		return nil
	case <-h.done:
		return &framework.Error{Code: framework.CodeUnavailable, Message: "the event stream is shutting down"}
	case <-t.C:
		return &framework.Error{Code: framework.CodeUnavailable, Message: "the event stream is not ready yet; retry"}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkCursorSQL finds the event a cursor names, through the tenant's
// row-level security: another tenant's event is not found.
const checkCursorSQL = `SELECT commit_key FROM events WHERE position = $1`

// prunedAfterSQL reports whether a prune deleted an event of the tenant
// (row-level security) of types $3 and stream types $4 (NULL: any) after
// the cursor ($1, $2).
const prunedAfterSQL = `SELECT EXISTS (SELECT 1 FROM event_prune_marks
WHERE (commit_key, position) > ($1::xid8, $2::bigint) AND type = ANY($3)
  AND ($4::text[] IS NULL OR stream_type = ANY($4)))`

// checkCursor accepts a resume cursor only when it names an event of this
// log that the tenant can see: the event at its position exists, belongs to
// the tenant and has its commit key. Anything else (another tenant's or
// another deployment's id, a forged or pruned one) is 400: such a client
// must start afresh instead of silently getting a wrong replay. So is a
// cursor after which retention pruned an event the client would have got
// (of the tenant, and matching f): the replay would skip it silently.
func (h *Hub) checkCursor(ctx context.Context, tenant string, f Filter, cur eventstore.Cursor) error {
	var key uint64
	var pruned bool
	err := h.replayRead(ctx, tenant, true, func(db eventstore.DB) error {
		if err := db.QueryRow(ctx, checkCursorSQL, cur.Position).Scan(&key); err != nil {
			return err
		}
		return db.QueryRow(ctx, prunedAfterSQL, cur.CommitKey, cur.Position, h.sentTypes(f), f.StreamTypes).Scan(&pruned)
	})
	switch {
	case errors.Is(err, ErrClosed):
		return err
	case errors.Is(err, pgx.ErrNoRows), err == nil && key != cur.CommitKey:
		return &framework.Error{Code: framework.CodeBadRequest,
			Message: "Last-Event-ID does not name an event of this stream: reconnect without it",
			Details: map[string]any{"lastEventId": cur.String()}}
	case err == nil && pruned:
		return &framework.Error{Code: framework.CodeBadRequest,
			Message: "events after Last-Event-ID were pruned and cannot be replayed: reconnect without it",
			Details: map[string]any{"lastEventId": cur.String()}}
	case err != nil && ctx.Err() == nil:
		return &framework.Error{Code: framework.CodeUnavailable, Message: "database unavailable", Err: fmt.Errorf("sse: check cursor: %w", err)}
	case err != nil:
		return ctx.Err()
	}
	return nil
}

// sentTypes returns the event types a stream with filter f sends: the
// filter's, or every declared type that is not internal.
func (h *Hub) sentTypes(f Filter) []string {
	if len(f.Types) > 0 {
		return f.Types
	}
	var out []string
	for _, t := range h.reg.EventTypes() {
		if !h.reg.InternalEvent(t) {
			out = append(out, t)
		}
	}
	return out
}

// replayRead is inTenant for the reads of resuming streams (a resume id's
// check, a page of a replay): it waits for its turn among
// Config.ReplayConns, so that a burst of them leaves the rest of the pool
// to the writes. A check (check true) takes the next turn, before the
// pages waiting for one: it has no response yet, so no heartbeat, and
// Config.ResumeWait bounds it, while a stream waiting for a page has its
// response and its heartbeats; and it is short. The wait ends with the
// request (ctx) and with Close (ErrClosed).
func (h *Hub) replayRead(ctx context.Context, tenant string, check bool, fn func(db eventstore.DB) error) error {
	var handed chan struct{} // nil for a page: never handed a turn
	if check {
		handed = h.checkTurn
	}
	select {
	case h.replaySem <- struct{}{}:
	case <-handed:
		// A turn ending handed its place in replaySem over.
	case <-ctx.Done():
		return ctx.Err()
	case <-h.done:
		return ErrClosed
	}
	defer h.endReplayTurn()
	return h.inTenant(ctx, tenant, fn)
}

// endReplayTurn ends a turn of replayRead: a check waiting for one takes
// it over (its place in replaySem stays taken), before the pages waiting;
// without one the place is freed.
func (h *Hub) endReplayTurn() {
	select {
	case h.checkTurn <- struct{}{}:
	default:
		<-h.replaySem
	}
}

// inTenant runs fn in a read-only transaction scoped to tenant (row-level
// security confines it to the tenant's rows).
func (h *Hub) inTenant(ctx context.Context, tenant string, fn func(db eventstore.DB) error) error {
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	defer func() {
		// Read only: ending it with ROLLBACK loses nothing. A connection
		// that cannot even roll back is closed, not reused.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
			_ = conn.Conn().Close(rctx)
		}
	}()
	if err := tenancy.Begin(ctx, conn.Conn(), tenant, tenancy.Options{ReadOnly: true}); err != nil {
		return err
	}
	return fn(conn.Conn())
}

// replay writes the tenant's events after cursor up to and including upTo
// (the hub's position when the client subscribed, or rejoined after a
// round whose live events overflowed its buffer), page by page, each page
// in its own short tenant-scoped read. Every event up to upTo is final and
// below the horizon; the later ones reach the client through the hub. It
// stops with ErrClosed when the hub closes (a large backlog read by a slow
// client must not outlast the drain), and with errTokenExpired when the
// stream's token expires, between pages or while it waits for one (its
// turn, or a read): no page goes out after the expiry.
func (h *Hub) replay(ctx context.Context, tenant string, f Filter, after, upTo eventstore.Cursor, st *stream) error {
	for {
		if !after.Less(upTo) {
			return nil
		}
		select {
		case <-h.done:
			return ErrClosed
		default:
		}
		if st.expired() {
			// The token bounds the replay as it bounds the live stream.
			return errTokenExpired
		}
		var recs []eventstore.Record
		var pruned bool
		// The wait for the page (its turn, a read a lock holds up) ends
		// at the token's expiry too: the page must not go out after it.
		rctx, cancel := ctx, func() {}
		if !st.expires.IsZero() {
			rctx, cancel = context.WithDeadline(ctx, st.expires)
		}
		err := h.replayRead(rctx, tenant, false, func(db eventstore.DB) error {
			var err error
			recs, err = eventstore.ReadAfterFiltered(rctx, db, after, h.cfg.ReplayBatch, eventstore.ReadOptions{Types: f.Types})
			if err != nil {
				return err
			}
			// After the read: a prune that committed before it (its
			// marks and deletions commit together) shows here.
			return db.QueryRow(rctx, prunedAfterSQL, after.CommitKey, after.Position, h.sentTypes(f), f.StreamTypes).Scan(&pruned)
		})
		cancel()
		if errors.Is(err, ErrClosed) {
			return err
		}
		if err != nil && ctx.Err() == nil && st.expired() {
			return errTokenExpired
		}
		if err != nil {
			return fmt.Errorf("sse: replay: %w", err)
		}
		if st.expired() {
			// The read ended just as the token expired.
			return errTokenExpired
		}
		if pruned {
			// Events after the cursor were deleted since the resume was
			// checked, maybe before this page was read: end the stream
			// rather than skip them; the client's resume is refused then.
			return errPrunedDuringReplay
		}
		var frames [][]byte
		var last eventstore.Cursor
		for i := range recs {
			env := recs[i]
			if upTo.Less(env.Cursor()) {
				break
			}
			after = env.Cursor()
			if !h.streamable(&env) || !f.Match(env.Type, env.StreamType) {
				continue
			}
			if fr := h.encode(env); fr != nil {
				frames = append(frames, fr)
				last = env.Cursor()
			}
		}
		if len(frames) > 0 {
			if err := st.write(frames...); err != nil {
				return err
			}
			st.last = last
			h.sent.Add(float64(len(frames)))
		}
		if len(recs) < h.cfg.ReplayBatch || upTo.Less(recs[len(recs)-1].Cursor()) {
			return nil
		}
	}
}

// errTokenExpired ends a replay that outlived its token.
var errTokenExpired = errors.New("sse: the stream's token expired")

// errPrunedDuringReplay ends a replay that a prune overtook.
var errPrunedDuringReplay = errors.New("sse: events to replay were pruned meanwhile")

// errWrite marks a failed write to the client.
var errWrite = errors.New("sse: write to client failed")

// stream is one client's response.
type stream struct {
	h   *Hub
	sub *subscriber
	// out serialises writes to the response: during a replay, the
	// replay's frames and the heartbeats of beatDuringReplay.
	out  sync.Mutex
	w    *echo.Response
	rc   *http.ResponseController
	last eventstore.Cursor
	// expires is when the stream's token stops verifying; zero: never.
	expires time.Time
}

// expired reports whether the stream's token has expired.
func (s *stream) expired() bool {
	return !s.expires.IsZero() && !time.Now().Before(s.expires)
}

// writeChunk is the most bytes of a write one WriteTimeout covers: a
// client that reads, however slowly, takes each chunk in time, while one
// that stopped reading is cut off WriteTimeout after its buffers filled. A
// deadline for a whole write (a replay page, or a queue of live frames:
// megabytes) would drop a client that reads steadily but slower than that.
const writeChunk = 32 << 10

// write sends the parts and flushes, each writeChunk bytes bounded by
// WriteTimeout. The parts go straight into the connection's own buffer (no
// copy per client). After Close it writes nothing and returns ErrClosed; a
// write in progress when the hub closes is cut (see [Hub.Close]). A write
// that timed out drops the client (counted); any other failure (the client
// left, or Close cut it) just ends the stream.
func (s *stream) write(parts ...[]byte) error {
	s.out.Lock()
	defer s.out.Unlock()
	if err := s.begin(); err != nil {
		return err
	}
	err := s.writeChunks(parts)
	if err == nil {
		err = s.rc.Flush()
	}
	s.sub.wmu.Lock()
	s.sub.writing = false
	s.sub.wmu.Unlock()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && !s.h.isClosed() {
			s.h.drop(s.sub)
		} else {
			s.h.unsubscribe(s.sub)
		}
		return errWrite
	}
	return nil
}

// begin starts a write: it fails when the client was dropped or the hub
// closed, and otherwise marks the subscriber as writing and sets the write's
// deadline, both before a drop or Close can look (see subscriber.wmu).
func (s *stream) begin() error { return s.arm(true) }

// arm sets a fresh write deadline, unless the client was dropped or the hub
// closed (the deadline that cuts the write must stay, see subscriber.wmu);
// start also marks the subscriber as writing. A write going on (start
// false) when the hub has closed goes on under the deadline Close gave it,
// so that a client that reads gets its frames whole.
func (s *stream) arm(start bool) error {
	s.sub.wmu.Lock()
	defer s.sub.wmu.Unlock()
	select {
	case <-s.sub.gone:
		return errWrite
	case <-s.h.done:
		if start {
			return ErrClosed
		}
		return nil
	default:
	}
	if start {
		s.sub.writing = true
	}
	// net/http's connections support deadlines; a writer that does not
	// just writes without one.
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.h.cfg.WriteTimeout))
	return nil
}

// writeChunks writes parts, renewing the write deadline after every
// writeChunk bytes the connection took.
func (s *stream) writeChunks(parts [][]byte) error {
	budget := writeChunk
	for _, p := range parts {
		for len(p) > 0 {
			if budget == 0 {
				// The write made progress: a fresh deadline for the next chunk.
				if err := s.arm(false); err != nil {
					return err
				}
				budget = writeChunk
			}
			k := min(len(p), budget)
			if _, err := s.w.Write(p[:k]); err != nil {
				return err
			}
			p, budget = p[k:], budget-k
		}
	}
	return nil
}

// live streams the hub's frames until the client goes away, is dropped,
// the hub closes, or the token expires. Frames at or before the last one
// sent (already replayed) are skipped.
func (s *stream) live(ctx context.Context) {
	hb := time.NewTicker(s.h.cfg.Heartbeat)
	defer hb.Stop()
	var expired <-chan time.Time
	if !s.expires.IsZero() {
		t := time.NewTimer(time.Until(s.expires))
		defer t.Stop()
		expired = t.C
	}
	var spare []*frame
	for {
		select {
		case <-ctx.Done():
			return
		case <-expired:
			return
		case <-s.h.done:
			return
		case <-s.sub.gone:
			return
		case <-hb.C:
			if s.write(heartbeat) != nil {
				return
			}
		case <-s.sub.notify:
			frames := s.sub.take(spare)
			n := 0
			for _, f := range frames {
				if s.last.Less(f.cursor) {
					frames[n] = f
					n++
					s.last = f.cursor
				}
			}
			err := s.writeFrames(frames[:n])
			clear(frames)
			spare = frames
			if err != nil {
				return
			}
			s.h.sent.Add(float64(n))
		}
	}
}

// writeFrames writes the frames' data like write, without collecting it.
func (s *stream) writeFrames(frames []*frame) error {
	if len(frames) == 0 {
		return nil
	}
	if len(frames) == 1 {
		return s.write(frames[0].data)
	}
	parts := make([][]byte, len(frames))
	for i, f := range frames {
		parts[i] = f.data
	}
	return s.write(parts...)
}

// heartbeat is the comment frame that keeps idle connections open.
var heartbeat = []byte(": heartbeat\n\n")
