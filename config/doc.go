// Package config reads Kumiko's process configuration from the environment.
//
// It is the only package of Kumiko that reads environment variables: the
// command calls [Load] once at boot and hands the resulting [*Config] to the
// entrypoint; nothing below it looks at the environment again. Tests build a
// configuration with [FromLookup] and a map instead of mutating the process
// environment.
//
// # Failing at boot, with every problem
//
// [FromLookup] checks every variable before it returns. A bad deployment
// gets one error, an [errors.Join] of one [*VarError] per problem, each
// naming its variable:
//
//	APP_MODE: must be one of api, worker, all-in-one, got "server"
//	DATABASE_POOL_MAX: must be a positive integer, got "abc"
//	JWT_SECRET: entry 2: secret must be at least 16 bytes, got 9
//
// Errors never quote JWT_SECRET, and mask the password of DATABASE_URL,
// DATABASE_READ_URL and REDIS_URL.
//
// A variable set to the empty string counts as unset and gets its default.
// Durations named *_MS are whole numbers of milliseconds;
// DATABASE_POOL_IDLE_TIMEOUT and DATABASE_POOL_CONNECT_TIMEOUT are Go
// durations such as "30s" or "1m", or whole numbers of seconds ("30"), as
// Kumiko's scaling guide sets them. Booleans are true, false, 1 or 0.
//
// # Variables
//
//	Variable                            Default                    Field
//	APP_MODE                            all-in-one                 Mode: api, worker or all-in-one
//	HTTP_ADDR                           :8080                      HTTPAddr
//	WORKER_HTTP_ADDR                    :8081                      WorkerHTTPAddr (health + metrics of a worker)
//	HTTP_READ_TIMEOUT_MS                30000                      HTTPReadTimeout (headers at most 10 s, and the body)
//	HTTP_IDLE_TIMEOUT_MS                120000                     HTTPIdleTimeout (idle keep-alive connections)
//	DATABASE_URL                        required                   DatabaseURL
//	DATABASE_READ_URL                   unset (no replica)         DatabaseReadURL
//	DATABASE_POOL_MAX                   10                         DatabasePoolMax, 1..1000
//	DATABASE_POOL_IDLE_TIMEOUT          30s                        DatabasePoolIdleTimeout, > 0
//	DATABASE_POOL_CONNECT_TIMEOUT       5s                         DatabasePoolConnectTimeout, 0 = none
//	REDIS_URL                           redis://127.0.0.1:6379/0   RedisURL
//	REDIS_CONNECT_TIMEOUT_MS            5000                       RedisConnectTimeout, > 0
//	REDIS_COMMAND_TIMEOUT_MS            10000                      RedisCommandTimeout, 0 = none, at most 86400000
//	REDIS_MAX_RETRIES_PER_REQUEST       3                          RedisMaxRetries, 0 = none
//	KUMIKO_INSTANCE_ID                  unset (kumiko-<16 hex>)    InstanceID: [A-Za-z0-9._:-]{1,253}, not "__shared__"
//	JWT_SECRET                          required unless worker     JWTKeys, see [ParseJWTKeys]
//	KUMIKO_DISPATCHER_POLL_INTERVAL_MS  100                        DispatcherPollInterval, 1..86400000 (a day)
//	KUMIKO_DISPATCHER_BATCH_SIZE        500                        DispatcherBatchSize, 1..10000
//	KUMIKO_DISPATCHER_MAX_CONCURRENT_PASSES 2                      DispatcherMaxConcurrentPasses, 1..256
//	KUMIKO_DISPATCHER_POLL_ONLY         false                      DispatcherPollOnly (behind a transaction-pooling PgBouncer)
//	KUMIKO_DRAIN_TIMEOUT_MS             30000                      DrainTimeout
//	KUMIKO_IDEMPOTENCY_TTL              24h                        IdempotencyTTL (Go duration), >= 30s
//	KUMIKO_REPLICA_WAIT_MS              500                        ReplicaWait
//	KUMIKO_RUN_LOCAL_JOBS               false                      RunLocalJobs (api process consumes the api job lane)
//	KUMIKO_JOBS_CONCURRENCY             10                         JobsConcurrency (runs at once per job lane), 1..1000
//	KUMIKO_READY_MAX_LAG                0 (not checked)            ReadyMaxLag (events a consumer may lag before /health/ready fails), 0..1000000000
//	KUMIKO_DEV                          false                      Dev (demo page's dev token, sample nightly report every minute)
//	KUMIKO_SAMPLE_CRON                  unset (sample's schedule)  SampleCron, a cron spec such as "@every 2s"
//	LOG_LEVEL                           info                       LogLevel: debug, info, warn or error
//
// # Clients
//
// [Config.PoolConfig], [Config.ReadPoolConfig] and [Config.RedisOptions]
// turn the connection strings into pgx and go-redis configurations with the
// pool and timeout settings applied. The environment variables win over the
// equivalent parameters in the connection strings (pool_max_conns,
// pool_max_conn_idle_time, connect_timeout; dial_timeout, read_timeout,
// write_timeout, max_retries).
//
// pgx itself falls back to the libpq variables (PGHOST, PGUSER, PGPASSWORD,
// PGSSLMODE, ...) and to ~/.pgpass for whatever DATABASE_URL leaves out;
// this is the one place where the environment is read outside this
// package's own variables.
//
// # Sizing
//
// Every process holds its own pools, so DATABASE_POOL_MAX times the number
// of processes must stay under PostgreSQL's max_connections, with room left
// for operators. Scale out with more processes, not with a larger pool per
// process.
package config
