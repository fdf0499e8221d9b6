package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/internal/pgliveness"
)

// Mode selects which parts of Kumiko a process runs. It is read from APP_MODE.
type Mode string

const (
	// ModeAPI serves HTTP and per-instance consumers (SSE) and enqueues jobs.
	// It consumes the api job lane only when [Config.RunLocalJobs] is set.
	ModeAPI Mode = "api"
	// ModeWorker runs the shared consumers and the worker job lane. It serves
	// only health and metrics, on [Config.WorkerHTTPAddr].
	ModeWorker Mode = "worker"
	// ModeAllInOne runs everything in one process: HTTP, every consumer and
	// both job lanes. It is the default.
	ModeAllInOne Mode = "all-in-one"
)

// ReservedInstanceID is the instance id of shared consumer delivery. It can
// never be the id of a process, so KUMIKO_INSTANCE_ID refuses it.
const ReservedInstanceID = "__shared__"

// Config is the process configuration read from the environment by [Load] or
// [FromLookup]. Every field has been validated; the zero value is not a
// usable configuration.
type Config struct {
	// Mode is the process shape, read from APP_MODE: "api", "worker" or
	// "all-in-one". Defaults to "all-in-one".
	Mode Mode

	// HTTPAddr is the listen address of the HTTP server (API, SSE, health
	// and metrics) in the api and all-in-one modes, read from HTTP_ADDR. It
	// must have the form host:port. Defaults to ":8080".
	HTTPAddr string

	// WorkerHTTPAddr is the listen address of the health and metrics server
	// of a worker process, read from WORKER_HTTP_ADDR. It must have the form
	// host:port. Defaults to ":8081".
	WorkerHTTPAddr string

	// HTTPReadTimeout bounds reading one request, headers and body, read
	// from HTTP_READ_TIMEOUT_MS as a positive integer number of
	// milliseconds: a client that stalls or trickles its request is cut off.
	// Headers must arrive within 10s (or this timeout, if shorter). It does
	// not bound a handler once the body is read. Defaults to 30s.
	HTTPReadTimeout time.Duration

	// HTTPIdleTimeout is how long a keep-alive connection may sit idle
	// between requests before the server closes it, read from
	// HTTP_IDLE_TIMEOUT_MS as a positive integer number of milliseconds.
	// Behind a load balancer, keep it above the balancer's own idle timeout.
	// Defaults to 120s.
	HTTPIdleTimeout time.Duration

	// DatabaseURL is the PostgreSQL connection string of the primary, read
	// from DATABASE_URL, as a postgres:// or postgresql:// URL or in
	// keyword/value form ("host=db dbname=app"). It is required and must be
	// accepted by [pgxpool.ParseConfig]; another scheme is refused by name.
	DatabaseURL string

	// DatabaseReadURL is the connection string of a read replica, read from
	// DATABASE_READ_URL, in one of DatabaseURL's forms. Queries go to it when set; when empty every query
	// goes to the primary. Defaults to "" (no replica).
	DatabaseReadURL string

	// DatabasePoolMax is the maximum number of connections of each pool
	// (primary and replica), read from DATABASE_POOL_MAX, between 1 and 1000.
	// Every process holds its own pools, so the sum over all processes must
	// stay below the server's max_connections. Defaults to 10.
	DatabasePoolMax int32

	// DatabasePoolIdleTimeout closes pooled connections idle for longer,
	// read from DATABASE_POOL_IDLE_TIMEOUT as a positive Go duration ("30s",
	// "1m") or number of seconds ("30"). Keep it short behind PgBouncer.
	// Defaults to 30s.
	DatabasePoolIdleTimeout time.Duration

	// DatabasePoolConnectTimeout bounds establishing one database
	// connection, read from DATABASE_POOL_CONNECT_TIMEOUT as a Go duration
	// or a number of seconds ("5"); 0 disables the bound. Keep it under the 2 s budget of /health/ready.
	// Defaults to 5s.
	DatabasePoolConnectTimeout time.Duration

	// RedisURL is the Redis URL (redis://, rediss:// or unix://), read from
	// REDIS_URL. It must be accepted by [redis.ParseURL]; another scheme,
	// or none ("cache:6379"), is refused by name. Defaults to
	// "redis://127.0.0.1:6379/0".
	RedisURL string

	// RedisConnectTimeout bounds dialing Redis, read from
	// REDIS_CONNECT_TIMEOUT_MS as a positive integer number of milliseconds.
	// Defaults to 5s.
	RedisConnectTimeout time.Duration

	// RedisCommandTimeout bounds reading and writing one Redis command, read
	// from REDIS_COMMAND_TIMEOUT_MS as a non-negative integer number of
	// milliseconds, at most 86400000 (one day); 0 disables the bound (not
	// recommended: an unreachable Redis then hangs requests). Defaults to
	// 10s.
	RedisCommandTimeout time.Duration

	// RedisMaxRetries is how often a failed Redis command is retried, read
	// from REDIS_MAX_RETRIES_PER_REQUEST as a non-negative integer; 0
	// disables retries. Defaults to 3.
	RedisMaxRetries int

	// InstanceID identifies this process for per-instance consumer delivery,
	// read from KUMIKO_INSTANCE_ID. When empty the framework picks a random
	// one at start ("kumiko-" and 16 hex digits). [ReservedInstanceID] is
	// refused. Defaults to "".
	InstanceID string

	// JWTKeys are the HS256 keys, read from JWT_SECRET (format in
	// [ParseJWTKeys]); the first one signs, all of them verify. It is
	// required unless Mode is [ModeWorker], where it may be nil.
	JWTKeys []JWTKey

	// DispatcherPollInterval is the dispatcher's poll fallback period,
	// read from KUMIKO_DISPATCHER_POLL_INTERVAL_MS as a positive integer
	// number of milliseconds, at most 86400000 (one day). Defaults to 100ms.
	DispatcherPollInterval time.Duration

	// DispatcherBatchSize is the maximum number of events a consumer pass
	// reads, read from KUMIKO_DISPATCHER_BATCH_SIZE, between 1 and 10000.
	// Defaults to 500.
	DispatcherBatchSize int

	// DispatcherMaxConcurrentPasses bounds how many consumer passes run at
	// once in the process (each holds a pool connection), read from
	// KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES, between 1 and 256. Raise it
	// for partitioned consumers, whose partitions run in parallel.
	// Defaults to 2.
	DispatcherMaxConcurrentPasses int

	// DispatcherPollOnly makes the dispatcher poll instead of LISTENing,
	// read from KUMIKO_DISPATCHER_POLL_ONLY (true, false, 1 or 0). Set it
	// when a transaction-pooling PgBouncer sits in front of PostgreSQL.
	// Defaults to false.
	DispatcherPollOnly bool

	// DrainTimeout bounds the graceful shutdown after SIGTERM or SIGINT,
	// read from KUMIKO_DRAIN_TIMEOUT_MS as a positive integer number of
	// milliseconds. Defaults to 30s.
	DrainTimeout time.Duration

	// IdempotencyTTL is how long a finished idempotent write's outcome is
	// kept for replay, read from KUMIKO_IDEMPOTENCY_TTL as a Go duration of
	// at least 30s (the lease of a request's claim); the key of a request
	// whose process died is kept this long after its lease ran out.
	// Defaults to 24h.
	IdempotencyTTL time.Duration

	// ReplicaWait bounds how long a query carrying a consistency token waits
	// for the read replica to replay past it before it runs on the primary,
	// read from KUMIKO_REPLICA_WAIT_MS. Defaults to 500.
	ReplicaWait time.Duration

	// RunLocalJobs makes an api process also consume the api job lane, read
	// from KUMIKO_RUN_LOCAL_JOBS (true, false, 1 or 0). Defaults to false.
	RunLocalJobs bool

	// JobsConcurrency is how many runs each job lane this process consumes
	// runs at once (jobs.Config.Concurrency), read from KUMIKO_JOBS_CONCURRENCY,
	// between 1 and 1000. Runs inside a transaction are bounded as well,
	// by DATABASE_POOL_MAX − 2 (jobs.Config.MaxTransactions). Defaults to 10.
	JobsConcurrency int

	// ReadyMaxLag, when positive, makes /health/ready fail while a consumer
	// of this process has more than this many events after its cursor
	// (entrypoint.Options.ReadyMaxLag), read from KUMIKO_READY_MAX_LAG,
	// between 0 and 1000000000. Defaults to 0: lag is not checked.
	ReadyMaxLag int64

	// Dev enables development-only behaviour such as the dev token of the
	// demo page and the sample nightly report every minute, read from
	// KUMIKO_DEV (true, false, 1 or 0). Never set it in production. Defaults
	// to false.
	Dev bool

	// SampleCron replaces the schedule of the sample users:job:nightly-report
	// (02:00 UTC, or every minute with Dev), read from KUMIKO_SAMPLE_CRON as a
	// spec [jobs.Cron] accepts, such as "@every 2s" (what the tests use).
	// Defaults to "" (the sample's own schedule).
	SampleCron string

	// LogLevel is the minimum level logged, read from LOG_LEVEL: debug,
	// info, warn or error (any case). Defaults to [slog.LevelInfo].
	LogLevel slog.Level
}

// Defaults of the optional variables.
const (
	defaultMode                   = ModeAllInOne
	defaultHTTPAddr               = ":8080"
	defaultWorkerHTTPAddr         = ":8081"
	defaultHTTPReadTimeout        = 30000 * time.Millisecond
	defaultHTTPIdleTimeout        = 120000 * time.Millisecond
	defaultDatabasePoolMax        = 10
	defaultDatabasePoolIdle       = 30 * time.Second
	defaultDatabasePoolConnect    = 5 * time.Second
	defaultRedisURL               = "redis://127.0.0.1:6379/0"
	defaultRedisConnectTimeout    = 5000 * time.Millisecond
	defaultRedisCommandTimeout    = 10000 * time.Millisecond
	defaultRedisMaxRetries        = 3
	defaultDispatcherPollInterval = 100 * time.Millisecond
	defaultDispatcherBatchSize    = 500
	defaultDispatcherPasses       = 2
	defaultJobsConcurrency        = 10
	defaultDrainTimeout           = 30000 * time.Millisecond
	defaultIdempotencyTTL         = 24 * time.Hour
	defaultReplicaWait            = 500 * time.Millisecond
	defaultLogLevel               = slog.LevelInfo

	maxDatabasePoolMax     = 1000
	maxDispatcherBatchSize = 10000
	maxDispatcherPasses    = 256
	maxJobsConcurrency     = 1000
	maxReadyMaxLag         = 1_000_000_000
	// maxRedisCommandTimeout bounds the command timeout: go-redis waits for
	// a pooled connection for it plus 1 s, which must not overflow.
	maxRedisCommandTimeout = 24 * time.Hour
	// minIdempotencyTTL is the idempotency store's claim lease: a shorter
	// TTL expires a running request's key under it.
	minIdempotencyTTL = 30 * time.Second
	// maxDispatcherPollInterval bounds the poll: the dispatcher jitters it
	// by ±20% in nanoseconds, which overflows far above this.
	maxDispatcherPollInterval = 24 * time.Hour
)

// VarError is one problem with one environment variable. [Load] and
// [FromLookup] return an [errors.Join] of one *VarError per problem.
type VarError struct {
	// Name is the environment variable, e.g. "DATABASE_POOL_MAX".
	Name string
	// Err says what is wrong. It never contains a secret.
	Err error
}

// Error returns "NAME: problem".
func (e *VarError) Error() string { return e.Name + ": " + e.Err.Error() }

// Unwrap returns e.Err.
func (e *VarError) Unwrap() error { return e.Err }

// Load reads the configuration from the process environment. It is
// [FromLookup] with [os.LookupEnv].
func Load() (*Config, error) {
	return FromLookup(os.LookupEnv)
}

// FromLookup reads the configuration through lookup, which reports the value
// of an environment variable and whether it is set; a nil lookup is an empty
// environment. A variable set to "" counts as unset and gets its default.
//
// It checks every variable before returning, and on failure returns a nil
// *Config and an [errors.Join] of one [*VarError] per problem, so that a bad
// deployment learns everything that is wrong at once.
//
// Parsing DATABASE_URL and DATABASE_READ_URL with pgx also consults the
// libpq variables (PGHOST, PGPASSWORD, PGSSLMODE, ...) and files (.pgpass,
// sslrootcert) for settings the connection string leaves out.
func FromLookup(lookup func(string) (string, bool)) (*Config, error) {
	return fromLookup(lookup, true)
}

// fromLookup is [FromLookup]; requireDatabase false makes DATABASE_URL
// optional (checked when set), for a command that opens no database.
func fromLookup(lookup func(string) (string, bool), requireDatabase bool) (*Config, error) {
	l := &loader{lookup: lookup}
	var primary, replica *pgxpool.Config
	c := &Config{Mode: l.mode("APP_MODE")}
	c.HTTPAddr = l.addr("HTTP_ADDR", defaultHTTPAddr)
	c.WorkerHTTPAddr = l.addr("WORKER_HTTP_ADDR", defaultWorkerHTTPAddr)
	c.HTTPReadTimeout = l.millis("HTTP_READ_TIMEOUT_MS", defaultHTTPReadTimeout, false, 0)
	c.HTTPIdleTimeout = l.millis("HTTP_IDLE_TIMEOUT_MS", defaultHTTPIdleTimeout, false, 0)
	c.DatabaseURL, primary = l.databaseURL("DATABASE_URL", requireDatabase)
	c.DatabaseReadURL, replica = l.databaseURL("DATABASE_READ_URL", false)
	poolMax := l.intRange("DATABASE_POOL_MAX", defaultDatabasePoolMax, 1, maxDatabasePoolMax)
	c.DatabasePoolMax = int32(poolMax) //nolint:gosec // intRange bounds it to 1..1000.
	c.DatabasePoolIdleTimeout = l.poolTimeout("DATABASE_POOL_IDLE_TIMEOUT", defaultDatabasePoolIdle, false)
	c.DatabasePoolConnectTimeout = l.poolTimeout("DATABASE_POOL_CONNECT_TIMEOUT", defaultDatabasePoolConnect, true)
	c.RedisURL = l.redisURL("REDIS_URL")
	c.RedisConnectTimeout = l.millis("REDIS_CONNECT_TIMEOUT_MS", defaultRedisConnectTimeout, false, 0)
	c.RedisCommandTimeout = l.millis("REDIS_COMMAND_TIMEOUT_MS", defaultRedisCommandTimeout, true, maxRedisCommandTimeout)
	c.RedisMaxRetries = l.intRange("REDIS_MAX_RETRIES_PER_REQUEST", defaultRedisMaxRetries, 0, math.MaxInt32)
	c.InstanceID = l.instanceID("KUMIKO_INSTANCE_ID")
	c.JWTKeys = l.jwtKeys("JWT_SECRET", c.Mode != ModeWorker)
	c.DispatcherPollInterval = l.millis("KUMIKO_DISPATCHER_POLL_INTERVAL_MS", defaultDispatcherPollInterval, false, maxDispatcherPollInterval)
	c.DispatcherBatchSize = l.intRange("KUMIKO_DISPATCHER_BATCH_SIZE", defaultDispatcherBatchSize, 1, maxDispatcherBatchSize)
	c.DispatcherMaxConcurrentPasses = l.intRange("KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES", defaultDispatcherPasses, 1, maxDispatcherPasses)
	c.DispatcherPollOnly = l.boolean("KUMIKO_DISPATCHER_POLL_ONLY")
	c.DrainTimeout = l.millis("KUMIKO_DRAIN_TIMEOUT_MS", defaultDrainTimeout, false, 0)
	c.IdempotencyTTL = l.idempotencyTTL("KUMIKO_IDEMPOTENCY_TTL")
	c.ReplicaWait = l.millis("KUMIKO_REPLICA_WAIT_MS", defaultReplicaWait, false, 0)
	c.RunLocalJobs = l.boolean("KUMIKO_RUN_LOCAL_JOBS")
	c.JobsConcurrency = l.intRange("KUMIKO_JOBS_CONCURRENCY", defaultJobsConcurrency, 1, maxJobsConcurrency)
	c.ReadyMaxLag = int64(l.intRange("KUMIKO_READY_MAX_LAG", 0, 0, maxReadyMaxLag))
	c.Dev = l.boolean("KUMIKO_DEV")
	c.SampleCron = l.cronSpec("KUMIKO_SAMPLE_CRON")
	c.LogLevel = l.logLevel("LOG_LEVEL")
	if !l.failed("DATABASE_POOL_MAX") {
		l.poolMinimums("DATABASE_URL", primary, c.DatabasePoolMax)
		l.poolMinimums("DATABASE_READ_URL", replica, c.DatabasePoolMax)
	}
	if len(l.errs) > 0 {
		errs := make([]error, len(l.errs))
		for i, e := range l.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// PoolConfig returns a fresh pool configuration for DatabaseURL with
// DatabasePoolMax, DatabasePoolIdleTimeout and DatabasePoolConnectTimeout
// applied; they override pool_max_conns, pool_max_conn_idle_time and
// connect_timeout in the URL. Its ShouldPing also pings a connection that
// the server ended while it sat idle (see internal/pgliveness), so that the
// pool drops it instead of handing it out. It fails only when DatabaseURL
// does not parse, which [FromLookup] has already ruled out.
func (c *Config) PoolConfig() (*pgxpool.Config, error) {
	if c.DatabaseURL == "" {
		return nil, &VarError{Name: "DATABASE_URL", Err: errors.New("required")}
	}
	return c.poolConfig("DATABASE_URL", c.DatabaseURL)
}

// ReadPoolConfig is [Config.PoolConfig] for DatabaseReadURL. It returns
// (nil, nil) when no replica is configured.
func (c *Config) ReadPoolConfig() (*pgxpool.Config, error) {
	if c.DatabaseReadURL == "" {
		return nil, nil
	}
	return c.poolConfig("DATABASE_READ_URL", c.DatabaseReadURL)
}

func (c *Config) poolConfig(name, connString string) (*pgxpool.Config, error) {
	if err := checkPostgresForm(connString); err != nil {
		return nil, &VarError{Name: name, Err: err}
	}
	pc, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, &VarError{Name: name, Err: redactErr(err, connString)}
	}
	pc.MaxConns = c.DatabasePoolMax
	pc.MaxConnIdleTime = c.DatabasePoolIdleTimeout
	pc.ConnConfig.ConnectTimeout = c.DatabasePoolConnectTimeout
	// A connection the server ended while it sat idle is pinged (and so
	// dropped) before it is handed out, not only one idle for a second.
	pc.ShouldPing = pgliveness.ShouldPing
	return pc, nil
}

// RedisOptions returns fresh client options for RedisURL with
// RedisConnectTimeout as DialTimeout, RedisCommandTimeout as ReadTimeout and
// WriteTimeout, and RedisMaxRetries as MaxRetries applied; they override
// dial_timeout, read_timeout, write_timeout and max_retries in the URL. A
// zero command timeout or retry count is translated to go-redis's -1, which
// means "none" (go-redis reads 0 as "use my default"). It fails only when
// RedisURL does not parse, which [FromLookup] has already ruled out.
func (c *Config) RedisOptions() (*redis.Options, error) {
	if err := checkRedisForm(c.RedisURL); err != nil {
		return nil, &VarError{Name: "REDIS_URL", Err: err}
	}
	opts, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		return nil, &VarError{Name: "REDIS_URL", Err: redactErr(err, c.RedisURL)}
	}
	opts.DialTimeout = c.RedisConnectTimeout
	cmdTimeout := c.RedisCommandTimeout
	if cmdTimeout == 0 {
		cmdTimeout = -1
	}
	opts.ReadTimeout = cmdTimeout
	opts.WriteTimeout = cmdTimeout
	opts.MaxRetries = c.RedisMaxRetries
	if opts.MaxRetries == 0 {
		opts.MaxRetries = -1
	}
	// go-redis's own dial retries (five, 100 ms apart) stay: they ride
	// over a Redis restart. With one dial per attempt, the pool refused
	// every dial once PoolSize of them had failed, until its once-a-second
	// probe got through, so a 150 ms restart failed commands for most of a
	// second after Redis was back. The price: while Redis refuses
	// connections, a keyed write waits out its claim's bound (2 s) before
	// its 503.
	return opts, nil
}

// loader reads variables and collects one error per problem.
type loader struct {
	lookup func(string) (string, bool)
	errs   []*VarError
}

// get returns the value of name; unset and "" both report false.
func (l *loader) get(name string) (string, bool) {
	if l.lookup == nil {
		return "", false
	}
	v, ok := l.lookup(name)
	if !ok || v == "" {
		return "", false
	}
	return v, true
}

func (l *loader) fail(name string, err error) {
	l.errs = append(l.errs, &VarError{Name: name, Err: err})
}

// failed reports whether name already has a problem.
func (l *loader) failed(name string) bool {
	return slices.ContainsFunc(l.errs, func(e *VarError) bool { return e.Name == name })
}

func (l *loader) failf(name, format string, args ...any) {
	l.fail(name, fmt.Errorf(format, args...))
}

func (l *loader) mode(name string) Mode {
	v, ok := l.get(name)
	if !ok {
		return defaultMode
	}
	switch m := Mode(v); m {
	case ModeAPI, ModeWorker, ModeAllInOne:
		return m
	}
	l.failf(name, "must be one of %s, %s, %s, got %q", ModeAPI, ModeWorker, ModeAllInOne, v)
	return defaultMode
}

func (l *loader) addr(name, def string) string {
	v, ok := l.get(name)
	if !ok {
		return def
	}
	_, port, err := net.SplitHostPort(v)
	switch {
	case err != nil || port == "":
		l.failf(name, "must be a listen address host:port such as \":8080\", got %q", v)
	case !validPort(port):
		l.failf(name, "port must be a number from 0 to 65535 or a service name, got %q", v)
	}
	return v
}

// validPort reports whether net.Listen accepts port: a number from 0 to
// 65535 or a service name it knows (/etc/services).
func validPort(port string) bool {
	if n, err := strconv.Atoi(port); err == nil {
		return n >= 0 && n <= 65535
	}
	_, err := net.LookupPort("tcp", port)
	return err == nil
}

// intRange reads an integer in [lo, hi]; lo is 0 or 1.
func (l *loader) intRange(name string, def, lo, hi int) int {
	v, ok := l.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err == nil && n >= lo && n <= hi {
		return n
	}
	kind := "a positive integer"
	if lo == 0 {
		kind = "a non-negative integer"
	}
	outOfRange := err == nil || errors.Is(err, strconv.ErrRange)
	switch {
	case outOfRange && hi < math.MaxInt32:
		kind = fmt.Sprintf("an integer between %d and %d", lo, hi)
	case outOfRange && n > hi:
		kind = fmt.Sprintf("at most %d", hi)
	}
	l.failf(name, "must be %s, got %q", kind, v)
	return def
}

// millis reads a whole number of milliseconds; allowZero admits 0, and
// limit, when positive, is the largest value admitted (else the largest
// time.Duration).
func (l *loader) millis(name string, def time.Duration, allowZero bool, limit time.Duration) time.Duration {
	v, ok := l.get(name)
	if !ok {
		return def
	}
	maxMillis := math.MaxInt64 / int64(time.Millisecond)
	if limit > 0 {
		maxMillis = limit.Milliseconds()
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), n < 0:
		if allowZero {
			l.failf(name, "must be a non-negative integer number of milliseconds, got %q", v)
		} else {
			l.failf(name, "must be a positive integer number of milliseconds, got %q", v)
		}
	case n == 0 && !allowZero:
		l.failf(name, "must be a positive integer number of milliseconds, got %q", v)
	case err != nil || n > maxMillis:
		l.failf(name, "is too large (at most %d milliseconds), got %q", maxMillis, v)
	default:
		return time.Duration(n) * time.Millisecond
	}
	return def
}

// duration reads a Go duration ("30s"); allowZero admits 0.
func (l *loader) duration(name string, def time.Duration, allowZero bool) time.Duration {
	v, ok := l.get(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		l.failf(name, "must be a duration such as \"30s\" or \"1m\", got %q", v)
	case d < 0 || (d == 0 && !allowZero):
		if allowZero {
			l.failf(name, "must not be negative, got %q", v)
		} else {
			l.failf(name, "must be a positive duration, got %q", v)
		}
	default:
		return d
	}
	return def
}

// poolTimeout reads a pool timeout: a Go duration ("30s"), or a bare
// integer number of seconds, the form Kumiko's scaling guide documents for
// these variables (idleTimeoutSeconds, connectTimeoutSeconds), so its
// environment files keep working.
func (l *loader) poolTimeout(name string, def time.Duration, allowZero bool) time.Duration {
	v, ok := l.get(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		if _, derr := time.ParseDuration(v); derr != nil {
			l.failf(name, "must be a duration such as \"30s\" or \"1m\", or a number of seconds, got %q", v)
			return def
		}
		return l.duration(name, def, allowZero)
	}
	switch {
	case n < 0 || (n == 0 && !allowZero):
		if allowZero {
			l.failf(name, "must not be negative, got %q", v)
		} else {
			l.failf(name, "must be a positive duration, got %q", v)
		}
	case n > int64(math.MaxInt64/time.Second):
		l.failf(name, "must be a duration such as \"30s\" or \"1m\", or a number of seconds, got %q", v)
	default:
		return time.Duration(n) * time.Second
	}
	return def
}

// idempotencyTTL reads a duration of at least minIdempotencyTTL.
func (l *loader) idempotencyTTL(name string) time.Duration {
	d := l.duration(name, defaultIdempotencyTTL, false)
	if d < minIdempotencyTTL && !l.failed(name) {
		v, _ := l.get(name)
		l.failf(name, "must be at least %s (the lease of a running request's claim), got %q", minIdempotencyTTL, v)
		return defaultIdempotencyTTL
	}
	return d
}

func (l *loader) boolean(name string) bool {
	v, ok := l.get(name)
	if !ok {
		return false
	}
	switch strings.ToLower(v) {
	case "true", "1":
		return true
	case "false", "0":
		return false
	}
	l.failf(name, "must be true, false, 1 or 0, got %q", v)
	return false
}

// cronSpec reads a spec that [jobs.Cron] accepts.
func (l *loader) cronSpec(name string) string {
	v, ok := l.get(name)
	if !ok {
		return ""
	}
	if err := jobs.ValidateCronSpec(v); err != nil {
		l.failf(name, "must be a cron spec such as \"0 2 * * *\" or \"@every 2s\", got %q: %v", v, err)
		return ""
	}
	return v
}

func (l *loader) logLevel(name string) slog.Level {
	v, ok := l.get(name)
	if !ok {
		return defaultLogLevel
	}
	switch strings.ToLower(v) {
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	l.failf(name, "must be one of debug, info, warn, error, got %q", v)
	return defaultLogLevel
}

func (l *loader) instanceID(name string) string {
	v, set := l.get(name)
	if !set {
		return ""
	}
	if err := CheckInstanceID(v); err != nil {
		l.failf(name, "%s", err)
		return ""
	}
	return v
}

// CheckInstanceID returns why id cannot be a process's instance id, or
// nil: it must be 1 to 253 ASCII letters, digits, '.', '_', ':' or '-'
// (the id is a path segment of the admin API, a metric label and a log
// field), and not [ReservedInstanceID].
func CheckInstanceID(id string) error {
	if id == ReservedInstanceID {
		return fmt.Errorf("%q is reserved for shared consumer delivery", id)
	}
	if !validInstanceID(id) {
		return fmt.Errorf("must be 1 to 253 letters, digits, '.', '_', ':' or '-', got %q", id)
	}
	return nil
}

// validInstanceID reports whether id is 1 to 253 ASCII letters, digits,
// '.', '_', ':' or '-' (a pod or host name fits).
func validInstanceID(id string) bool {
	if id == "" || len(id) > 253 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// databaseURL checks that the connection string parses and returns it with
// its parsed form (nil when unset or bad).
func (l *loader) databaseURL(name string, required bool) (string, *pgxpool.Config) {
	v, ok := l.get(name)
	if !ok {
		if required {
			l.fail(name, errors.New("required"))
		}
		return "", nil
	}
	if err := checkPostgresForm(v); err != nil {
		l.fail(name, err)
		return "", nil
	}
	pc, err := pgxpool.ParseConfig(v)
	if err != nil {
		l.fail(name, redactErr(err, v))
		return "", nil
	}
	return v, pc
}

// keywordValueStart matches the start of a keyword/value connection string
// ("host=db ..."). pgx sends a setting it does not know as a run-time
// parameter, so the first may be a custom one by its dotted name
// ("app.region=eu host=db ...").
var keywordValueStart = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_.]*\s*=`)

// pgForms says what DATABASE_URL and DATABASE_READ_URL accept.
const pgForms = `use a postgres:// or postgresql:// URL, or keyword/value settings such as "host=db dbname=app user=app"`

// checkPostgresForm fails when connString is neither a postgres:// or
// postgresql:// URL nor a keyword/value string, the two forms pgx parses.
// pgx reads anything else as a keyword/value string: another database's
// URL failed as "invalid keyword/value" (with the user name masked as a
// password), and one with a '=' in its query ("jdbc:postgresql://h/db?
// user=u") even passed as one unknown setting. The error names only the
// scheme, never the rest (which may hold a password).
func checkPostgresForm(connString string) error {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") ||
		keywordValueStart.MatchString(connString) || strings.TrimSpace(connString) == "" {
		return nil
	}
	if urlScheme.MatchString(connString) {
		scheme, _, _ := strings.Cut(connString, "://")
		return fmt.Errorf("unsupported scheme %q: %s", scheme+"://", pgForms)
	}
	return errors.New("not a PostgreSQL connection string: " + pgForms)
}

// redisForms says what REDIS_URL accepts.
const redisForms = `use a redis://host:port/db, rediss:// (TLS) or unix:///path/to/socket URL`

// checkRedisForm fails when redisURL is not a URL with one of the schemes
// go-redis accepts (redis, rediss, unix; any case). Without it, go-redis
// named the host of "cache:6379" as its scheme ("invalid URL scheme:
// cache") and read "redis:cache:6379" as localhost:6379. "unix:/path",
// which go-redis reads as the socket /path, stays accepted. The error
// names only the scheme.
func checkRedisForm(redisURL string) error {
	if !urlScheme.MatchString(redisURL) {
		if len(redisURL) > len("unix:") && strings.EqualFold(redisURL[:len("unix:")], "unix:") {
			return nil
		}
		return errors.New("not a Redis URL: " + redisForms)
	}
	scheme, _, _ := strings.Cut(redisURL, "://")
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		return nil
	}
	return fmt.Errorf("unsupported scheme %q: %s", scheme+"://", redisForms)
}

// poolMinimums checks that the pool minimums of a connection string fit
// under DATABASE_POOL_MAX, which replaces its pool_max_conns.
func (l *loader) poolMinimums(name string, pc *pgxpool.Config, poolMax int32) {
	if pc == nil {
		return
	}
	if pc.MinConns > poolMax {
		l.failf(name, "pool_min_conns %d exceeds DATABASE_POOL_MAX %d", pc.MinConns, poolMax)
	}
	if pc.MinIdleConns > poolMax {
		l.failf(name, "pool_min_idle_conns %d exceeds DATABASE_POOL_MAX %d", pc.MinIdleConns, poolMax)
	}
}

func (l *loader) redisURL(name string) string {
	v, ok := l.get(name)
	if !ok {
		return defaultRedisURL
	}
	if err := checkRedisForm(v); err != nil {
		l.fail(name, err)
		return defaultRedisURL
	}
	if _, err := redis.ParseURL(v); err != nil {
		l.fail(name, redactErr(err, v))
		return defaultRedisURL
	}
	return v
}

func (l *loader) jwtKeys(name string, required bool) []JWTKey {
	v, ok := l.get(name)
	if !ok {
		if required {
			l.fail(name, errors.New("required unless APP_MODE is worker"))
		}
		return nil
	}
	keys, errs := parseJWTKeys(v)
	for _, err := range errs {
		l.fail(name, err)
	}
	return keys
}

// LoadForTool reads the configuration for the CLI's maintenance commands
// (migrate, consumer, events, projection, jobs): like [Load], but APP_MODE is
// taken as "worker", so JWT_SECRET is optional.
func LoadForTool() (*Config, error) {
	return FromLookup(func(name string) (string, bool) {
		if name == "APP_MODE" {
			return string(ModeWorker), true
		}
		return os.LookupEnv(name)
	})
}

// LoadForRegistry reads the configuration for a CLI command that only
// registers the application's features and opens nothing (kumiko jobs
// declared): like [LoadForTool], but DATABASE_URL is optional (checked when
// set), so that such a command runs where no database is configured.
func LoadForRegistry() (*Config, error) {
	return fromLookup(func(name string) (string, bool) {
		if name == "APP_MODE" {
			return string(ModeWorker), true
		}
		return os.LookupEnv(name)
	}, false)
}

// LoadJWTKeys reads only JWT_SECRET (for `kumiko token`), which it
// requires. Like [FromLookup], it fails with an [errors.Join] of one
// [*VarError] per problem.
func LoadJWTKeys() ([]JWTKey, error) {
	v, ok := os.LookupEnv("JWT_SECRET")
	if !ok || v == "" {
		return nil, &VarError{Name: "JWT_SECRET", Err: errors.New("required")}
	}
	keys, errs := parseJWTKeys(v)
	if len(errs) > 0 {
		varErrs := make([]error, len(errs))
		for i, err := range errs {
			varErrs[i] = &VarError{Name: "JWT_SECRET", Err: err}
		}
		return nil, errors.Join(varErrs...)
	}
	return keys, nil
}
