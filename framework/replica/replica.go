package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kumiko-go/kumiko/framework/metrics"
	dto "github.com/prometheus/client_model/go"

	"github.com/kumiko-go/kumiko/framework"
)

// Defaults of [Config].
const (
	DefaultWaitTimeout  = 500 * time.Millisecond
	DefaultPollInterval = 2 * time.Millisecond
	DefaultCooldown     = time.Second
)

// Config tunes [New]. A nil *Config means the defaults.
type Config struct {
	// WaitTimeout bounds how long a query with a consistency token waits
	// for the replica to replay past it before it runs on the primary.
	// Defaults to 500ms.
	WaitTimeout time.Duration
	// PollInterval is the first pause between two replay checks; it
	// doubles up to 8 times that. Defaults to 2ms.
	PollInterval time.Duration
	// Cooldown is how long queries go straight to the primary after the
	// replica failed (so that an unreachable replica does not add its
	// connect timeout to every query). Defaults to 1s.
	Cooldown time.Duration
	// Logger receives replica failures. Defaults to discarding.
	Logger *slog.Logger
	// Metrics registers kumiko_replica_fallbacks_total{reason}. Defaults
	// to none.
	Metrics prometheus.Registerer
}

// Router sends queries to the replica, and a query whose consistency token
// the replica has not replayed in time to the primary. It is safe for
// concurrent use.
type Router struct {
	primary   *pgxpool.Pool
	replica   *pgxpool.Pool
	wait      time.Duration
	poll      time.Duration
	cooldown  time.Duration
	downUntil atomic.Int64 // unix nanos until which the replica is skipped
	// primaryLSN is the highest WAL insert position the primary was seen
	// at: a token at or below it came from a write of this database.
	primaryLSN atomic.Uint64
	log        *slog.Logger
	fallbacks  *prometheus.CounterVec
}

// Fallback reasons, the values of the reason label.
const (
	// ReasonLag: the replica had not replayed the token within the wait,
	// or every replica connection stayed in use by other queries.
	ReasonLag = "lag"
	// ReasonError: the replica could not be reached or answered an error.
	ReasonError = "error"
	// ReasonRecoveryConflict: the replica cancelled the query because it
	// conflicted with the replay of the primary's changes (SQLSTATE 40001
	// or 40P01 from a hot standby, "canceling statement due to conflict
	// with recovery").
	ReasonRecoveryConflict = "recovery_conflict"
)

// New returns a router over the primary and replica pools. It fails when a
// pool is nil or the metrics cannot be registered.
func New(primary, replica *pgxpool.Pool, cfg *Config) (*Router, error) {
	if primary == nil || replica == nil {
		return nil, errors.New("replica: primary and replica pools are required")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	r := &Router{
		primary:  primary,
		replica:  replica,
		wait:     cmp.Or(max(cfg.WaitTimeout, 0), DefaultWaitTimeout),
		poll:     cmp.Or(max(cfg.PollInterval, 0), DefaultPollInterval),
		cooldown: cmp.Or(max(cfg.Cooldown, 0), DefaultCooldown),
		log:      cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_replica_fallbacks_total",
			Help: "Queries that ran on the primary instead of the replica: its replay lagged behind their consistency token (lag), it failed (error), or it cancelled the query for a conflict with recovery (recovery_conflict).",
		}, []string{"reason"}),
	}
	if cfg.Metrics != nil {
		var err error
		if r.fallbacks, err = metrics.Register(cfg.Metrics, r.fallbacks); err != nil {
			return nil, fmt.Errorf("replica: %w", err)
		}
	}
	// At 0 from the start, so that rate() sees the first fallback.
	for _, reason := range []string{ReasonLag, ReasonError, ReasonRecoveryConflict} {
		r.fallbacks.WithLabelValues(reason)
	}
	return r, nil
}

// caughtUpSQL reports whether the server has replayed past the token. A
// server that is not in recovery has every write it will ever serve: one
// that never was (pg_last_wal_replay_lsn() is NULL) and one that was, a
// promoted standby or a primary after crash recovery, whose
// pg_last_wal_replay_lsn() stays frozen where recovery ended.
const caughtUpSQL = `SELECT NOT pg_is_in_recovery() OR coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`

// AcquireRead implements [framework.ReadRouter]: a replica connection,
// checked against token when there is one, else a primary connection. A
// malformed token is a bad_request *framework.Error.
//
// With a token, the replica's answers are awaited for at most twice
// Config.WaitTimeout in all: a replica that takes the connection or the
// check and never answers (a frozen host, a network that drops packets)
// counts as failed, like one that refuses, instead of holding the query
// until the caller's context ends.
func (r *Router) AcquireRead(ctx context.Context, token string) (*pgxpool.Conn, error) {
	conn, _, err := r.AcquireReadConn(ctx, token)
	return conn, err
}

// ReplicaLost implements [framework.ReadFailover]: a query lost its replica
// connection with err (the replica stopped, restarted or crashed). It
// counts an error fallback, starts the cooldown and returns a primary
// connection for the query to run once more on.
func (r *Router) ReplicaLost(ctx context.Context, err error) (*pgxpool.Conn, error) {
	return r.fallback(ctx, ReasonError, err)
}

// ReplicaConflict implements [framework.ReadFailover]: the replica
// cancelled a query for a conflict with recovery. It counts a
// recovery_conflict fallback and returns a primary connection for the
// query to run once more on; the replica works, so no cooldown starts.
func (r *Router) ReplicaConflict(ctx context.Context, _ error) (*pgxpool.Conn, error) {
	return r.fallback(ctx, ReasonRecoveryConflict, nil)
}

// AcquireReadConn implements [framework.ReadFailover]: [Router.AcquireRead]
// that also reports whether the connection is the replica's.
func (r *Router) AcquireReadConn(ctx context.Context, token string) (*pgxpool.Conn, bool, error) {
	if token != "" && !framework.ValidConsistencyToken(token) {
		return nil, false, &framework.Error{Code: framework.CodeBadRequest, Message: "malformed consistency token: send back the token of a write response unchanged"}
	}
	if time.Now().UnixNano() < r.downUntil.Load() {
		return r.fallbackRead(ctx, ReasonError, nil)
	}
	deadline := time.Now().Add(r.wait)
	// actx bounds the replica's answers (acquiring, which may dial or ping,
	// and the checks): WaitTimeout decides lag, and a check begun just
	// before it gets as long again to answer.
	actx := ctx
	if token != "" {
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(ctx, deadline.Add(r.wait))
		defer cancel()
	}
	conn, err := r.replica.Acquire(actx)
	if err != nil {
		return r.acquireFailed(ctx, err)
	}
	if token == "" {
		return conn, true, nil
	}
	pause := r.poll
	checkedPrimary := false
	for {
		var ok bool
		if err := conn.QueryRow(actx, caughtUpSQL, token).Scan(&ok); err != nil {
			conn.Release()
			if ctx.Err() != nil {
				return nil, false, err
			}
			return r.fallbackRead(ctx, ReasonError, err)
		}
		if ok {
			return conn, true, nil
		}
		// The query waits without the connection: while the replica lags,
		// the queries without a token (and the other waiters' checks) use
		// it meanwhile. The next check takes one again and, once it
		// passes, the query runs on the connection it checked.
		conn.Release()
		if !checkedPrimary {
			// The slow path only: a token the replica has not replayed yet
			// must be one the primary has written, or it is made up and
			// would be waited for in vain.
			checkedPrimary = true
			if r.aheadOfPrimary(actx, token) {
				return nil, false, errTokenAhead()
			}
		}
		if time.Until(deadline) < pause {
			return r.fallbackRead(ctx, ReasonLag, nil)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false, ctx.Err()
		case <-t.C:
		}
		pause = min(pause*2, 8*r.poll)
		if conn, err = r.replica.Acquire(actx); err != nil {
			return r.acquireFailed(ctx, err)
		}
	}
}

// acquireFailed answers a replica Acquire that failed with err: the
// caller's context ended, every replica connection stayed in use (a lag
// fallback: the replica is busy, not failed), or the replica failed.
func (r *Router) acquireFailed(ctx context.Context, err error) (*pgxpool.Conn, bool, error) {
	if ctx.Err() != nil {
		return nil, false, err
	}
	if st := r.replica.Stat(); st.AcquiredConns() >= st.MaxConns() {
		// Every replica connection is in use by other queries: the
		// replica is busy, not failed. This query goes to the primary,
		// the others keep the replica (no cooldown).
		return r.fallbackRead(ctx, ReasonLag, nil)
	}
	return r.fallbackRead(ctx, ReasonError, err)
}

// errTokenAhead refuses a token beyond the primary's WAL position.
func errTokenAhead() error {
	return &framework.Error{
		Code: framework.CodeBadRequest,
		Message: "consistency token is ahead of the database: it was not answered by a write of this database " +
			"(or that write was lost in a failover); send back the token of a write response unchanged, or none",
		Err: framework.ErrConsistencyTokenAhead,
	}
}

// primaryWALSQL reads the primary's WAL insert position, the position a
// write's token is taken at.
const primaryWALSQL = `SELECT pg_current_wal_insert_lsn()::text`

// aheadOfPrimary reports whether token is beyond the primary's current WAL
// insert position. A token at or below a position seen before needs no
// round trip; when the primary cannot be asked, the token is taken as
// written (the query waits and falls back as before).
func (r *Router) aheadOfPrimary(ctx context.Context, token string) bool {
	t, ok := parseLSN(token)
	if !ok || t <= r.primaryLSN.Load() {
		return false
	}
	var pos string
	if err := r.primary.QueryRow(ctx, primaryWALSQL).Scan(&pos); err != nil {
		return false
	}
	p, ok := parseLSN(pos)
	if !ok {
		return false
	}
	for {
		seen := r.primaryLSN.Load()
		if p <= seen || r.primaryLSN.CompareAndSwap(seen, p) {
			break
		}
	}
	return t > p
}

// parseLSN reads a WAL position "X/Y" as a 64-bit number.
func parseLSN(s string) (uint64, bool) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err := strconv.ParseUint(hi, 16, 32)
	if !ok || err != nil {
		return 0, false
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, false
	}
	return h<<32 | l, true
}

// fallbackRead is fallback for AcquireReadConn: no replica connection.
func (r *Router) fallbackRead(ctx context.Context, reason string, cause error) (*pgxpool.Conn, bool, error) {
	conn, err := r.fallback(ctx, reason, cause)
	return conn, false, err
}

// fallback counts and returns a primary connection; a cause starts the
// cooldown.
func (r *Router) fallback(ctx context.Context, reason string, cause error) (*pgxpool.Conn, error) {
	r.fallbacks.WithLabelValues(reason).Inc()
	if cause != nil {
		r.downUntil.Store(time.Now().Add(r.cooldown).UnixNano())
		r.log.Warn("replica unusable, queries run on the primary", "error", cause, "cooldown", r.cooldown.String())
	}
	return r.primary.Acquire(ctx)
}

// Fallbacks returns how many queries ran on the primary for reason
// ([ReasonLag], [ReasonError] or [ReasonRecoveryConflict]) since the
// router was made (or since its collector was first registered).
func (r *Router) Fallbacks(reason string) float64 {
	c, err := r.fallbacks.GetMetricWithLabelValues(reason)
	if err != nil {
		return 0
	}
	return counterValue(c)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}
