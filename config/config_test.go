package config

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const (
	testDatabaseURL = "postgres://kumiko:pw-of-test@db.example.com:5432/kumiko"
	testSecret      = "0123456789abcdef-test-secret"
)

// env returns a lookup over m, standing in for the process environment.
func env(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// minimal is the smallest valid environment of the default mode; extra
// entries are added on top.
func minimal(extra map[string]string) map[string]string {
	m := map[string]string{
		"DATABASE_URL": testDatabaseURL,
		"JWT_SECRET":   testSecret,
	}
	maps.Copy(m, extra)
	return m
}

// varErrors splits err into its *VarError parts and fails on anything else.
func varErrors(t *testing.T, err error) []*VarError {
	t.Helper()
	require.Error(t, err)
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "want an errors.Join, got %T", err)
	var out []*VarError
	for _, e := range joined.Unwrap() {
		var ve *VarError
		require.ErrorAs(t, e, &ve)
		out = append(out, ve)
	}
	return out
}

// varNames returns the sorted, distinct variable names in err.
func varNames(t *testing.T, err error) []string {
	t.Helper()
	var names []string
	for _, ve := range varErrors(t, err) {
		names = append(names, ve.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestDefaults(t *testing.T) {
	t.Parallel()

	c, err := FromLookup(env(minimal(nil)))
	require.NoError(t, err)
	require.Equal(t, &Config{
		Mode:                          ModeAllInOne,
		HTTPAddr:                      ":8080",
		WorkerHTTPAddr:                ":8081",
		HTTPReadTimeout:               30 * time.Second,
		HTTPIdleTimeout:               2 * time.Minute,
		DatabaseURL:                   testDatabaseURL,
		DatabaseReadURL:               "",
		DatabasePoolMax:               10,
		DatabasePoolIdleTimeout:       30 * time.Second,
		DatabasePoolConnectTimeout:    5 * time.Second,
		RedisURL:                      "redis://127.0.0.1:6379/0",
		RedisConnectTimeout:           5 * time.Second,
		RedisCommandTimeout:           10 * time.Second,
		RedisMaxRetries:               3,
		InstanceID:                    "",
		JWTKeys:                       []JWTKey{{Secret: []byte(testSecret)}},
		DispatcherPollInterval:        100 * time.Millisecond,
		DispatcherBatchSize:           500,
		DispatcherMaxConcurrentPasses: 2,
		DispatcherPollOnly:            false,
		DrainTimeout:                  30 * time.Second,
		IdempotencyTTL:                24 * time.Hour,
		ReplicaWait:                   500 * time.Millisecond,
		RunLocalJobs:                  false,
		JobsConcurrency:               10,
		ReadyMaxLag:                   0,
		Dev:                           false,
		SampleCron:                    "",
		LogLevel:                      slog.LevelInfo,
	}, c)
}

func TestEmptyCountsAsUnset(t *testing.T) {
	t.Parallel()

	m := minimal(nil)
	for _, name := range allVariables {
		if _, ok := m[name]; !ok {
			m[name] = ""
		}
	}
	got, err := FromLookup(env(m))
	require.NoError(t, err)
	want, err := FromLookup(env(minimal(nil)))
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestNilLookupIsAnEmptyEnvironment(t *testing.T) {
	t.Parallel()

	_, err := FromLookup(nil)
	require.Equal(t, []string{"DATABASE_URL", "JWT_SECRET"}, varNames(t, err))
}

// allVariables lists every variable the package reads.
var allVariables = []string{
	"APP_MODE", "HTTP_ADDR", "WORKER_HTTP_ADDR", "HTTP_READ_TIMEOUT_MS", "HTTP_IDLE_TIMEOUT_MS",
	"DATABASE_URL", "DATABASE_READ_URL", "DATABASE_POOL_MAX",
	"DATABASE_POOL_IDLE_TIMEOUT", "DATABASE_POOL_CONNECT_TIMEOUT",
	"REDIS_URL", "REDIS_CONNECT_TIMEOUT_MS", "REDIS_COMMAND_TIMEOUT_MS",
	"REDIS_MAX_RETRIES_PER_REQUEST", "KUMIKO_INSTANCE_ID", "JWT_SECRET",
	"KUMIKO_DISPATCHER_POLL_INTERVAL_MS", "KUMIKO_DISPATCHER_BATCH_SIZE", "KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES",
	"KUMIKO_DISPATCHER_POLL_ONLY", "KUMIKO_DRAIN_TIMEOUT_MS",
	"KUMIKO_RUN_LOCAL_JOBS", "KUMIKO_JOBS_CONCURRENCY", "KUMIKO_READY_MAX_LAG", "KUMIKO_DEV", "KUMIKO_SAMPLE_CRON", "LOG_LEVEL",
	"KUMIKO_IDEMPOTENCY_TTL", "KUMIKO_REPLICA_WAIT_MS",
}

func TestEveryVariableParsed(t *testing.T) {
	t.Parallel()

	m := map[string]string{
		"APP_MODE":                                "api",
		"HTTP_ADDR":                               "127.0.0.1:9000",
		"WORKER_HTTP_ADDR":                        "0.0.0.0:9001",
		"HTTP_READ_TIMEOUT_MS":                    "5000",
		"HTTP_IDLE_TIMEOUT_MS":                    "60000",
		"DATABASE_URL":                            testDatabaseURL,
		"DATABASE_READ_URL":                       "host=replica.example.com user=kumiko dbname=kumiko",
		"DATABASE_POOL_MAX":                       "25",
		"DATABASE_POOL_IDLE_TIMEOUT":              "1m30s",
		"DATABASE_POOL_CONNECT_TIMEOUT":           "2s",
		"REDIS_URL":                               "rediss://:pw@cache.example.com:6380/2",
		"REDIS_CONNECT_TIMEOUT_MS":                "1500",
		"REDIS_COMMAND_TIMEOUT_MS":                "2500",
		"REDIS_MAX_RETRIES_PER_REQUEST":           "0",
		"KUMIKO_INSTANCE_ID":                      "api-7",
		"JWT_SECRET":                              "k2:0123456789abcdef-two,k1:0123456789abcdef:one",
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS":      "250",
		"KUMIKO_DISPATCHER_BATCH_SIZE":            "10000",
		"KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES": "8",
		"KUMIKO_DISPATCHER_POLL_ONLY":             "true",
		"KUMIKO_DRAIN_TIMEOUT_MS":                 "45000",
		"KUMIKO_RUN_LOCAL_JOBS":                   "1",
		"KUMIKO_JOBS_CONCURRENCY":                 "25",
		"KUMIKO_READY_MAX_LAG":                    "500",
		"KUMIKO_DEV":                              "TRUE",
		"KUMIKO_SAMPLE_CRON":                      "@every 2s",
		"LOG_LEVEL":                               "Debug",
		"KUMIKO_IDEMPOTENCY_TTL":                  "2h",
		"KUMIKO_REPLICA_WAIT_MS":                  "150",
	}
	require.ElementsMatch(t, allVariables, slices.Collect(maps.Keys(m)), "the test must set every variable")

	c, err := FromLookup(env(m))
	require.NoError(t, err)
	require.Equal(t, &Config{
		Mode:                       ModeAPI,
		HTTPAddr:                   "127.0.0.1:9000",
		WorkerHTTPAddr:             "0.0.0.0:9001",
		HTTPReadTimeout:            5 * time.Second,
		HTTPIdleTimeout:            time.Minute,
		DatabaseURL:                testDatabaseURL,
		DatabaseReadURL:            "host=replica.example.com user=kumiko dbname=kumiko",
		DatabasePoolMax:            25,
		DatabasePoolIdleTimeout:    90 * time.Second,
		DatabasePoolConnectTimeout: 2 * time.Second,
		RedisURL:                   "rediss://:pw@cache.example.com:6380/2",
		RedisConnectTimeout:        1500 * time.Millisecond,
		RedisCommandTimeout:        2500 * time.Millisecond,
		RedisMaxRetries:            0,
		InstanceID:                 "api-7",
		JWTKeys: []JWTKey{
			{ID: "k2", Secret: []byte("0123456789abcdef-two")},
			{ID: "k1", Secret: []byte("0123456789abcdef:one")},
		},
		DispatcherPollInterval:        250 * time.Millisecond,
		DispatcherBatchSize:           10000,
		DispatcherMaxConcurrentPasses: 8,
		DispatcherPollOnly:            true,
		DrainTimeout:                  45 * time.Second,
		IdempotencyTTL:                2 * time.Hour,
		ReplicaWait:                   150 * time.Millisecond,
		RunLocalJobs:                  true,
		JobsConcurrency:               25,
		ReadyMaxLag:                   500,
		Dev:                           true,
		SampleCron:                    "@every 2s",
		LogLevel:                      slog.LevelDebug,
	}, c)
}

func TestValues(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		value string
		check func(t *testing.T, c *Config)
	}{
		{"APP_MODE", "worker", func(t *testing.T, c *Config) { require.Equal(t, ModeWorker, c.Mode) }},
		{"APP_MODE", "all-in-one", func(t *testing.T, c *Config) { require.Equal(t, ModeAllInOne, c.Mode) }},
		{"HTTP_ADDR", ":0", func(t *testing.T, c *Config) { require.Equal(t, ":0", c.HTTPAddr) }},
		{"HTTP_ADDR", "127.0.0.1:65535", func(t *testing.T, c *Config) { require.Equal(t, "127.0.0.1:65535", c.HTTPAddr) }},
		{"HTTP_ADDR", "[::1]:80", func(t *testing.T, c *Config) { require.Equal(t, "[::1]:80", c.HTTPAddr) }},
		{"DATABASE_POOL_MAX", "1", func(t *testing.T, c *Config) { require.Equal(t, int32(1), c.DatabasePoolMax) }},
		{"DATABASE_POOL_MAX", "1000", func(t *testing.T, c *Config) { require.Equal(t, int32(1000), c.DatabasePoolMax) }},
		{"DATABASE_POOL_CONNECT_TIMEOUT", "0", func(t *testing.T, c *Config) { require.Zero(t, c.DatabasePoolConnectTimeout) }},
		// Kumiko's scaling guide sets both pool timeouts in seconds
		// (idleTimeoutSeconds, connectTimeoutSeconds): its env files must boot.
		{"DATABASE_POOL_IDLE_TIMEOUT", "30", func(t *testing.T, c *Config) { require.Equal(t, 30*time.Second, c.DatabasePoolIdleTimeout) }},
		{"DATABASE_POOL_CONNECT_TIMEOUT", "5", func(t *testing.T, c *Config) { require.Equal(t, 5*time.Second, c.DatabasePoolConnectTimeout) }},
		{"DATABASE_POOL_IDLE_TIMEOUT", "1m30s", func(t *testing.T, c *Config) { require.Equal(t, 90*time.Second, c.DatabasePoolIdleTimeout) }},
		{"REDIS_COMMAND_TIMEOUT_MS", "0", func(t *testing.T, c *Config) { require.Zero(t, c.RedisCommandTimeout) }},
		{"REDIS_URL", "unix:///run/redis.sock", func(t *testing.T, c *Config) { require.Equal(t, "unix:///run/redis.sock", c.RedisURL) }},
		{"KUMIKO_DISPATCHER_POLL_INTERVAL_MS", "86400000", func(t *testing.T, c *Config) { require.Equal(t, 24*time.Hour, c.DispatcherPollInterval) }},
		{"KUMIKO_IDEMPOTENCY_TTL", "30s", func(t *testing.T, c *Config) { require.Equal(t, 30*time.Second, c.IdempotencyTTL) }},
		{"KUMIKO_DISPATCHER_BATCH_SIZE", "1", func(t *testing.T, c *Config) { require.Equal(t, 1, c.DispatcherBatchSize) }},
		{"KUMIKO_DISPATCHER_POLL_ONLY", "0", func(t *testing.T, c *Config) { require.False(t, c.DispatcherPollOnly) }},
		{"KUMIKO_JOBS_CONCURRENCY", "1", func(t *testing.T, c *Config) { require.Equal(t, 1, c.JobsConcurrency) }},
		{"KUMIKO_JOBS_CONCURRENCY", "2", func(t *testing.T, c *Config) { require.Equal(t, 2, c.JobsConcurrency) }},
		{"KUMIKO_JOBS_CONCURRENCY", "1000", func(t *testing.T, c *Config) { require.Equal(t, 1000, c.JobsConcurrency) }},
		{"KUMIKO_READY_MAX_LAG", "0", func(t *testing.T, c *Config) { require.Equal(t, int64(0), c.ReadyMaxLag) }},
		{"KUMIKO_READY_MAX_LAG", "1000000000", func(t *testing.T, c *Config) { require.Equal(t, int64(1_000_000_000), c.ReadyMaxLag) }},
		{"KUMIKO_DEV", "false", func(t *testing.T, c *Config) { require.False(t, c.Dev) }},
		{"KUMIKO_SAMPLE_CRON", "CRON_TZ=Europe/Berlin 30 2 * * *", func(t *testing.T, c *Config) {
			require.Equal(t, "CRON_TZ=Europe/Berlin 30 2 * * *", c.SampleCron)
		}},
		{"LOG_LEVEL", "warn", func(t *testing.T, c *Config) { require.Equal(t, slog.LevelWarn, c.LogLevel) }},
		{"LOG_LEVEL", "ERROR", func(t *testing.T, c *Config) { require.Equal(t, slog.LevelError, c.LogLevel) }},
		{"LOG_LEVEL", "info", func(t *testing.T, c *Config) { require.Equal(t, slog.LevelInfo, c.LogLevel) }},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			c, err := FromLookup(env(minimal(map[string]string{tt.name: tt.value})))
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// wantPGForms and wantRedisForms end the errors of a DATABASE_URL (or
// DATABASE_READ_URL) and a REDIS_URL that is no connection string of its
// kind: what it accepts.
const (
	wantPGForms    = `use a postgres:// or postgresql:// URL, or keyword/value settings such as "host=db dbname=app user=app"`
	wantRedisForms = `use a redis://host:port/db, rediss:// (TLS) or unix:///path/to/socket URL`
)

func TestBadValues(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		value string
		want  string // the whole error message
	}{
		{"APP_MODE", "API", `APP_MODE: must be one of api, worker, all-in-one, got "API"`},
		{"HTTP_ADDR", "8080", `HTTP_ADDR: must be a listen address host:port such as ":8080", got "8080"`},
		{"WORKER_HTTP_ADDR", "localhost:", `WORKER_HTTP_ADDR: must be a listen address host:port such as ":8080", got "localhost:"`},
		// A port out of range failed only at listen, after every other
		// problem had been reported.
		{"HTTP_ADDR", ":80800", `HTTP_ADDR: port must be a number from 0 to 65535 or a service name, got ":80800"`},
		{"WORKER_HTTP_ADDR", "127.0.0.1:-1", `WORKER_HTTP_ADDR: port must be a number from 0 to 65535 or a service name, got "127.0.0.1:-1"`},
		{"HTTP_ADDR", ":no-such-service-name", `HTTP_ADDR: port must be a number from 0 to 65535 or a service name, got ":no-such-service-name"`},
		{"DATABASE_URL", "postgres://h/db?sslmode=bogus", "DATABASE_URL: cannot parse `postgres://h/db?sslmode=bogus`: failed to configure TLS (sslmode is invalid)"},
		{"DATABASE_READ_URL", "postgres://h:port/db", "DATABASE_READ_URL: cannot parse `postgres://h:port/db`: invalid port"},
		{"DATABASE_URL", testDatabaseURL + "?pool_min_conns=11", "DATABASE_URL: pool_min_conns 11 exceeds DATABASE_POOL_MAX 10"},
		{"DATABASE_POOL_MAX", "abc", `DATABASE_POOL_MAX: must be a positive integer, got "abc"`},
		{"DATABASE_POOL_MAX", "0", `DATABASE_POOL_MAX: must be an integer between 1 and 1000, got "0"`},
		{"DATABASE_POOL_MAX", "1001", `DATABASE_POOL_MAX: must be an integer between 1 and 1000, got "1001"`},
		{"DATABASE_POOL_MAX", "99999999999999999999", `DATABASE_POOL_MAX: must be an integer between 1 and 1000, got "99999999999999999999"`},
		{"DATABASE_POOL_MAX", "2.5", `DATABASE_POOL_MAX: must be a positive integer, got "2.5"`},
		{"DATABASE_POOL_IDLE_TIMEOUT", "30x", `DATABASE_POOL_IDLE_TIMEOUT: must be a duration such as "30s" or "1m", or a number of seconds, got "30x"`},
		{"DATABASE_POOL_IDLE_TIMEOUT", "2.5", `DATABASE_POOL_IDLE_TIMEOUT: must be a duration such as "30s" or "1m", or a number of seconds, got "2.5"`},
		{"DATABASE_POOL_IDLE_TIMEOUT", "0s", `DATABASE_POOL_IDLE_TIMEOUT: must be a positive duration, got "0s"`},
		{"DATABASE_POOL_IDLE_TIMEOUT", "0", `DATABASE_POOL_IDLE_TIMEOUT: must be a positive duration, got "0"`},
		{"DATABASE_POOL_CONNECT_TIMEOUT", "-1", `DATABASE_POOL_CONNECT_TIMEOUT: must not be negative, got "-1"`},
		{"DATABASE_POOL_CONNECT_TIMEOUT", "9223372037", `DATABASE_POOL_CONNECT_TIMEOUT: must be a duration such as "30s" or "1m", or a number of seconds, got "9223372037"`},
		{"DATABASE_POOL_CONNECT_TIMEOUT", "-1s", `DATABASE_POOL_CONNECT_TIMEOUT: must not be negative, got "-1s"`},
		{"HTTP_READ_TIMEOUT_MS", "0", `HTTP_READ_TIMEOUT_MS: must be a positive integer number of milliseconds, got "0"`},
		{"HTTP_IDLE_TIMEOUT_MS", "2m", `HTTP_IDLE_TIMEOUT_MS: must be a positive integer number of milliseconds, got "2m"`},
		// Another database's URL, or none at all, was read by pgx as a
		// broken keyword/value string ("failed to parse as keyword/value"),
		// its user name masked as a password.
		{"DATABASE_URL", "mysql://app@db/app", `DATABASE_URL: unsupported scheme "mysql://": ` + wantPGForms},
		{"DATABASE_URL", "mysql://app:s3cret-pw@db/app", `DATABASE_URL: unsupported scheme "mysql://": ` + wantPGForms},
		{"DATABASE_URL", "POSTGRES://app@db/app", `DATABASE_URL: unsupported scheme "POSTGRES://": ` + wantPGForms},
		{"DATABASE_READ_URL", "mysql://app@replica/app", `DATABASE_READ_URL: unsupported scheme "mysql://": ` + wantPGForms},
		// pgx read this one as a keyword/value setting named
		// "jdbc:postgresql://replica/app?user" and passed the check.
		{"DATABASE_READ_URL", "jdbc:postgresql://replica/app?user=app", `DATABASE_READ_URL: not a PostgreSQL connection string: ` + wantPGForms},
		{"DATABASE_URL", "db:5432", `DATABASE_URL: not a PostgreSQL connection string: ` + wantPGForms},
		{"DATABASE_URL", "app:s3cret-pw@db/app", `DATABASE_URL: not a PostgreSQL connection string: ` + wantPGForms},
		// A broken keyword/value string keeps pgx's reason.
		{"DATABASE_URL", "host=db port=x", "DATABASE_URL: cannot parse `host=db port=x`: invalid port"},
		{"REDIS_URL", "http://cache:6379", `REDIS_URL: unsupported scheme "http://": ` + wantRedisForms},
		{"REDIS_URL", "memcached://cache", `REDIS_URL: unsupported scheme "memcached://": ` + wantRedisForms},
		// Without a scheme, go-redis named the host as one ("invalid URL
		// scheme: cache"); "redis:cache:6379" it read as localhost:6379.
		{"REDIS_URL", "cache:6379", `REDIS_URL: not a Redis URL: ` + wantRedisForms},
		{"REDIS_URL", "redis:cache:6379", `REDIS_URL: not a Redis URL: ` + wantRedisForms},
		{"REDIS_URL", "redis//cache", `REDIS_URL: not a Redis URL: ` + wantRedisForms},
		{"REDIS_CONNECT_TIMEOUT_MS", "0", `REDIS_CONNECT_TIMEOUT_MS: must be a positive integer number of milliseconds, got "0"`},
		{"REDIS_CONNECT_TIMEOUT_MS", "5s", `REDIS_CONNECT_TIMEOUT_MS: must be a positive integer number of milliseconds, got "5s"`},
		{"REDIS_COMMAND_TIMEOUT_MS", "-1", `REDIS_COMMAND_TIMEOUT_MS: must be a non-negative integer number of milliseconds, got "-1"`},
		{"REDIS_COMMAND_TIMEOUT_MS", "9223372036855", `REDIS_COMMAND_TIMEOUT_MS: is too large (at most 86400000 milliseconds), got "9223372036855"`},
		{"REDIS_COMMAND_TIMEOUT_MS", "86400001", `REDIS_COMMAND_TIMEOUT_MS: is too large (at most 86400000 milliseconds), got "86400001"`},
		{"REDIS_MAX_RETRIES_PER_REQUEST", "-1", `REDIS_MAX_RETRIES_PER_REQUEST: must be a non-negative integer, got "-1"`},
		{"REDIS_MAX_RETRIES_PER_REQUEST", "3000000000", `REDIS_MAX_RETRIES_PER_REQUEST: must be at most 2147483647, got "3000000000"`},
		{"KUMIKO_INSTANCE_ID", "__shared__", `KUMIKO_INSTANCE_ID: "__shared__" is reserved for shared consumer delivery`},
		// The id is a path segment of the admin API (DELETE /api/admin/instances/:instance), a
		// metric label and a log field: a slash made it unreachable over HTTP.
		{"KUMIKO_INSTANCE_ID", "pods/api-1", `KUMIKO_INSTANCE_ID: must be 1 to 253 letters, digits, '.', '_', ':' or '-', got "pods/api-1"`},
		{"KUMIKO_INSTANCE_ID", "api 1", `KUMIKO_INSTANCE_ID: must be 1 to 253 letters, digits, '.', '_', ':' or '-', got "api 1"`},
		{"JWT_SECRET", "short", "JWT_SECRET: secret must be at least 16 bytes, got 5"},
		{"KUMIKO_DISPATCHER_POLL_INTERVAL_MS", "0", `KUMIKO_DISPATCHER_POLL_INTERVAL_MS: must be a positive integer number of milliseconds, got "0"`},
		// The largest value the general bound admits made the dispatcher's
		// jitter overflow: it panicked (or spun without waiting).
		{"KUMIKO_DISPATCHER_POLL_INTERVAL_MS", "9223372036854", `KUMIKO_DISPATCHER_POLL_INTERVAL_MS: is too large (at most 86400000 milliseconds), got "9223372036854"`},
		{"KUMIKO_DISPATCHER_POLL_INTERVAL_MS", "86400001", `KUMIKO_DISPATCHER_POLL_INTERVAL_MS: is too large (at most 86400000 milliseconds), got "86400001"`},
		{"KUMIKO_DISPATCHER_BATCH_SIZE", "10001", `KUMIKO_DISPATCHER_BATCH_SIZE: must be an integer between 1 and 10000, got "10001"`},
		{"KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES", "0", `KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES: must be an integer between 1 and 256, got "0"`},
		{"KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES", "257", `KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES: must be an integer between 1 and 256, got "257"`},
		{"KUMIKO_DISPATCHER_POLL_ONLY", "yes", `KUMIKO_DISPATCHER_POLL_ONLY: must be true, false, 1 or 0, got "yes"`},
		{"KUMIKO_DRAIN_TIMEOUT_MS", "30s", `KUMIKO_DRAIN_TIMEOUT_MS: must be a positive integer number of milliseconds, got "30s"`},
		{"KUMIKO_DRAIN_TIMEOUT_MS", "0", `KUMIKO_DRAIN_TIMEOUT_MS: must be a positive integer number of milliseconds, got "0"`},
		// A TTL below a millisecond expired every claim at once (PEXPIRE 0):
		// a retried write ran again. One below the claim's lease lets a
		// running request's key expire under it.
		{"KUMIKO_IDEMPOTENCY_TTL", "500us", `KUMIKO_IDEMPOTENCY_TTL: must be at least 30s (the lease of a running request's claim), got "500us"`},
		{"KUMIKO_IDEMPOTENCY_TTL", "10s", `KUMIKO_IDEMPOTENCY_TTL: must be at least 30s (the lease of a running request's claim), got "10s"`},
		{"KUMIKO_RUN_LOCAL_JOBS", "on", `KUMIKO_RUN_LOCAL_JOBS: must be true, false, 1 or 0, got "on"`},
		// A lane's runs at once: 0 would silently be the runner's default,
		// and asynq takes a negative number as one run per CPU.
		{"KUMIKO_JOBS_CONCURRENCY", "0", `KUMIKO_JOBS_CONCURRENCY: must be an integer between 1 and 1000, got "0"`},
		{"KUMIKO_READY_MAX_LAG", "-1", `KUMIKO_READY_MAX_LAG: must be an integer between 0 and 1000000000, got "-1"`},
		{"KUMIKO_READY_MAX_LAG", "1000000001", `KUMIKO_READY_MAX_LAG: must be an integer between 0 and 1000000000, got "1000000001"`},
		{"KUMIKO_READY_MAX_LAG", "ten", `KUMIKO_READY_MAX_LAG: must be a non-negative integer, got "ten"`},
		{"KUMIKO_JOBS_CONCURRENCY", "-1", `KUMIKO_JOBS_CONCURRENCY: must be an integer between 1 and 1000, got "-1"`},
		{"KUMIKO_JOBS_CONCURRENCY", "1001", `KUMIKO_JOBS_CONCURRENCY: must be an integer between 1 and 1000, got "1001"`},
		{"KUMIKO_JOBS_CONCURRENCY", "abc", `KUMIKO_JOBS_CONCURRENCY: must be a positive integer, got "abc"`},
		{"KUMIKO_JOBS_CONCURRENCY", "2.5", `KUMIKO_JOBS_CONCURRENCY: must be a positive integer, got "2.5"`},
		{"KUMIKO_DEV", "2", `KUMIKO_DEV: must be true, false, 1 or 0, got "2"`},
		// A bad spec used to surface only as a registration problem of the
		// sample feature, after the configuration had been accepted.
		{"KUMIKO_SAMPLE_CRON", "61 * * * *", `KUMIKO_SAMPLE_CRON: must be a cron spec such as "0 2 * * *" or "@every 2s", got "61 * * * *": end of range (61) above maximum (59): 61`},
		{"KUMIKO_SAMPLE_CRON", "@every 100ms", `KUMIKO_SAMPLE_CRON: must be a cron spec such as "0 2 * * *" or "@every 2s", got "@every 100ms": @every 100ms is shorter than one second`},
		{"LOG_LEVEL", "warning", `LOG_LEVEL: must be one of debug, info, warn, error, got "warning"`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			c, err := FromLookup(env(minimal(map[string]string{tt.name: tt.value})))
			require.Nil(t, c)
			require.EqualError(t, err, tt.want)
			require.Equal(t, []string{tt.name}, varNames(t, err))
		})
	}
}

func TestEveryProblemReportedAtOnce(t *testing.T) {
	t.Parallel()

	bad := map[string]string{
		"APP_MODE":                                "server",
		"HTTP_ADDR":                               "no-port",
		"WORKER_HTTP_ADDR":                        "also-no-port",
		"HTTP_READ_TIMEOUT_MS":                    "-1",
		"HTTP_IDLE_TIMEOUT_MS":                    "forever",
		"DATABASE_URL":                            "postgres://u:p@h:x/db",
		"DATABASE_READ_URL":                       "postgres://u:p@h/db?sslmode=nope",
		"DATABASE_POOL_MAX":                       "abc",
		"DATABASE_POOL_IDLE_TIMEOUT":              "soon",
		"DATABASE_POOL_CONNECT_TIMEOUT":           "-5s",
		"REDIS_URL":                               "memcached://cache",
		"REDIS_CONNECT_TIMEOUT_MS":                "fast",
		"REDIS_COMMAND_TIMEOUT_MS":                "-10",
		"REDIS_MAX_RETRIES_PER_REQUEST":           "many",
		"KUMIKO_INSTANCE_ID":                      "__shared__",
		"JWT_SECRET":                              "a:short,a:0123456789abcdef",
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS":      "0",
		"KUMIKO_DISPATCHER_BATCH_SIZE":            "0",
		"KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES": "all",
		"KUMIKO_DISPATCHER_POLL_ONLY":             "maybe",
		"KUMIKO_DRAIN_TIMEOUT_MS":                 "1.5",
		"KUMIKO_RUN_LOCAL_JOBS":                   "yes",
		"KUMIKO_JOBS_CONCURRENCY":                 "lots",
		"KUMIKO_READY_MAX_LAG":                    "some",
		"KUMIKO_DEV":                              "no",
		"KUMIKO_SAMPLE_CRON":                      "nightly",
		"LOG_LEVEL":                               "trace",
		"KUMIKO_IDEMPOTENCY_TTL":                  "1 day",
		"KUMIKO_REPLICA_WAIT_MS":                  "0",
	}
	require.ElementsMatch(t, allVariables, slices.Collect(maps.Keys(bad)), "the test must break every variable")

	c, err := FromLookup(env(bad))
	require.Nil(t, c)
	require.Equal(t, slices.Sorted(maps.Keys(bad)), varNames(t, err))
	for name := range bad {
		require.Contains(t, err.Error(), name+": ")
	}
	// Every problem is one line that starts with its variable.
	for line := range strings.Lines(err.Error()) {
		name, _, ok := strings.Cut(line, ": ")
		require.True(t, ok, "line %q", line)
		require.Contains(t, bad, name, "line %q", line)
	}
	// JWT_SECRET had two problems: a short secret and a duplicate id.
	var jwt int
	for _, ve := range varErrors(t, err) {
		if ve.Name == "JWT_SECRET" {
			jwt++
		}
	}
	require.Equal(t, 2, jwt)
}

func TestRequired(t *testing.T) {
	t.Parallel()

	tests := []struct {
		mode string
		want []string
	}{
		{"", []string{"DATABASE_URL", "JWT_SECRET"}},
		{"all-in-one", []string{"DATABASE_URL", "JWT_SECRET"}},
		{"api", []string{"DATABASE_URL", "JWT_SECRET"}},
		{"worker", []string{"DATABASE_URL"}},
	}
	for _, tt := range tests {
		t.Run("mode="+tt.mode, func(t *testing.T) {
			t.Parallel()
			_, err := FromLookup(env(map[string]string{"APP_MODE": tt.mode}))
			require.Equal(t, tt.want, varNames(t, err))
			require.ErrorContains(t, err, "DATABASE_URL: required")
		})
	}
}

func TestJWTSecretByMode(t *testing.T) {
	t.Parallel()

	t.Run("missing in api mode", func(t *testing.T) {
		t.Parallel()
		_, err := FromLookup(env(map[string]string{"APP_MODE": "api", "DATABASE_URL": testDatabaseURL}))
		require.EqualError(t, err, "JWT_SECRET: required unless APP_MODE is worker")
	})
	t.Run("not required in worker mode", func(t *testing.T) {
		t.Parallel()
		c, err := FromLookup(env(map[string]string{"APP_MODE": "worker", "DATABASE_URL": testDatabaseURL}))
		require.NoError(t, err)
		require.Nil(t, c.JWTKeys)
	})
	t.Run("still checked in worker mode when set", func(t *testing.T) {
		t.Parallel()
		_, err := FromLookup(env(map[string]string{"APP_MODE": "worker", "DATABASE_URL": testDatabaseURL, "JWT_SECRET": "short"}))
		require.EqualError(t, err, "JWT_SECRET: secret must be at least 16 bytes, got 5")
	})
}

func TestParseJWTKeys(t *testing.T) {
	t.Parallel()

	const s16 = "0123456789abcdef"
	tests := []struct {
		name    string
		in      string
		want    []JWTKey
		wantErr []string // one line per problem
	}{
		{name: "single", in: s16, want: []JWTKey{{Secret: []byte(s16)}}},
		{name: "single with symbols", in: "a+b/c=d!e@f#g$h%i^j&k", want: []JWTKey{{Secret: []byte("a+b/c=d!e@f#g$h%i^j&k")}}},
		{name: "list of one", in: "k1:" + s16, want: []JWTKey{{ID: "k1", Secret: []byte(s16)}}},
		{
			name: "list, first signs",
			in:   "2025-06.b:" + s16 + "-new,2025_01-a:" + s16 + "-old",
			want: []JWTKey{{ID: "2025-06.b", Secret: []byte(s16 + "-new")}, {ID: "2025_01-a", Secret: []byte(s16 + "-old")}},
		},
		{name: "secret may contain colons", in: "k:" + s16 + ":x", want: []JWTKey{{ID: "k", Secret: []byte(s16 + ":x")}}},
		{name: "empty", in: "", wantErr: []string{"is empty"}},
		{name: "single short", in: "fifteen-bytes!!", wantErr: []string{"secret must be at least 16 bytes, got 15"}},
		{name: "list short", in: "k1:" + s16 + ",k2:tiny", wantErr: []string{"entry 2: secret must be at least 16 bytes, got 4"}},
		{name: "duplicate kid", in: "k1:" + s16 + ",k1:" + s16 + "x", wantErr: []string{"entry 2: key id is already used by entry 1"}},
		{name: "empty kid", in: ":" + s16, wantErr: []string{"entry 1 has an empty key id"}},
		{name: "bad kid", in: "k 1:" + s16, wantErr: []string{"entry 1: key id may contain only ASCII letters, digits, '.', '_' and '-'"}},
		{name: "spaces are not trimmed", in: "k1:" + s16 + ", k2:" + s16, wantErr: []string{"entry 2: key id may contain only ASCII letters, digits, '.', '_' and '-'"}},
		{name: "trailing comma", in: "k1:" + s16 + ",", wantErr: []string{"entry 2 is empty (want kid:secret)"}},
		{
			name:    "unnamed list",
			in:      s16 + "," + s16,
			wantErr: []string{"entry 1 has no ':' (want kid:secret in the list form; a single secret must contain neither ':' nor ',')", "entry 2 has no ':' (want kid:secret in the list form; a single secret must contain neither ':' nor ',')"},
		},
		{
			name:    "all problems at once",
			in:      "a:short,a:" + s16 + ",,:x",
			wantErr: []string{"entry 1: secret must be at least 16 bytes, got 5", "entry 2: key id is already used by entry 1", "entry 3 is empty (want kid:secret)", "entry 4 has an empty key id", "entry 4: secret must be at least 16 bytes, got 1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseJWTKeys(tt.in)
			if tt.wantErr != nil {
				require.Nil(t, got)
				require.EqualError(t, err, strings.Join(tt.wantErr, "\n"))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestSecretsStayOutOfErrorsAndLogs(t *testing.T) {
	t.Parallel()

	const pw = "hunter2-very-secret"
	_, err := FromLookup(env(map[string]string{
		"DATABASE_URL":      "postgres://kumiko:" + pw + "@db:badport/kumiko",
		"DATABASE_READ_URL": "host=replica password=" + pw + " port=abc",
		"REDIS_URL":         "redis://default:" + pw + "@cache:badport/0",
		"JWT_SECRET":        pw + ":x,no colon " + pw + ",bad id" + pw + ":" + pw,
	}))
	require.Equal(t, []string{"DATABASE_READ_URL", "DATABASE_URL", "JWT_SECRET", "REDIS_URL"}, varNames(t, err))
	require.NotContains(t, err.Error(), pw)
	require.NotContains(t, err.Error(), "hunter2")
	require.Contains(t, err.Error(), "xxxxx", "passwords are masked, the rest of the URL stays")

	key := JWTKey{ID: "k1", Secret: []byte(pw)}
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		require.NotContains(t, fmt.Sprintf(format, key), pw, format)
		require.NotContains(t, fmt.Sprintf(format, []JWTKey{key}), pw, format)
		require.NotContains(t, fmt.Sprintf(format, &Config{JWTKeys: []JWTKey{key}}), pw, format)
	}
	require.Contains(t, key.String(), `"k1"`)
}

// TestKeywordValuePasswordsStayOutOfErrors: libpq's keyword/value form
// allows spaces around '=' and quoted values; pgx's own masking of its
// parse errors only knows password=value, so these passwords reached the
// boot error.
func TestKeywordValuePasswordsStayOutOfErrors(t *testing.T) {
	t.Parallel()

	const pw = "hunter2-very-secret"
	for _, connString := range []string{
		"host=db password = " + pw + " port=bad",
		"host=db password= " + pw + " port=bad",
		"host=db password =" + pw + " port=bad",
		"host=db password = '" + pw + " with spaces' port=bad",
		"host=db password='" + pw + " it\\'s' port=bad",
		"host=db sslpassword = " + pw + " port=bad",
		"host=db\tpassword\t=\t" + pw + " port=bad",
	} {
		t.Run(connString, func(t *testing.T) {
			t.Parallel()
			_, err := FromLookup(env(map[string]string{"DATABASE_URL": connString, "JWT_SECRET": testSecret}))
			require.Equal(t, []string{"DATABASE_URL"}, varNames(t, err))
			require.NotContains(t, err.Error(), "hunter2")
			require.NotContains(t, err.Error(), "spaces")
			require.Contains(t, err.Error(), "invalid port", "the reason stays")
		})
	}
}

// TestUnencodedRedisPasswordsStayOutOfErrors: a password with '/', '?'
// or '#' (base64 has '/') that was not percent-encoded breaks REDIS_URL,
// and net/url then quotes the URL cut at that character, and the
// password's start as a "port", in its error. (pgx parses such a
// DATABASE_URL as libpq does, up to the last '@'.)
func TestUnencodedRedisPasswordsStayOutOfErrors(t *testing.T) {
	t.Parallel()

	for _, pw := range []string{"hunter2/very+secret=", "hunter2#very-secret", "hunter2?very-secret", "hunter2%zzvery-secret"} {
		for _, u := range []string{"redis://default:" + pw + "@cache:6379/0", "rediss://:" + pw + "@cache/1"} {
			t.Run(u, func(t *testing.T) {
				t.Parallel()
				_, err := FromLookup(env(minimal(map[string]string{"REDIS_URL": u})))
				require.Equal(t, []string{"REDIS_URL"}, varNames(t, err))
				require.NotContains(t, err.Error(), "hunter2")
				require.NotContains(t, err.Error(), "secret")
				require.Contains(t, err.Error(), "xxxxx")
			})
		}
	}
}

func TestPoolConfig(t *testing.T) {
	t.Parallel()

	c, err := FromLookup(env(minimal(map[string]string{
		// The variables win over the same settings in the URL.
		"DATABASE_URL":                  testDatabaseURL + "?pool_max_conns=3&pool_max_conn_idle_time=1h&connect_timeout=60&application_name=kumiko-test",
		"DATABASE_READ_URL":             "postgres://reader@replica.example.com:6432/kumiko",
		"DATABASE_POOL_MAX":             "42",
		"DATABASE_POOL_IDLE_TIMEOUT":    "45s",
		"DATABASE_POOL_CONNECT_TIMEOUT": "1500ms",
	})))
	require.NoError(t, err)

	pc, err := c.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, int32(42), pc.MaxConns)
	require.Equal(t, 45*time.Second, pc.MaxConnIdleTime)
	require.Equal(t, 1500*time.Millisecond, pc.ConnConfig.ConnectTimeout)
	require.Equal(t, "db.example.com", pc.ConnConfig.Host)
	require.Equal(t, uint16(5432), pc.ConnConfig.Port)
	require.Equal(t, "kumiko", pc.ConnConfig.Database)
	require.Equal(t, "pw-of-test", pc.ConnConfig.Password)
	require.Equal(t, "kumiko-test", pc.ConnConfig.RuntimeParams["application_name"])

	again, err := c.PoolConfig()
	require.NoError(t, err)
	require.NotSame(t, pc, again, "every call returns a fresh config")

	rc, err := c.ReadPoolConfig()
	require.NoError(t, err)
	require.NotNil(t, rc)
	require.Equal(t, int32(42), rc.MaxConns)
	require.Equal(t, 45*time.Second, rc.MaxConnIdleTime)
	require.Equal(t, 1500*time.Millisecond, rc.ConnConfig.ConnectTimeout)
	require.Equal(t, "replica.example.com", rc.ConnConfig.Host)
	require.Equal(t, uint16(6432), rc.ConnConfig.Port)
	require.Equal(t, "reader", rc.ConnConfig.User)
}

func TestPoolConfigDefaults(t *testing.T) {
	t.Parallel()

	c, err := FromLookup(env(minimal(nil)))
	require.NoError(t, err)
	pc, err := c.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, int32(10), pc.MaxConns)
	require.Equal(t, 30*time.Second, pc.MaxConnIdleTime)
	require.Equal(t, 5*time.Second, pc.ConnConfig.ConnectTimeout)

	rc, err := c.ReadPoolConfig()
	require.NoError(t, err)
	require.Nil(t, rc, "no replica configured")

	_, err = (&Config{}).PoolConfig()
	require.EqualError(t, err, "DATABASE_URL: required")
	_, err = (&Config{DatabaseURL: "postgres://h:port/db"}).PoolConfig()
	require.EqualError(t, err, "DATABASE_URL: cannot parse `postgres://h:port/db`: invalid port")
	_, err = (&Config{DatabaseURL: testDatabaseURL, DatabaseReadURL: "mysql://app@replica/app"}).ReadPoolConfig()
	require.EqualError(t, err, `DATABASE_READ_URL: unsupported scheme "mysql://": `+wantPGForms)
}

func TestRedisOptions(t *testing.T) {
	t.Parallel()

	c, err := FromLookup(env(minimal(map[string]string{
		// The variables win over the same settings in the URL.
		"REDIS_URL":                     "redis://user:pw@cache.example.com:6380/3?dial_timeout=30s&read_timeout=30s&max_retries=9",
		"REDIS_CONNECT_TIMEOUT_MS":      "1200",
		"REDIS_COMMAND_TIMEOUT_MS":      "3400",
		"REDIS_MAX_RETRIES_PER_REQUEST": "7",
	})))
	require.NoError(t, err)

	opts, err := c.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, "cache.example.com:6380", opts.Addr)
	require.Equal(t, 3, opts.DB)
	require.Equal(t, "user", opts.Username)
	require.Equal(t, "pw", opts.Password)
	require.Equal(t, 1200*time.Millisecond, opts.DialTimeout)
	require.Equal(t, 3400*time.Millisecond, opts.ReadTimeout)
	require.Equal(t, 3400*time.Millisecond, opts.WriteTimeout)
	require.Equal(t, 7, opts.MaxRetries)
}

// TestRedisCommandTimeoutKeepsThePoolTimeout: go-redis waits for a free
// connection for the command timeout plus 1 s. The largest command timeout
// config accepted overflowed that sum, and a negative wait fails every
// command at once while the pool is busy ("connection pool timeout").
func TestRedisCommandTimeoutKeepsThePoolTimeout(t *testing.T) {
	t.Parallel()

	for _, v := range []string{"86400000", "9223372036854"} {
		c, err := FromLookup(env(minimal(map[string]string{"REDIS_COMMAND_TIMEOUT_MS": v})))
		if err != nil {
			continue // refused at boot: fine
		}
		opts, err := c.RedisOptions()
		require.NoError(t, err)
		rdb := redis.NewClient(opts) // applies go-redis's defaults; dials nothing yet
		require.Positive(t, rdb.Options().PoolTimeout, "REDIS_COMMAND_TIMEOUT_MS=%s", v)
		require.NoError(t, rdb.Close())
	}
}

func TestRedisOptionsDefaultsAndZeros(t *testing.T) {
	t.Parallel()

	c, err := FromLookup(env(minimal(nil)))
	require.NoError(t, err)
	opts, err := c.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:6379", opts.Addr)
	require.Equal(t, 0, opts.DB)
	require.Equal(t, 5*time.Second, opts.DialTimeout)
	require.Equal(t, 10*time.Second, opts.ReadTimeout)
	require.Equal(t, 10*time.Second, opts.WriteTimeout)
	require.Equal(t, 3, opts.MaxRetries)

	// go-redis reads 0 as "use my default"; -1 is its "none".
	c, err = FromLookup(env(minimal(map[string]string{
		"REDIS_COMMAND_TIMEOUT_MS":      "0",
		"REDIS_MAX_RETRIES_PER_REQUEST": "0",
	})))
	require.NoError(t, err)
	opts, err = c.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), opts.ReadTimeout)
	require.Equal(t, time.Duration(-1), opts.WriteTimeout)
	require.Equal(t, -1, opts.MaxRetries)

	_, err = (&Config{RedisURL: "http://cache"}).RedisOptions()
	require.EqualError(t, err, `REDIS_URL: unsupported scheme "http://": `+wantRedisForms)
}

func FuzzParseJWTKeys(f *testing.F) {
	for _, seed := range []string{
		"", "0123456789abcdef", "k1:0123456789abcdef", "k1:0123456789abcdef,k2:0123456789abcdef",
		"k1:0123456789abcdef,k1:0123456789abcdef", ",", ":", ",,:", "a:b:c,d", "é:0123456789abcdef\x00",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := ParseJWTKeys(s)
		if err != nil {
			require.Nil(t, keys)
			return
		}
		require.NotEmpty(t, keys)
		ids := map[string]bool{}
		for _, k := range keys {
			require.GreaterOrEqual(t, len(k.Secret), MinJWTSecretLen)
			require.False(t, ids[k.ID], "duplicate key id")
			ids[k.ID] = true
			if len(keys) > 1 {
				require.NotEmpty(t, k.ID)
			}
		}
		if keys[0].ID == "" {
			require.Equal(t, []JWTKey{{Secret: []byte(s)}}, keys, "an unnamed key is the whole value")
		}
	})
}

func ExampleFromLookup() {
	environment := map[string]string{
		"APP_MODE":          "api",
		"DATABASE_URL":      "postgres://kumiko@localhost/kumiko",
		"DATABASE_POOL_MAX": "abc",
		"JWT_SECRET":        "k1:too-short",
	}
	_, err := FromLookup(func(name string) (string, bool) {
		v, ok := environment[name]
		return v, ok
	})
	fmt.Println(err)

	var ve *VarError
	if errors.As(err, &ve) {
		fmt.Println("first bad variable:", ve.Name)
	}
	// Output:
	// DATABASE_POOL_MAX: must be a positive integer, got "abc"
	// JWT_SECRET: entry 1: secret must be at least 16 bytes, got 9
	// first bad variable: DATABASE_POOL_MAX
}

func ExampleParseJWTKeys() {
	keys, err := ParseJWTKeys("2025-06:new-secret-0123456789,2025-01:old-secret-0123456789")
	if err != nil {
		panic(err)
	}
	fmt.Println("signs with", keys[0].ID)
	for _, k := range keys {
		fmt.Println(k)
	}
	// Output:
	// signs with 2025-06
	// JWTKey{ID: "2025-06", Secret: [redacted 21 bytes]}
	// JWTKey{ID: "2025-01", Secret: [redacted 21 bytes]}
}

// FuzzRedactedPasswords: whatever a password holds, the error of a
// connection string that does not parse never quotes it (masking reaches
// pieces of at least minFragment bytes, so passwords are 8 or more here;
// whitespace, quotes and backslashes change what a keyword/value password
// is and are left out).
func FuzzRedactedPasswords(f *testing.F) {
	f.Add("hunter2/very+secret=", 0)
	f.Add("/0000000", 0)
	f.Add("abc#def?ghi", 1)
	f.Add("@00#0000", 2)
	f.Add("000://00", 3)
	f.Fuzz(func(t *testing.T, pw string, form int) {
		if len(pw) < 8 || strings.ContainsAny(pw, "\x00 \t\n\r\v\f'\\") {
			return
		}
		name, u := "DATABASE_URL", "host=db password = "+pw+" port=bad"
		switch form % 4 {
		case 0:
			name, u = "REDIS_URL", "redis://default:"+pw+"@cache:6379/0"
		case 1:
			name, u = "REDIS_URL", "redis://:"+pw+"@cache:bad/0"
		case 2:
			u = "postgres://u:" + pw + "@db:bad/x"
		}
		_, err := FromLookup(env(minimal(map[string]string{name: u})))
		if err != nil {
			require.NotContains(t, err.Error(), pw)
		}
	})
}
