package idempotency

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kumiko-go/kumiko/framework/metrics"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/internal/redisauto"
)

// Defaults of [Config].
const (
	DefaultPrefix      = "kumiko:idem"
	DefaultTTL         = 24 * time.Hour
	DefaultLease       = 30 * time.Second
	DefaultWaitTimeout = 10 * time.Second
	DefaultCallTimeout = 2 * time.Second
	// MaxKeyLength is the longest accepted key.
	MaxKeyLength = 255
)

// Errors of [Store.Begin] and [Claim.Finish].
var (
	// ErrUnavailable wraps every Redis failure: the request must not run.
	ErrUnavailable = errors.New("idempotency: store unavailable")
	// ErrKeyReused: the key was used before for a different request.
	ErrKeyReused = errors.New("idempotency: key reused for a different request")
	// ErrInProgress: another request holds the key and did not finish
	// within the wait timeout.
	ErrInProgress = errors.New("idempotency: a request with this key is in progress")
	// ErrNotOwner: the claim was taken over (its lease ran out) or is
	// finished; the response was not stored.
	ErrNotOwner = errors.New("idempotency: claim no longer owned")
)

// Config tunes [New]. A nil *Config means the defaults.
type Config struct {
	// Prefix starts every key. Defaults to "kumiko:idem".
	Prefix string
	// TTL is how long a key is kept after its finish, and after its lease
	// ends (a pending key is kept for the lease plus TTL from its claim and
	// from each renewal): the key of an owner that died is remembered for
	// TTL after its lease ran out, so that a retry within it takes the key
	// over and checks for the dead owner's writes instead of claiming the
	// key afresh. Defaults to 24h.
	TTL time.Duration
	// Lease is how long a claim stays valid without renewal; the owner
	// renews it every Lease/3, so it bounds how long a crashed owner blocks
	// its key. Defaults to 30s.
	Lease time.Duration
	// WaitTimeout bounds how long [Store.Begin] waits for a concurrent
	// owner of the same key. Defaults to 10s.
	WaitTimeout time.Duration
	// CallTimeout bounds each claim [Store.Begin] sends to Redis: a Redis
	// that does not answer within it makes Begin fail with [ErrUnavailable]
	// (the request does not run), and a claim that lands later is released.
	// Defaults to 2s.
	CallTimeout time.Duration
	// Logger receives lost claims and renewal failures. Defaults to
	// discarding.
	Logger *slog.Logger
	// Metrics registers kumiko_idempotency_replays_total and
	// kumiko_idempotency_reclaims_total. Defaults to none.
	Metrics prometheus.Registerer
}

// Store is the Redis idempotency store. It is safe for concurrent use.
type Store struct {
	// cmd sends the store's commands (autopipelined, see redisauto).
	cmd      *redisauto.Client
	prefix   string
	ttl      time.Duration
	lease    time.Duration
	wait     time.Duration
	call     time.Duration
	log      *slog.Logger
	replays  prometheus.Counter
	reclaims prometheus.Counter

	// batching: the client is one node (or a failover client), so one
	// script may touch the keys of several finishes.
	batching bool

	// finishes holds the responses of FinishAsync until a claim carries
	// them to Redis (rideAlong) or rideDelay passes, and sends them in
	// batches.
	finishes batcher[queuedFinish]

	// mu guards closed; finishing counts FinishAsync calls in flight.
	mu        sync.Mutex
	closed    bool
	finishing sync.WaitGroup
}

// queuedFinish is a response FinishAsync has yet to store.
type queuedFinish struct {
	c      *Claim
	r      Response
	header []byte
	done   func(error)
}

// New returns a store on rdb. It fails when rdb is nil or the metrics
// cannot be registered.
func New(rdb redis.UniversalClient, cfg *Config) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("idempotency: nil redis client")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Store{
		cmd: redisauto.New(rdb),
		// A cluster or ring spreads keys over nodes: one key per script.
		batching: isSingleNode(rdb),
		prefix:   cmp.Or(cfg.Prefix, DefaultPrefix),
		ttl:      cmp.Or(max(cfg.TTL, 0), DefaultTTL),
		lease:    cmp.Or(max(cfg.Lease, 0), DefaultLease),
		wait:     cmp.Or(max(cfg.WaitTimeout, 0), DefaultWaitTimeout),
		call:     cmp.Or(max(cfg.CallTimeout, 0), DefaultCallTimeout),
		log:      cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Name: "kumiko_idempotency_replays_total",
			Help: "Keyed requests answered with the stored response of an earlier request."}),
		reclaims: prometheus.NewCounter(prometheus.CounterOpts{Name: "kumiko_idempotency_reclaims_total",
			Help: "Keys claimed again after their owner's lease ran out (a crashed owner)."}),
	}
	s.finishes = batcher[queuedFinish]{take: batchTake(func(f queuedFinish) int { return len(f.r.Body) + len(f.header) }),
		run: s.storeFinishesBounded, delay: rideDelay}
	if cfg.Metrics != nil {
		var err error
		if s.replays, err = metrics.Register(cfg.Metrics, s.replays); err != nil {
			return nil, err
		}
		if s.reclaims, err = metrics.Register(cfg.Metrics, s.reclaims); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// TTL returns how long keys are kept.
func (s *Store) TTL() time.Duration { return s.ttl }

// pendingTTL is the expiry of a pending record, set at its claim and at
// each renewal: TTL past the end of its lease. A record that expired with
// its lease (a TTL as short as the lease) would let the retry of a dead
// owner's request claim the key afresh, skipping the check for the writes
// that owner committed, and run the write again.
func (s *Store) pendingTTL() time.Duration { return s.lease + s.ttl }

// releasedTTL is the expiry of a released fresh claim's record: as long as
// a duplicate that saw the claim pending may still be waiting for it (and
// at least a lease), so that it claims the key at once instead of taking
// the record for one Redis forgot.
func (s *Store) releasedTTL() time.Duration { return max(s.lease, s.wait) }

// Scope names one key of one caller.
type Scope struct {
	// TenantID is the caller's tenant.
	TenantID string
	// UserID is the caller.
	UserID string
	// Key is the client's idempotency key ([ValidKey]).
	Key string
}

// ValidKey reports whether k may be an idempotency key: 1 to 255
// printable ASCII characters, no space.
func ValidKey(k string) bool {
	if k == "" || len(k) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// redisKey returns the hash of sc.
func (s *Store) redisKey(sc Scope) string {
	return s.prefix + ":" + url.QueryEscape(sc.TenantID) + ":" + url.QueryEscape(sc.UserID) + ":" + url.QueryEscape(sc.Key)
}

// Fingerprint hashes the parts of a request (length-prefixed, so that
// parts cannot run into each other) into a hex SHA-256.
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		l := uint64(len(p))
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Response is a stored response.
type Response struct {
	// Status is the HTTP status.
	Status int
	// Header holds the headers that are replayed.
	Header http.Header
	// Body is the body, byte for byte.
	Body []byte
}

// claimScript: KEYS[1] record; ARGV owner, fingerprint, lease ms, expiry ms
// (of a pending record: [Store.pendingTTL]), and the owner and 'since' of
// the pending record the caller saw on its previous call ("" for none).
// A claim run twice by its owner (go-redis retries a command whose answer
// was late) answers the same both times: claimed, or reclaimed with the
// previous owner (kept as 'prev'), so that a lost answer to a reclaim does
// not skip the caller's check for the dead owner's writes. A reclaim answers the previous
// owner and how long before (ms, on Redis's clock) the key's first owner
// claimed it: 'since' is set by the fresh claim only, because every owner
// since then (not only the last) may have committed the write.
//
// A record that is gone although the caller saw it pending (Redis
// restarted empty, or was flushed, while its owner ran; a released key
// leaves a 'released' record instead) is not claimed afresh: its owner may
// still run and commit the write, and nothing makes it check for a second
// owner's writes within its lease. The pending record is restored as the
// caller saw it, with a new lease ('restored'): the owner's renewals and
// its finish find their claim again, the caller waits for the result, and
// should the owner be gone, the key is taken over when that lease ends,
// with the check for the writes it committed.
var claimScript = redisauto.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'fp', 'lease', 'since')
if not r[1] and ARGV[5] and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[5], 'fp', ARGV[2], 'lease', now + tonumber(ARGV[3]))
  if ARGV[6] and ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'since', ARGV[6]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'restored', ARGV[3], ARGV[5], ARGV[6]}
end
if not r[1] or r[1] == 'released' then
  if r[1] then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[1], 'fp', ARGV[2], 'lease', now + tonumber(ARGV[3]), 'since', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'claimed'}
end
if r[1] == 'pending' and r[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'lease', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  local p = redis.call('HMGET', KEYS[1], 'prev', 'since')
  if p[1] then
    return {'reclaimed', p[1], p[2] and tostring(now - tonumber(p[2])) or ''}
  end
  return {'claimed'}
end
if r[3] ~= ARGV[2] then return {'mismatch'} end
if r[1] == 'done' then
  local d = redis.call('HMGET', KEYS[1], 'status', 'header', 'body')
  return {'done', d[1], d[2], d[3]}
end
local lease = tonumber(r[4]) or 0
if lease <= now then
  local since = tonumber(redis.call('HGET', KEYS[1], 'since'))
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease', now + tonumber(ARGV[3]), 'prev', r[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'reclaimed', r[2], since and tostring(now - since) or ''}
end
return {'pending', tostring(lease - now), r[2], r[5] or ''}`)

// renewScript: KEYS[1] record; ARGV owner, lease ms, expiry ms
// ([Store.pendingTTL]), fingerprint, how long ago (ms) the key's first
// owner claimed it at the latest, and the previous owner ("" for none). The record's
// expiry moves with its lease, as at the claim: an owner that runs longer
// than the TTL keeps its key (else a duplicate would claim it afresh and
// run again), and a record outlives its lease by the TTL after a renewal as
// after the claim, for the reclaim that checks the owner's writes. A record
// that is gone (Redis restarted empty, or was flushed; a finished or
// released key leaves a record) is put back: the key is still this
// owner's, and a request with it must wait for its result, not run again.
var renewScript = redisauto.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not r[1] then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[1], 'fp', ARGV[4], 'since', now - tonumber(ARGV[5]))
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'prev', ARGV[6]) end
elseif r[1] ~= 'pending' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'lease', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

// finishScript stores the responses of several records: KEYS the records;
// ARGV ttl ms, then owner, status, header, body and fingerprint for each
// record. It answers 1 (stored) or 0 (not the owner) for each record. A
// record its owner finished already answers 1: go-redis may run the script
// again when its first answer was lost. A record that is gone (Redis
// restarted empty, or was flushed, while its owner ran; a released key
// leaves a record) gets the response too: the key was this owner's, and a
// retry must replay what it did, not run it again.
var finishScript = redisauto.NewScript(`
local out = {}
for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 5
  local r = redis.call('HMGET', key, 'state', 'owner')
  if r[1] == 'done' and r[2] == ARGV[a] then
    out[i] = 1
  elseif r[1] and (r[1] ~= 'pending' or r[2] ~= ARGV[a]) then
    out[i] = 0
  else
    if not r[1] then redis.call('HSET', key, 'owner', ARGV[a], 'fp', ARGV[a + 4]) end
    redis.call('HSET', key, 'state', 'done', 'status', ARGV[a + 1], 'header', ARGV[a + 2], 'body', ARGV[a + 3])
    redis.call('HDEL', key, 'lease')
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  end
end
return out`)

// releaseScript: KEYS[1] record; ARGV owner, expiry ms of a released
// fresh claim ([Store.releasedTTL]). A fresh claim
// becomes a 'released' record, which the next claim takes afresh (whatever
// its fingerprint): a duplicate that saw the key pending tells it from a
// record Redis forgot (see claimScript). A
// reclaimed one (it has 'prev') keeps its record with the lease run out,
// so that the next request reclaims it at once and still checks for the
// dead owner's writes (a fresh claim would skip that check; 'since' keeps
// the span to search); the owner becomes 'released:<owner>', so that a
// renewal of the releaser still on its way does not take the key back.
var releaseScript = redisauto.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'prev')
if r[1] ~= 'pending' or r[2] ~= ARGV[1] then return 0 end
if r[3] then
  redis.call('HSET', KEYS[1], 'owner', 'released:' .. ARGV[1], 'lease', 0)
else
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'released')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1`)

// Begin claims sc's key for a request with fingerprint fp, or returns the
// stored response of the request that used it before. It waits (polling,
// at most [Config].WaitTimeout) while another owner holds the key. Exactly
// one of the claim and the response is non-nil on success. Errors:
// [ErrKeyReused], [ErrInProgress], [ErrUnavailable] (wrapping the Redis
// error) and ctx's error.
func (s *Store) Begin(ctx context.Context, sc Scope, fp string) (*Claim, *Response, error) {
	if !ValidKey(sc.Key) {
		return nil, nil, fmt.Errorf("idempotency: invalid key %q", sc.Key)
	}
	key := s.redisKey(sc)
	owner := newOwner()
	deadline := time.Now().Add(s.wait)
	pause := 5 * time.Millisecond
	ride := s.rideAlong()
	// The owner and 'since' of the pending record seen last: should the
	// record be gone at the next call, it is restored (see claimScript).
	var seenOwner, seenSince string
	for {
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, s.call)
		res, err := s.cmd.RunThen(cctx, claimScript, []string{key}, s.releaseLate(key, owner),
			owner, fp, s.lease.Milliseconds(), s.pendingTTL().Milliseconds(), seenOwner, seenSince).Slice()
		cancel()
		if ride != nil {
			ride(err == nil)
			ride = nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			return nil, nil, fmt.Errorf("%w: claim: %w", ErrUnavailable, err)
		}
		kind, _ := res[0].(string)
		switch kind {
		case "claimed":
			return s.newClaim(key, owner, fp, "", 0, sent), nil, nil
		case "reclaimed":
			prev, _ := res[1].(string)
			s.reclaims.Inc()
			s.log.Warn("idempotency key reclaimed after its owner's lease ran out", "key", sc.Key, "previous_owner", prev, "owner", owner)
			var previousAge time.Duration
			if len(res) > 2 {
				age, _ := res[2].(string)
				if ms, err := strconv.ParseInt(age, 10, 64); err == nil && ms >= 0 {
					previousAge = time.Duration(ms) * time.Millisecond
				}
			}
			return s.newClaim(key, owner, fp, prev, previousAge, sent), nil, nil
		case "mismatch":
			return nil, nil, ErrKeyReused
		case "done":
			resp, err := decodeResponse(res[1:])
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			s.replays.Inc()
			return nil, resp, nil
		case "pending", "restored":
			if kind == "restored" {
				s.log.Warn("idempotency key vanished while its owner ran (redis restarted empty or was flushed); its pending claim restored",
					"key", sc.Key, "owner", seenOwner)
			}
			remaining, _ := res[1].(string)
			if len(res) > 3 {
				seenOwner, _ = res[2].(string)
				seenSince, _ = res[3].(string)
			}
			leaseLeft, _ := strconv.Atoi(remaining)
			wait := min(pause, time.Duration(leaseLeft+1)*time.Millisecond)
			if time.Now().Add(wait).After(deadline) {
				return nil, nil, ErrInProgress
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, nil, ctx.Err()
			case <-t.C:
			}
			pause = min(pause*2, 100*time.Millisecond)
		default:
			return nil, nil, fmt.Errorf("%w: unexpected claim answer %v", ErrUnavailable, res)
		}
	}
}

// rideDelay is how long a response queued by [Claim.FinishAsync] waits
// for a claim to carry it to Redis before it is sent on its own.
const rideDelay = 2 * time.Millisecond

// rideAlong sends the responses queued for storing (a batch of them), so
// that the claim sent next shares their pipeline: under load, storing a
// response then costs no round trip of its own, in this process or in
// Redis. It returns what reports their outcomes once the claim was
// answered (claimed: it was, without error), or nil when none was queued.
// That reports them at once when their answer is in (the pipeline keeps
// order, so it came before the claim's), else from a goroutine of its own:
// Begin never waits for them (after a NOSCRIPT answer, for instance, they
// are sent again after the claim), which would bound it by their 10 s
// instead of CallTimeout and its context.
func (s *Store) rideAlong() func(claimed bool) {
	if !s.batching {
		return nil
	}
	batch := s.finishes.takeBatch()
	if batch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	r := s.startFinishes(ctx, batch)
	report := func() {
		defer cancel()
		s.reportFinishes(ctx, batch, r)
	}
	return func(claimed bool) {
		if claimed && r.Answered() {
			report()
			return
		}
		go report()
	}
}

// releaseLate returns what to do with a claim answered after Begin stopped
// waiting for it: release the key, if the claim took it, so that the
// client's retry runs at once instead of after the lease (a reclaim is
// released so that the retry reclaims it, see releaseScript).
func (s *Store) releaseLate(key, owner string) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		res, err := cmd.Slice()
		if err != nil || len(res) == 0 || (res[0] != "claimed" && res[0] != "reclaimed") {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		defer cancel()
		if err := s.cmd.Run(ctx, releaseScript, []string{key}, owner, s.releasedTTL().Milliseconds()).Err(); err != nil {
			s.log.Warn("idempotency claim answered too late not released; its lease runs out", "owner", owner, "error", err)
		}
	}
}

func decodeResponse(f []any) (*Response, error) {
	if len(f) != 3 {
		return nil, errors.New("stored response is incomplete")
	}
	st, _ := f[0].(string)
	hdr, _ := f[1].(string)
	body, _ := f[2].(string)
	status, err := strconv.Atoi(st)
	if err != nil {
		return nil, fmt.Errorf("stored status %q: %w", st, err)
	}
	r := &Response{Status: status, Body: []byte(body), Header: http.Header{}}
	if hdr != "" {
		if err := json.Unmarshal([]byte(hdr), &r.Header); err != nil {
			return nil, fmt.Errorf("stored header: %w", err)
		}
	}
	return r, nil
}

func newOwner() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Claim is the ownership of one key. Its lease is renewed in the
// background until [Claim.Finish] or [Claim.Release] (or the store of
// [Claim.FinishAsync]) is done; call one of them exactly once.
type Claim struct {
	s        *Store
	key      string
	owner    string
	fp       string
	previous string
	// sent is when the claim was sent to Redis.
	sent time.Time
	// previousAge is how long before this claim the key's first owner
	// claimed it (0: unknown, or no previous owner).
	previousAge time.Duration
	// mu guards timer and stopped: a stopped claim is not renewed again. A
	// renewal already on its way to Redis is not waited for: the script
	// only extends a pending claim of this owner, so once the claim is
	// finished or released it changes nothing.
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	// heldUntil (guarded by mu) is when the lease ends at the earliest: the
	// time the claim or its last successful renewal was sent, plus the
	// lease (Redis set it from a later reading of its clock).
	heldUntil time.Time
}

// newClaim returns the claim and starts its renewals: every field they
// read is set before.
func (s *Store) newClaim(key, owner, fp, previous string, previousAge time.Duration, sent time.Time) *Claim {
	c := &Claim{s: s, key: key, owner: owner, fp: fp, previous: previous, previousAge: previousAge, sent: sent, heldUntil: sent.Add(s.lease)}
	c.mu.Lock()
	c.timer = time.AfterFunc(s.lease/3, c.renew)
	c.mu.Unlock()
	return c
}

// Owner returns the claim's owner token.
func (c *Claim) Owner() string { return c.owner }

// HeldUntil returns when the claim's lease ends at the earliest, on this
// process's clock, as far as its successful claim and renewals tell: no
// other owner can take the key over before it. Renewals move it on.
func (c *Claim) HeldUntil() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldUntil
}

// PreviousOwner returns the owner whose expired lease this claim took over
// ("" for a fresh claim).
func (c *Claim) PreviousOwner() string { return c.previous }

// PreviousSince returns how long before this claim the key's first owner
// claimed it (measured on Redis's clock, so the other servers' clock
// offsets do not matter), or 0 when there was no previous owner or its
// claim did not record the time (a key claimed by an older version). What
// any previous owner did with the key (the first, or one that took it over
// and died too) happened within it.
func (c *Claim) PreviousSince() time.Duration { return c.previousAge }

// renew extends the lease and schedules the next renewal (a timer, not a
// goroutine per claim: most requests finish long before the first one).
func (c *Claim) renew() {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), c.s.lease/3)
	// The key's first owner claimed it at most this long ago (should Redis
	// have forgotten the record, see renewScript).
	age := time.Since(c.sent) + c.previousAge
	ok, err := c.s.cmd.Run(ctx, renewScript, []string{c.key}, c.owner, c.s.lease.Milliseconds(), c.s.pendingTTL().Milliseconds(),
		c.fp, age.Milliseconds(), c.previous).Int()
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	switch {
	case err != nil:
		c.s.log.Warn("idempotency lease renewal failed", "owner", c.owner, "error", err)
	case ok == 0:
		c.s.log.Warn("idempotency claim lost to another owner", "owner", c.owner)
		return
	default:
		c.heldUntil = sent.Add(c.s.lease)
	}
	c.timer.Reset(c.s.lease / 3)
}

// stopRenewal ends the renewals (one already on its way is harmless, see
// Claim.mu).
func (c *Claim) stopRenewal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.timer.Stop()
}

// isSingleNode reports whether every key lives on rdb's one server.
func isSingleNode(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.Client)
	return ok
}

// Finish stores r as the key's outcome, unless the claim was taken over or
// finished ([ErrNotOwner]). A Redis failure is wrapped in [ErrUnavailable];
// the key then stays pending until its lease runs out.
func (c *Claim) Finish(ctx context.Context, r Response) error {
	defer c.stopRenewal()
	hdr, err := json.Marshal(r.Header)
	if err != nil {
		return fmt.Errorf("idempotency: encode header: %w", err)
	}
	return c.s.finishOne(ctx, c, r, hdr)
}

// finishOne stores one response.
func (s *Store) finishOne(ctx context.Context, c *Claim, r Response, hdr []byte) error {
	var out error
	s.storeFinishes(ctx, []queuedFinish{{c: c, r: r, header: hdr, done: func(err error) { out = err }}})
	return out
}

// finishOutcome turns a finish script's answer into Finish's error.
func finishOutcome(ok int, err error) error {
	if err != nil {
		return fmt.Errorf("%w: finish: %w", ErrUnavailable, err)
	}
	if ok == 0 {
		return ErrNotOwner
	}
	return nil
}

// batchTimeout bounds the script call of a batch (and of a finish after
// Close).
const batchTimeout = 10 * time.Second

// maxBatch and maxBatchBytes cap the responses stored by one script call
// (the bytes are a soft cap: a batch holds at least one).
const (
	maxBatch      = 64
	maxBatchBytes = 256 << 10
)

// maxQueued caps the responses waiting for a batch; beyond it FinishAsync
// stores synchronously, so that a Redis slower than the requests holds
// them back instead of growing the queue without bound.
const maxQueued = 4096

// FinishAsync is [Claim.Finish] done by the store in the background, so
// that the caller can answer its client at once; done (when not nil) gets
// Finish's error. The response waits up to 2 ms for the next claim
// ([Store.Begin]) to carry it in the same pipeline; the responses queued
// meanwhile are stored together, in one script call. The lease is renewed
// until the response is stored, so a retry that arrives meanwhile waits
// for it like any duplicate, however long the store takes. [Store.Close]
// waits for them. After Close, and while more than maxQueued responses
// wait, it runs synchronously.
func (c *Claim) FinishAsync(r Response, done func(error)) {
	if done == nil {
		done = func(error) {}
	}
	hdr, err := json.Marshal(r.Header)
	if err != nil {
		c.stopRenewal()
		done(fmt.Errorf("idempotency: encode header: %w", err))
		return
	}
	s := c.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		defer cancel()
		err := s.finishOne(ctx, c, r, hdr)
		c.stopRenewal()
		done(err)
		return
	}
	s.finishing.Add(1)
	s.mu.Unlock()
	f := queuedFinish{c: c, r: r, header: hdr, done: func(err error) {
		c.stopRenewal()
		done(err)
		s.finishing.Done()
	}}
	switch {
	case !s.batching:
		go s.storeFinishesBounded([]queuedFinish{f})
	case !s.finishes.tryAdd(f, maxQueued):
		s.storeFinishesBounded([]queuedFinish{f})
	}
}

// storeFinishesBounded is storeFinishes within batchTimeout.
func (s *Store) storeFinishesBounded(batch []queuedFinish) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	s.storeFinishes(ctx, batch)
}

// storeFinishes stores batch in one script call and reports each outcome
// to its done.
func (s *Store) storeFinishes(ctx context.Context, batch []queuedFinish) {
	s.reportFinishes(ctx, batch, s.startFinishes(ctx, batch))
}

// startFinishes sends the script call that stores batch.
func (s *Store) startFinishes(ctx context.Context, batch []queuedFinish) *redisauto.Running {
	keys := make([]string, len(batch))
	args := make([]any, 0, 1+5*len(batch))
	args = append(args, s.ttl.Milliseconds())
	for i, f := range batch {
		keys[i] = f.c.key
		args = append(args, f.c.owner, f.r.Status, f.header, f.r.Body, f.c.fp)
	}
	return s.cmd.Start(ctx, finishScript, keys, args...)
}

// reportFinishes waits for the answer of r, the script call storing
// batch, and reports each outcome to its done.
func (s *Store) reportFinishes(ctx context.Context, batch []queuedFinish, r *redisauto.Running) {
	oks, err := r.Wait(ctx).Int64Slice()
	if err == nil && len(oks) != len(batch) {
		err = fmt.Errorf("finish script answered %d of %d", len(oks), len(batch))
	}
	for i, f := range batch {
		ok := 0
		if err == nil {
			ok = int(oks[i])
		}
		f.done(finishOutcome(ok, err))
	}
}

// batchTake returns the take function of a batcher: at most maxBatch
// items, and items of at most about maxBatchBytes (by size).
func batchTake[T any](size func(T) int) func([]T) int {
	return func(queue []T) int {
		n, bytes := 0, 0
		for n < len(queue) && n < maxBatch && (n == 0 || bytes < maxBatchBytes) {
			bytes += size(queue[n])
			n++
		}
		return n
	}
}

// Close waits for the responses [Claim.FinishAsync] is still storing, at
// most until ctx ends (then it returns ctx's error). It does not close the
// Redis client. Call it at shutdown, after the HTTP server stopped.
func (s *Store) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.finishing.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("idempotency: close: %w", ctx.Err())
	}
}

// Release gives the key up without a result (the request did not run, or
// failed in a way a retry may fix), so that the next request with it runs.
// A claim taken over from a dead owner is released as a run-out lease: the
// next request reclaims the key at once, with the dead owner as its
// [Claim.PreviousOwner], so that it checks for that owner's writes again.
// It returns [ErrNotOwner] when the claim was taken over meanwhile.
func (c *Claim) Release(ctx context.Context) error {
	c.stopRenewal()
	ok, err := c.s.cmd.Run(ctx, releaseScript, []string{c.key}, c.owner, c.s.releasedTTL().Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("%w: release: %w", ErrUnavailable, err)
	}
	if ok == 0 {
		return ErrNotOwner
	}
	return nil
}

// Abandon stops renewing the lease without touching the key, as a crashed
// owner would; the key is claimable again once the lease runs out, and the
// next claim reports this owner as [Claim.PreviousOwner]. Tests use it to
// simulate a crash; the HTTP layer uses it for a claim it can neither run
// nor release.
func (c *Claim) Abandon() { c.stopRenewal() }
