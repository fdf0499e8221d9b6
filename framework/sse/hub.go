package sse

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/metrics"
)

// ConsumerName is the per-instance system consumer that feeds the hub. It
// is a persistent identifier (its state rows are keyed by it): never rename
// it.
const ConsumerName = dispatcher.SSEConsumerName

// DefaultBuffer is [Config].Buffer's default.
const DefaultBuffer = 1024

// Config tunes [New]. A nil *Config means the defaults.
type Config struct {
	// Buffer is the most frames queued per client (the queue grows on
	// demand). A live client whose queue is full when an event arrives is
	// disconnected (it reconnects with its last id and catches up from the
	// events table), so one slow client never delays the others; a client
	// still replaying a backlog is not, it replays on from the table
	// instead. Keep it
	// above the dispatcher's batch size: one pass publishes a whole batch
	// at once (the entrypoint makes it at least twice that). Half of it
	// also bounds the published events waiting for the hub's fan-out,
	// beyond which the consumer's pass waits (see [Hub.Publish]). Defaults
	// to [DefaultBuffer].
	Buffer int
	// Heartbeat is the period of the comment frames that keep idle
	// connections (and the proxies on their way) open, live and while a
	// replay sends nothing. Defaults to 15s.
	Heartbeat time.Duration
	// Retry is the reconnection delay the stream asks clients to use (the
	// `retry:` field). Defaults to 2s.
	Retry time.Duration
	// WriteTimeout bounds each 32 KB of a write to a client: a client that
	// takes nothing for this long (it stopped reading, and the sockets'
	// buffers are full) is disconnected, one that reads slowly is not.
	// Defaults to 10s.
	WriteTimeout time.Duration
	// ReplayBatch is the number of events one replay query reads.
	// Defaults to 500.
	ReplayBatch int
	// ReplayConns is the most database reads of resuming streams (a resume
	// id's check, a page of a replay) that run at once, each on a
	// connection of the pool: the share of the pool the replays of a burst
	// of reconnecting clients (an API instance died, and its browsers
	// resume on the others) may take, so that the writes still find
	// connections. A stream takes its turn per page, not for its whole
	// replay, so a client that reads slowly holds no one up; a stream
	// waiting for a page's turn keeps getting its heartbeats. A resume
	// id's check, before the response starts, has none (ResumeWait bounds
	// it instead): it takes the next turn, before the pages waiting for
	// one. Defaults to a quarter of the pool's MaxConns, at least 1.
	ReplayConns int
	// ResumeWait bounds how long a request waits for the database before
	// its response starts: a resuming request's id check (its turn among
	// ReplayConns, and the read) and, for every request, the read of the
	// opening frame's token (a pool connection for it, and the read),
	// together. Both decide the response's status (a bad or pruned id is a
	// 400, no token a 503), so the response has not started meanwhile and
	// carries no heartbeat. A request whose waits take longer is answered
	// 503 (retry) instead of staying silent until a proxy's idle timeout
	// cuts it. Keep it below the idle timeouts of the proxies in front
	// (nginx's proxy_read_timeout is 60s by default). Defaults to 10s.
	ResumeWait time.Duration
	// ReadyWait is how long a request waits for the hub to be primed (at
	// process start) before it is answered 503. Defaults to 5s.
	ReadyWait time.Duration
	// Logger receives failures. Defaults to discarding.
	Logger *slog.Logger
	// Metrics registers kumiko_sse_clients, kumiko_sse_dropped_clients_total
	// and kumiko_sse_events_sent_total. Defaults to none.
	Metrics prometheus.Registerer
}

// ErrClosed is returned by [Hub.Prime] after [Hub.Close].
var ErrClosed = errors.New("sse: hub closed")

// Hub fans the events of the log out to the SSE clients of this process.
// The per-instance consumer [Hub.Consumer] feeds it in cursor order; each
// client gets the events of its own tenant that pass its filter. Build it
// with [New], position it with [Hub.Prime] before the dispatcher runs, mount
// its endpoint with [Hub.Mount], and end every stream with [Hub.Close].
type Hub struct {
	pool *pgxpool.Pool
	reg  *framework.Registry
	cfg  Config
	log  *slog.Logger

	mu      sync.Mutex
	last    eventstore.Cursor
	tenants map[string]map[*subscriber]struct{}
	count   int
	closed  bool

	// pending holds published events the fan-out goroutine has not
	// delivered yet, at most maxPending (half of Config.Buffer: see
	// Publish); space (on mu) signals room in it, work a new event.
	pending    []framework.Envelope
	maxPending int
	space      *sync.Cond
	work       chan struct{}
	fanDone    chan struct{}

	// openTok caches the last consistency token a stream opened with
	// (see openToken); openSem (capacity 1) serialises its reads.
	openTok struct {
		covers eventstore.Cursor
		token  string
	}
	openSem chan struct{}

	// replaySem (capacity Config.ReplayConns) bounds the replay reads
	// running at once (see replayRead); a turn ending hands its place over
	// through checkTurn (unbuffered) to a resume id's check waiting.
	replaySem chan struct{}
	checkTurn chan struct{}

	// cancels holds the cancel of each request's context (see
	// withClose), keyed by cancelSeq (on mu): Close cancels them all.
	cancels   map[uint64]context.CancelFunc
	cancelSeq uint64

	ready     chan struct{}
	readyOnce sync.Once
	done      chan struct{}
	closeOnce sync.Once

	clients prometheus.Gauge
	dropped prometheus.Counter
	sent    prometheus.Counter
}

// New returns a hub that replays from pool and reads its streams' opening
// tokens there (the primary: a replica may lag behind what the hub has
// delivered, which would leave a gap, and has no WAL insert position) and checks
// event-type filters against reg. It fails only when the metrics cannot be
// registered.
func New(pool *pgxpool.Pool, reg *framework.Registry, cfg *Config) (*Hub, error) {
	if pool == nil || reg == nil {
		return nil, errors.New("sse: pool and registry are required")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	c.Buffer = cmp.Or(max(c.Buffer, 0), DefaultBuffer)
	c.Heartbeat = cmp.Or(max(c.Heartbeat, 0), 15*time.Second)
	c.Retry = cmp.Or(max(c.Retry, 0), 2*time.Second)
	c.WriteTimeout = cmp.Or(max(c.WriteTimeout, 0), 10*time.Second)
	c.ReplayBatch = cmp.Or(max(c.ReplayBatch, 0), 500)
	c.ReadyWait = cmp.Or(max(c.ReadyWait, 0), 5*time.Second)
	c.ResumeWait = cmp.Or(max(c.ResumeWait, 0), 10*time.Second)
	c.ReplayConns = cmp.Or(max(c.ReplayConns, 0), max(int(pool.Config().MaxConns)/4, 1))
	h := &Hub{
		pool:    pool,
		reg:     reg,
		cfg:     c,
		log:     cmp.Or(c.Logger, slog.New(slog.DiscardHandler)),
		tenants: map[string]map[*subscriber]struct{}{},
		cancels: map[uint64]context.CancelFunc{},
		// At least one: Publish must be able to hand over an event.
		maxPending: max(c.Buffer/2, 1),
		work:       make(chan struct{}, 1),
		openSem:    make(chan struct{}, 1),
		replaySem:  make(chan struct{}, c.ReplayConns),
		checkTurn:  make(chan struct{}),
		fanDone:    make(chan struct{}),
		ready:      make(chan struct{}),
		done:       make(chan struct{}),
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kumiko_sse_clients",
			Help: "SSE clients connected to this process.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kumiko_sse_dropped_clients_total",
			Help: "SSE clients disconnected because their buffer overflowed or a write timed out.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kumiko_sse_events_sent_total",
			Help: "Event frames written to SSE clients (replayed and live).",
		}),
	}
	h.space = sync.NewCond(&h.mu)
	if c.Metrics != nil {
		var err error
		if h.clients, err = metrics.Register(c.Metrics, h.clients); err != nil {
			return nil, err
		}
		if h.dropped, err = metrics.Register(c.Metrics, h.dropped); err != nil {
			return nil, err
		}
		if h.sent, err = metrics.Register(c.Metrics, h.sent); err != nil {
			return nil, err
		}
	}
	go h.fanout()
	return h, nil
}

// Consumer returns the per-instance system consumer that feeds the hub:
// [ConsumerName], delivery per-instance, starting at the head of the log.
// Its Apply publishes the event to the hub and never fails.
func (h *Hub) Consumer() dispatcher.Consumer {
	return dispatcher.Consumer{
		Name:        ConsumerName,
		Delivery:    framework.DeliveryPerInstance,
		System:      true,
		StartAtHead: true,
		Apply: func(_ context.Context, _ *framework.Tx, env framework.Envelope) error {
			h.Publish(env)
			return nil
		},
	}
}

// primeSQL puts the consumer's state row of this instance at the
// visibility horizon: every event below it is final (its transaction has
// ended), every event at or above it sorts after the cursor. A restarted
// instance starts there too: its clients catch up by replay, not through the
// hub.
const primeSQL = `INSERT INTO event_consumers AS c (name, instance_id, cursor_commit_key, cursor_position)
SELECT $1, $2, (pg_snapshot_xmin(pg_current_snapshot())::text::numeric - 1)::text::xid8, 9223372036854775807
ON CONFLICT (name, instance_id) DO UPDATE SET
  cursor_commit_key = EXCLUDED.cursor_commit_key, cursor_position = EXCLUDED.cursor_position,
  status = 'idle', attempts = 0, failed_position = NULL, last_error = NULL, next_attempt_at = NULL,
  dead_at = NULL, revivals = 0, heartbeat_at = now(), updated_at = now()
RETURNING cursor_commit_key, cursor_position`

// Prime positions this instance's [ConsumerName] state row at the head of
// the log (the visibility horizon) and the hub there, then opens the hub to
// clients. Call it before the dispatcher runs the consumer. Until it
// succeeded, SSE requests wait up to Config.ReadyWait and are then answered
// 503.
//
// The handoff between replay and live delivery rests on this: every event
// at or before the hub's position is final and readable, and every event
// after it will reach the hub, in cursor order.
func (h *Hub) Prime(ctx context.Context, instanceID string) error {
	if instanceID == "" || instanceID == dispatcher.SharedInstance {
		return fmt.Errorf("sse: prime: invalid instance id %q", instanceID)
	}
	var cur eventstore.Cursor
	if err := h.pool.QueryRow(ctx, primeSQL, ConsumerName, instanceID).Scan(&cur.CommitKey, &cur.Position); err != nil {
		return fmt.Errorf("sse: prime: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if h.last.Less(cur) {
		h.last = cur
	}
	h.readyOnce.Do(func() { close(h.ready) })
	return nil
}

// Ready reports whether [Hub.Prime] succeeded.
func (h *Hub) Ready() bool {
	select {
	case <-h.ready:
		return true
	default:
		return false
	}
}

// Position returns the cursor of the last event the hub received.
func (h *Hub) Position() eventstore.Cursor {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// walPositionSQL reads the primary's current WAL insert position, the form
// of a consistency token.
const walPositionSQL = `SELECT pg_current_wal_insert_lsn()::text`

// openToken returns the consistency token of a stream that will not send
// the events at or before upTo (where it subscribed to the hub, or the id
// it resumes from when that is later): a WAL position of the primary at or
// past the commit of every such event, so a query that sends it back sees
// all of them (the replica waits for it, or the primary answers). Each of
// them has ended before the position is read: the hub receives only events
// below the visibility horizon (Prime's position is that horizon), and a
// resume id names an event checked before. One read serves every stream
// that subscribed before it: a burst of reconnecting clients costs one
// query, not one each. The wait (for the read's turn, a pool connection,
// the read) ends with ctx: the handler bounds it by Config.ResumeWait.
//
// The cached token stands only for what the hub had when it was read,
// never for a resume id ahead of the hub: such an id comes from the client
// (another instance's stream, or forged from a guessable transaction id),
// and events before it may still commit, another tenant's among them,
// after the read. Cached as covering the id, the token would open that
// tenant's later streams short of events they do not send.
func (h *Hub) openToken(ctx context.Context, upTo eventstore.Cursor) (string, error) {
	select {
	case h.openSem <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-h.openSem }()
	if h.openTok.token != "" && !h.openTok.covers.Less(upTo) {
		return h.openTok.token, nil
	}
	covers := h.Position()
	var token string
	if err := h.pool.QueryRow(ctx, walPositionSQL).Scan(&token); err != nil {
		return "", fmt.Errorf("sse: read wal position: %w", err)
	}
	h.openTok.covers, h.openTok.token = covers, token
	return token, nil
}

// isClosed reports whether Close was called.
func (h *Hub) isClosed() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Clients returns the number of connected clients.
func (h *Hub) Clients() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

// Close ends every stream (the handlers return, so the HTTP server can shut
// down), refuses new ones with 503 and stops the hub's fan-out goroutine,
// which [New] started. A stream ends before its next write, whether it is
// live or still replaying a backlog, and ends its response normally; a
// database read it waits for (a page of its replay, its resume id's check,
// its opening token) is cancelled, as a lock held by a migration may hold it
// for longer than the drain; a write in progress (a client that is slow to
// read) may go on for 250 ms (or Config.WriteTimeout, if shorter) and is
// cut then instead of holding the shutdown up for Config.WriteTimeout: a
// client that reads gets its frame whole and a clean end, one that does
// not sees a truncated response. Either way a client resumes elsewhere
// from the last complete frame it got. Call
// Close when done with the hub; it is idempotent.
func (h *Hub) Close() {
	h.closeOnce.Do(func() {
		grace := time.Now().Add(min(closeGrace, h.cfg.WriteTimeout))
		h.mu.Lock()
		h.closed = true
		h.space.Broadcast()
		close(h.done)
		for _, set := range h.tenants {
			for s := range set {
				s.cutWrite(grace)
			}
		}
		for _, cancel := range h.cancels {
			cancel()
		}
		clear(h.cancels)
		h.mu.Unlock()
	})
	<-h.fanDone
}

// withClose returns a context derived from ctx that Close cancels too, and
// its release, which the caller must call when done with it.
func (h *Hub) withClose(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		cancel()
		return ctx, func() {}
	}
	h.cancelSeq++
	id := h.cancelSeq
	h.cancels[id] = cancel
	return ctx, func() {
		h.mu.Lock()
		delete(h.cancels, id)
		h.mu.Unlock()
		cancel()
	}
}

// frame is one encoded event, shared by every client that gets it.
type frame struct {
	cursor eventstore.Cursor
	data   []byte
}

// subscriber is one connected client.
type subscriber struct {
	tenant string
	filter Filter
	limit  int
	// mu guards queue; notify (capacity 1) says it is not empty. The queue
	// grows on demand up to limit, so an idle client costs no buffer.
	mu     sync.Mutex
	queue  []*frame
	notify chan struct{}
	// gone is closed when the hub dropped the client.
	gone chan struct{}
	// kill sets the deadline of the subscriber's writes, which cuts a
	// blocked one short at that time; set before the subscriber is added.
	kill func(deadline time.Time)
	// wmu orders a write's start (its check of gone and the hub's done, and
	// its deadline) against the drop or Close that cuts it: a write either
	// sees it and does not start, or has started and is cut.
	wmu sync.Mutex
	// writing is true while the handler writes (on wmu).
	writing bool
	// from is the hub's position when the client subscribed, or when it
	// rejoined after a replay round (on the hub's mu): the client gets
	// every later event through its queue (and maybe some earlier ones
	// still being fanned out, which the handler skips).
	from eventstore.Cursor
	// replaying is true while the handler replays from the events table
	// and does not take the queue (on the hub's mu). An overflow then does
	// not drop the client: the queue is discarded and lost set, and the
	// handler replays on from the table (see Hub.rejoin).
	replaying bool
	// lost is true when the queue overflowed during the replay round (on
	// the hub's mu): frames after from are missing from it.
	lost bool
}

// push queues fs and reports false when they do not fit.
func (s *subscriber) push(fs []*frame) bool {
	s.mu.Lock()
	if len(s.queue)+len(fs) > s.limit {
		s.mu.Unlock()
		return false
	}
	s.queue = append(s.queue, fs...)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return true
}

// take returns the queued frames and hands the queue spare back for reuse.
func (s *subscriber) take(spare []*frame) []*frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.queue
	s.queue = spare[:0]
	return out
}

// Publish hands one committed event, below the visibility horizon, to the
// hub; a goroutine of the hub delivers it to the clients of its tenant whose
// filter it passes. Events must arrive in cursor order; an event at or
// before the last one published (a redelivery after a pass that failed to
// commit) is ignored. Publish returns at once unless half of Config.Buffer
// events already wait for delivery (then it waits: the consumer's pass slows
// down, no event is lost). A client whose buffer is full is dropped, never
// waited for.
//
// The bound is what keeps a client that keeps up from being dropped while
// the fan-out lags (a slow upcaster): the fan-out delivers everything that
// waits as one round, and a round larger than a client's buffer would drop
// every client of the tenant, fast ones included. With it, a round holds at
// most half a buffer, so only a client that has not taken the round before
// can overflow.
func (h *Hub) Publish(env framework.Envelope) {
	cur := env.Cursor()
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.pending) >= h.maxPending && !h.closed {
		h.space.Wait()
	}
	if h.closed || !h.last.Less(cur) {
		return
	}
	h.last = cur
	h.pending = append(h.pending, env)
	select {
	case h.work <- struct{}{}:
	default:
	}
}

// fanout delivers the published events until Close. It takes whatever has
// accumulated since its last round, so a burst reaches each client as one
// batch: one wake-up and one write per client, not one per event.
func (h *Hub) fanout() {
	defer close(h.fanDone)
	var batch []framework.Envelope
	var scratch fanScratch
	for {
		select {
		case <-h.done:
			return
		case <-h.work:
		}
		h.mu.Lock()
		batch, h.pending = h.pending, batch[:0]
		h.space.Broadcast()
		h.planLocked(batch, &scratch)
		h.mu.Unlock()
		// Encoding runs the application's upcasters: outside the lock, so
		// that a slow one holds up neither Publish nor clients connecting
		// and leaving.
		h.encodeWanted(batch, &scratch)
		h.mu.Lock()
		h.deliverLocked(batch, &scratch)
		h.mu.Unlock()
		clear(batch)
		clear(scratch.frames)
	}
}

// fanScratch is fanout's reusable working memory.
type fanScratch struct {
	// frames holds the encoded frame of each wanted event of the batch
	// (nil: nobody wanted it when the batch was planned).
	frames   []*frame
	byTenant map[string][]int
	add      []*frame
}

// planLocked finds the batch's events some subscriber wants: an empty
// frame is allocated for each, to be encoded by encodeWanted, and byTenant
// lists them by tenant. A client that subscribes later (before
// deliverLocked) wants none of them: its position is at or after every
// event of the batch, which was published before.
func (h *Hub) planLocked(batch []framework.Envelope, sc *fanScratch) {
	if sc.byTenant == nil {
		sc.byTenant = map[string][]int{}
	}
	clear(sc.byTenant)
	sc.frames = append(sc.frames[:0], make([]*frame, len(batch))...)
	for i := range batch {
		env := &batch[i]
		t := env.TenantID
		if len(h.tenants[t]) == 0 || !h.streamable(env) {
			continue
		}
		for s := range h.tenants[t] {
			if s.filter.Match(env.Type, env.StreamType) {
				sc.frames[i] = &frame{cursor: env.Cursor()}
				sc.byTenant[t] = append(sc.byTenant[t], i)
				break
			}
		}
	}
}

// encodeWanted encodes the events planLocked found wanted, each once.
func (h *Hub) encodeWanted(batch []framework.Envelope, sc *fanScratch) {
	for i, f := range sc.frames {
		if f != nil {
			f.data = h.encode(batch[i])
		}
	}
}

// deliverLocked queues the batch's encoded frames for the subscribers of
// each event's tenant that are still connected, in order, skipping those
// at or before a subscriber's position (a client that subscribed while the
// batch was encoded).
func (h *Hub) deliverLocked(batch []framework.Envelope, sc *fanScratch) {
	if h.closed {
		return
	}
	for tenant, idx := range sc.byTenant {
		for s := range h.tenants[tenant] {
			sc.add = sc.add[:0]
			for _, i := range idx {
				env := &batch[i]
				if !s.from.Less(sc.frames[i].cursor) || !s.filter.Match(env.Type, env.StreamType) {
					continue
				}
				if sc.frames[i].data == nil {
					continue // cannot be upcast: not sent
				}
				sc.add = append(sc.add, sc.frames[i])
			}
			if len(sc.add) == 0 || s.lost {
				continue
			}
			if !s.push(sc.add) {
				if s.replaying {
					// Reading a replay, not the queue: not slow. The
					// table has what does not fit; rejoin replays it.
					s.lost = true
					s.discard()
					continue
				}
				h.dropLocked(s)
			}
		}
	}
	clear(sc.add)
}

// discard empties the queue (an overflow during a replay: the frames are
// replayed from the table instead).
func (s *subscriber) discard() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.queue)
	s.queue = nil
}

// subscribe adds a client of tenant with filter f; kill cuts its blocked
// writes short when the hub drops it. A client that replays first
// (replaying) is not dropped when its queue overflows before it calls
// rejoin.
func (h *Hub) subscribe(tenant string, f Filter, replaying bool, kill func(deadline time.Time)) (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	s := &subscriber{tenant: tenant, filter: f, limit: h.cfg.Buffer, notify: make(chan struct{}, 1),
		gone: make(chan struct{}), kill: kill, from: h.last, replaying: replaying}
	set := h.tenants[tenant]
	if set == nil {
		set = map[*subscriber]struct{}{}
		h.tenants[tenant] = set
	}
	set[s] = struct{}{}
	h.count++
	h.clients.Inc()
	return s, nil
}

// rejoin ends a replay round of s, which replayed the events up to s.from.
// When s's queue holds every event since s.from and leaves room for a
// fan-out round (Publish's bound), rejoin ends the replay (from now on an
// overflow drops the client, as a slow live client) and returns false: the
// handler goes live. Otherwise (the queue overflowed during the round, so
// it misses events, or it is too full to take the next round before the
// handler empties it) rejoin empties the queue, moves s.from to the hub's
// position (every event up to it is final and in the table; the later ones
// reach the queue) and returns true with it: the handler replays up to
// there too, and calls rejoin again.
//
// Each round replays only what arrived during the previous one, so a client
// that reads faster than events arrive needs ever shorter rounds and
// reaches live, however far behind it resumed.
func (h *Hub) rejoin(s *subscriber) (eventstore.Cursor, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !s.lost && s.queued() <= s.limit-h.maxPending {
		s.replaying = false
		return s.from, false
	}
	s.lost = false
	s.discard()
	s.from = h.last
	return s.from, true
}

// queued returns the number of frames in the queue.
func (s *subscriber) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// unsubscribe removes a client (a no-op when it was dropped).
func (h *Hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(s)
}

// drop disconnects a client from outside Publish (a write timed out).
func (h *Hub) drop(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropLocked(s)
}

func (h *Hub) dropLocked(s *subscriber) {
	if !h.removeLocked(s) {
		return
	}
	h.dropped.Inc()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	close(s.gone)
	if s.kill != nil {
		s.kill(time.Unix(1, 0))
	}
}

// closeGrace is how long a write in progress when the hub closes may go on
// (at most Config.WriteTimeout): a client that reads gets its frame whole
// and a clean end, one that does not is cut then.
const closeGrace = 250 * time.Millisecond

// cutWrite bounds the subscriber's write in progress, if any, by deadline
// (Close: the hub's done is closed already, so no later write starts, and
// the write does not renew its deadline, see stream.arm). A subscriber that
// is not writing keeps its connection usable to end its response normally.
func (s *subscriber) cutWrite(deadline time.Time) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.writing && s.kill != nil {
		s.kill(deadline)
	}
}

// removeLocked removes s and reports whether it was still subscribed.
func (h *Hub) removeLocked(s *subscriber) bool {
	set := h.tenants[s.tenant]
	if _, ok := set[s]; !ok {
		return false
	}
	delete(set, s)
	if len(set) == 0 {
		delete(h.tenants, s.tenant)
	}
	h.count--
	h.clients.Dec()
	return true
}

// Data is the JSON of a frame's data field.
type Data struct {
	// ID is the event's cursor, the same as the frame's id.
	ID string `json:"id"`
	// Position is the event's position, its public id.
	Position int64 `json:"position"`
	// Type is the qualified event type, the same as the frame's event.
	Type string `json:"type"`
	// Stream is the event's aggregate stream.
	Stream Stream `json:"stream"`
	// Version is the event's version within its stream.
	Version int64 `json:"version"`
	// Payload is the event's payload in the current schema version of its
	// type (upcast like every read).
	Payload json.RawMessage `json:"payload"`
	// CorrelationID ties together everything one request caused.
	CorrelationID string `json:"correlationId,omitempty"`
	// CausationID is what caused the event (a request or an event id).
	CausationID string `json:"causationId,omitempty"`
	// UserID is the user who caused the event, when there was one.
	UserID string `json:"userId,omitempty"`
	// CreatedAt is when the event was appended.
	CreatedAt time.Time `json:"createdAt"`
}

// Stream names an event's aggregate stream in [Data].
type Stream struct {
	// Type is the aggregate type, e.g. "order".
	Type string `json:"type"`
	// ID is the aggregate's id.
	ID string `json:"id"`
}

// streamable reports whether env may be sent to clients at all: internal
// event types ([framework.EventOptions].Internal) never are, nor types the
// registry does not declare (removed from the code, their events still in
// the log: no schema the clients know, and fields the code dropped).
func (h *Hub) streamable(env *framework.Envelope) bool {
	return h.reg.HasEvent(env.Type) && !h.reg.InternalEvent(env.Type)
}

// encode renders env as one SSE frame: id, event and one data line. It
// returns nil, and logs, when env's payload cannot be upcast to its type's
// current version: like an undeclared type's, the stored payload has no
// schema the clients know (and may carry fields the code dropped), so the
// event is not sent.
func (h *Hub) encode(env framework.Envelope) []byte {
	payload, err := h.reg.UpcastPayload(env)
	if err != nil {
		h.log.Error("sse: event not sent, its payload cannot be upcast", "position", env.Position, "event_type", env.Type, "error", err)
		return nil
	}
	return encodeFrame(env, payload)
}
