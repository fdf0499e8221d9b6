package rebuild

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// Config tunes [Rebuild]. A nil *Config means the defaults.
type Config struct {
	// Logger receives progress and cleanup notes. Defaults to discarding.
	Logger *slog.Logger
	// BatchSize is the number of events per rebuild pass; a negative one,
	// or one above [MaxBatchSize], is an error. Defaults to the
	// projection's BatchSize, else 500.
	BatchSize int
	// Progress is called after every rebuild pass. Defaults to nothing.
	Progress func(Progress)
	// SwapLockTimeout bounds each lock wait of the swap transaction (the
	// live consumer's pass lock, the live table's lock); the swap is retried
	// after a timeout. Defaults to 3s.
	SwapLockTimeout time.Duration
	// SwapAttempts is how often the swap is tried before the rebuild is
	// abandoned. Defaults to 10.
	SwapAttempts int
}

// MaxBatchSize is the largest [Config].BatchSize, the bound of the
// dispatcher's own batch size (KUMIKO_DISPATCHER_BATCH_SIZE): a pass
// preallocates room for a whole batch, and a larger size from an operator's
// typo would take the process down with it.
const MaxBatchSize = 10_000

// Phase names a step of a rebuild.
type Phase string

const (
	// PhaseCatchUp replays the log into the shadow table while the live
	// consumer runs.
	PhaseCatchUp Phase = "catch-up"
	// PhaseSwap is the last catch-up under the live consumer's lock, before
	// the tables are swapped.
	PhaseSwap Phase = "swap"
)

// Progress reports a rebuild pass.
type Progress struct {
	// Projection is the projection's name.
	Projection string
	// Phase is the current step.
	Phase Phase
	// Events is the number of events applied to the shadow table so far.
	Events int64
}

// Result reports a finished rebuild.
type Result struct {
	// Projection is the projection's name.
	Projection string
	// Table is the rebuilt table, schema-qualified.
	Table string
	// Events is the number of events the rebuild applied.
	Events int64
	// Cursor is where the live consumer continues.
	Cursor eventstore.Cursor
	// Leftover is set when the shadow schema or consumer row of an
	// interrupted rebuild was found and removed first.
	Leftover bool
	// Duration is the wall time of the rebuild.
	Duration time.Duration
}

var (
	// ErrUnknownProjection is returned for a name no projection has.
	ErrUnknownProjection = errors.New("rebuild: unknown projection")
	// ErrNotRebuildable is returned for a projection that cannot be rebuilt
	// (inline, side-effect-only, saga, per-instance), and when a handler
	// appends or writes outside its table during the rebuild.
	ErrNotRebuildable = errors.New("rebuild: projection cannot be rebuilt")
	// ErrRunning is returned when another rebuild of the projection runs.
	ErrRunning = errors.New("rebuild: a rebuild of this projection is already running")
	// ErrDisabled is returned when an operator disabled the rebuild's
	// temporary consumer (`kumiko consumer disable NAME#rebuild`) while it
	// ran: parked, it can never reach the end of the log, so the rebuild
	// stops and removes what it built.
	ErrDisabled = errors.New("rebuild: the rebuild's temporary consumer was disabled")
)

// frameworkTables are the framework's own tables; no projection owns one.
var frameworkTables = map[string]bool{
	"events": true, "streams": true, "event_consumers": true, "event_dead_letters": true,
}

// ConsumerName returns the name of the temporary consumer that rebuilds the
// projection name: "<name>#rebuild".
func ConsumerName(name string) string { return name + "#rebuild" }

// ShadowSchema returns the schema a rebuild of the projection name builds
// its table in: "kumiko_rebuild_" + a short hash of the name + "_" + the
// name's letters and digits (at most 63 bytes).
func ShadowSchema(name string) string {
	sum := sha256.Sum256([]byte(name))
	var slug strings.Builder
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			slug.WriteRune(r)
		} else {
			slug.WriteByte('_')
		}
	}
	s := "kumiko_rebuild_" + hex.EncodeToString(sum[:4]) + "_" + slug.String()
	if len(s) > 63 {
		s = s[:63]
	}
	return s
}

// Check returns the projection called name when it can be rebuilt: a shared
// multi-stream projection with an unqualified Table that is not a saga and
// that no other projection names as its Table. It
// returns an error wrapping [ErrUnknownProjection] or [ErrNotRebuildable]
// otherwise.
func Check(reg *framework.Registry, name string) (*framework.Projection, error) {
	p := reg.Projection(name)
	if p == nil {
		var known []string
		for _, q := range reg.Projections() {
			if q.Kind() == framework.KindMultiStream && q.Options().Table != "" {
				known = append(known, q.Name())
			}
		}
		return nil, fmt.Errorf("%w %q (projections with a table: %s)", ErrUnknownProjection, framework.Excerpt(name), cmp.Or(strings.Join(known, ", "), "none"))
	}
	o := p.Options()
	switch {
	case p.Kind() != framework.KindMultiStream:
		return nil, fmt.Errorf("%w: %s is an inline projection: it runs in the write transaction and has no cursor to replay", ErrNotRebuildable, name)
	case o.Saga:
		return nil, fmt.Errorf("%w: %s is a saga: a replay would append its events again", ErrNotRebuildable, name)
	case o.Table == "":
		return nil, fmt.Errorf("%w: %s is side-effect-only (no Table): its effects cannot be redone into a fresh table", ErrNotRebuildable, name)
	case o.Delivery == framework.DeliveryPerInstance:
		return nil, fmt.Errorf("%w: %s has per-instance delivery: only shared projections can be rebuilt", ErrNotRebuildable, name)
	case strings.Contains(o.Table, "."):
		return nil, fmt.Errorf("%w: %s names its table with a schema (%q): a rebuild redirects unqualified names only", ErrNotRebuildable, name, o.Table)
	case frameworkTables[o.Table]:
		return nil, fmt.Errorf("%w: %s names the framework table %q", ErrNotRebuildable, name, o.Table)
	}
	for _, q := range reg.Projections() {
		t := q.Options().Table
		if i := strings.LastIndexByte(t, '.'); i >= 0 {
			t = t[i+1:]
		}
		if q != p && t == o.Table {
			return nil, fmt.Errorf("%w: %s shares its table %q with %s: the new table would hold only the rows of %s, and those of %s would be lost",
				ErrNotRebuildable, name, o.Table, q.Name(), name, q.Name())
		}
	}
	return p, nil
}

const (
	sessionLockSQL   = `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`
	sessionUnlockSQL = `SELECT pg_advisory_unlock(hashtextextended($1, 0))`
	// liveTableSQL resolves the table the handlers' unqualified name means
	// on this connection's search_path.
	liveTableSQL = `SELECT n.nspname, c.relkind::text, c.relrowsecurity, c.relforcerowsecurity, current_setting('search_path')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
	leftoverSQL = `SELECT to_regnamespace($1) IS NOT NULL
  OR EXISTS (SELECT 1 FROM event_consumers WHERE name = $2)`
	// writesSQL returns the write counters of every table this backend
	// has written and not yet reported (the pg_stat_xact counters also hold
	// earlier transactions' writes until the backend flushes them, so
	// [run.verify] compares with a baseline, never absolute values).
	writesSQL = `SELECT oid::bigint, name, n FROM (
  SELECT c.oid, c.relnamespace::regnamespace::text || '.' || c.relname AS name, pg_stat_get_xact_tuples_inserted(c.oid) + pg_stat_get_xact_tuples_updated(c.oid)
    + pg_stat_get_xact_tuples_deleted(c.oid) AS n
  FROM pg_class c WHERE c.relkind IN ('r', 'p') AND c.relnamespace <> 'pg_catalog'::regnamespace) w
WHERE n > 0`
	// rebuildStateSQL reads the temporary consumer's state row, and whether
	// visible events of its types lie after its cursor (a pass that skipped
	// an event delivers less than a batch without reaching the end).
	rebuildStateSQL = `SELECT status, attempts, coalesce(last_error, ''), failed_position, cursor_commit_key, cursor_position, events_processed,
  EXISTS (SELECT 1 FROM events e
    WHERE (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
      AND e.commit_key < pg_snapshot_xmin(pg_current_snapshot())
      AND (c.event_types IS NULL OR e.type = ANY(c.event_types)))
FROM event_consumers c WHERE name = $1 AND instance_id = $2`
	passLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	// takeOverSQL creates a live state row (the stored ones are deleted
	// first) at the rebuild's cursor.
	takeOverSQL = `INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position,
  events_processed, status, partition_index, partition_count)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	// moveDeadLettersSQL gives the rebuild's dead letters to the live
	// consumer: to the partition of the event's stream when it is
	// partitioned ($3 partitions; the first one when the event is gone).
	moveDeadLettersSQL = `UPDATE event_dead_letters dl SET consumer = CASE WHEN $3::int <= 1 THEN $1
  ELSE $1 || '@' || coalesce((SELECT kumiko_stream_partition(e.stream_id, $3) FROM events e WHERE e.position = dl.position), 0)::text END
WHERE dl.consumer = $2`
)

// run is one rebuild in progress.
type run struct {
	pool       *pgxpool.Pool
	reg        *framework.Registry
	p          *framework.Projection
	cfg        Config
	log        *slog.Logger
	conn       *pgxpool.Conn // holds the session lock; runs DDL and the swap
	consumer   string
	schema     string // shadow schema
	table      string // the table's name
	liveSchema string
	searchPath string
	rls        bool   // the live table has row-level security enabled
	forceRLS   bool   // ... and forced on its owner
	shadow     string // the shadow table, quoted and qualified
	live       string // the live table, quoted and qualified
	shadowOID  int64
	events     int64

	// Pass-local write accounting of apply (passes run one at a time).
	newPass  bool
	first    int64
	last     eventstore.Cursor
	baseline map[int64]int64
	names    map[int64]string

	mu    sync.Mutex
	fatal error
}

// Rebuild replays the projection called name from the start of the log into
// a fresh copy of its table and swaps it in (see the package documentation).
// Writes continue meanwhile. It returns an error wrapping
// [ErrUnknownProjection] or [ErrNotRebuildable] for a projection it refuses,
// [ErrRunning] when another rebuild of it runs, and any failure of a handler
// during the replay; after a failure nothing of the rebuild remains and the
// live table is untouched. The pool needs at least two connections.
func Rebuild(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, name string, cfg *Config) (*Result, error) {
	start := time.Now()
	p, err := Check(reg, name)
	if err != nil {
		return nil, err
	}
	if pool.Config().MaxConns < 2 {
		return nil, errors.New("rebuild: the pool needs at least 2 connections")
	}
	if cfg != nil && cfg.BatchSize < 0 {
		return nil, fmt.Errorf("rebuild: batch size %d is negative", cfg.BatchSize)
	}
	if cfg != nil && cfg.BatchSize > MaxBatchSize {
		return nil, fmt.Errorf("rebuild: batch size %d is above the maximum of %d", cfg.BatchSize, MaxBatchSize)
	}
	r, release, err := open(ctx, pool, reg, p.Name(), p, cfg)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := r.rebuild(ctx)
	if err != nil {
		r.log.Warn("rebuild failed; removing its shadow table", "projection", name, "error", err)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if r.conn.Conn().IsClosed() {
			// A cancelled query closed the connection; its backend may still
			// hold the rebuild lock (it notices the closed socket only when
			// its query ends). End it and take the lock again for the cleanup.
			again, releaseAgain, lerr := reopen(cctx, pool, reg, p, cfg, r.conn.Conn().PgConn().PID())
			if lerr != nil {
				return nil, errors.Join(err, lerr)
			}
			defer releaseAgain()
			r = again
		}
		if _, cerr := r.cleanup(cctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

// Abandon removes what an interrupted rebuild of the projection called name
// left behind (its shadow schema and temporary consumer row) without
// rebuilding, and reports whether there was anything. A name reg does not
// declare (a projection removed or renamed since the rebuild was killed),
// or declares as a projection that can no longer be rebuilt (a saga now,
// or without its Table), is looked for all the same: its leftover row
// would pin retention forever. It returns [ErrRunning] while a rebuild of
// the projection runs.
func Abandon(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, name string) (bool, error) {
	// The cleanup needs only the names derived from name; the rebuild lock
	// is by name, so a rebuild of it by an older build that still runs
	// excludes this.
	r, release, err := open(ctx, pool, reg, name, nil, nil)
	if err != nil {
		return false, err
	}
	defer release()
	return r.cleanup(ctx)
}

// open takes the rebuild lock of the projection called name on a dedicated
// connection. p is nil for a name the registry does not declare (only
// cleanup may run then).
func open(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, name string, p *framework.Projection, cfg *Config) (*run, func(), error) {
	if cfg == nil {
		cfg = &Config{}
	}
	var o framework.ProjectionOptions
	if p != nil {
		o = p.Options()
	}
	c := *cfg
	c.BatchSize = cmp.Or(c.BatchSize, o.BatchSize, 500)
	c.SwapLockTimeout = cmp.Or(c.SwapLockTimeout, 3*time.Second)
	c.SwapAttempts = cmp.Or(c.SwapAttempts, 10)
	r := &run{
		pool: pool, reg: reg, p: p, cfg: c,
		log:      cmp.Or(c.Logger, slog.New(slog.DiscardHandler)),
		consumer: ConsumerName(name),
		schema:   ShadowSchema(name),
		table:    o.Table,
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("rebuild: acquire: %w", err)
	}
	lockKey := "kumiko-rebuild\x1f" + name
	var locked bool
	if err := conn.QueryRow(ctx, sessionLockSQL, lockKey).Scan(&locked); err != nil {
		conn.Release()
		return nil, nil, fmt.Errorf("rebuild: lock: %w", err)
	}
	if !locked {
		conn.Release()
		return nil, nil, fmt.Errorf("%w: %s", ErrRunning, name)
	}
	r.conn = conn
	release := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, sessionUnlockSQL, lockKey); err != nil {
			// Never hand a connection that may still hold the lock back.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}
	return r, release, nil
}

// reopen ends the backend pid of an abandoned rebuild connection and takes
// the rebuild lock on a new connection, waiting until the backend is gone.
func reopen(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, p *framework.Projection, cfg *Config, pid uint32) (*run, func(), error) {
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(pid)); err != nil {
		return nil, nil, fmt.Errorf("rebuild: end abandoned connection: %w", err)
	}
	for {
		r, release, err := open(ctx, pool, reg, p.Name(), p, cfg)
		if !errors.Is(err, ErrRunning) {
			return r, release, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rebuild runs the three steps.
func (r *run) rebuild(ctx context.Context) (*Result, error) {
	if err := r.resolve(ctx); err != nil {
		return nil, err
	}
	leftover, err := r.cleanup(ctx)
	if err != nil {
		return nil, err
	}
	if leftover {
		r.log.Info("removed the leftover of an interrupted rebuild", "projection", r.p.Name(), "schema", r.schema)
	}
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	d, err := r.dispatcher(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.catchUp(ctx, d, PhaseCatchUp, 0); err != nil {
		return nil, err
	}
	res, err := r.swap(ctx, d)
	if err != nil {
		return nil, err
	}
	res.Leftover = leftover
	return res, nil
}

// resolve finds the live table on the connection's search_path.
func (r *run) resolve(ctx context.Context) error {
	var kind string
	err := r.conn.QueryRow(ctx, liveTableSQL, pgx.Identifier{r.table}.Sanitize()).Scan(&r.liveSchema, &kind, &r.rls, &r.forceRLS, &r.searchPath)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("rebuild: %s: table %q does not exist (are the migrations applied?)", r.p.Name(), r.table)
	}
	if err != nil {
		return fmt.Errorf("rebuild: resolve table %s: %w", r.table, err)
	}
	if kind != "r" {
		return fmt.Errorf("%w: %s: %q is not a plain table (relkind %s)", ErrNotRebuildable, r.p.Name(), r.table, kind)
	}
	if r.liveSchema == r.schema {
		return fmt.Errorf("rebuild: %s: table %q resolves into the shadow schema %s", r.p.Name(), r.table, r.schema)
	}
	r.live = pgx.Identifier{r.liveSchema, r.table}.Sanitize()
	r.shadow = pgx.Identifier{r.schema, r.table}.Sanitize()
	r.searchPath = pgx.Identifier{r.schema}.Sanitize() + ", " + r.searchPath
	return nil
}

// cleanup removes the shadow schema and the temporary consumer's row and
// dead letters; it reports whether there was anything to remove.
func (r *run) cleanup(ctx context.Context) (bool, error) {
	var found bool
	if err := r.conn.QueryRow(ctx, leftoverSQL, r.schema, r.consumer).Scan(&found); err != nil {
		return false, fmt.Errorf("rebuild: look for leftovers: %w", err)
	}
	if !found {
		return false, nil
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`DROP SCHEMA IF EXISTS ` + pgx.Identifier{r.schema}.Sanitize() + ` CASCADE`)
	b.Queue(`DELETE FROM event_consumers WHERE name = $1`, r.consumer)
	b.Queue(`DELETE FROM event_dead_letters WHERE consumer = $1`, r.consumer)
	b.Queue(`COMMIT`)
	if err := r.conn.SendBatch(ctx, b).Close(); err != nil {
		rollback(r.conn.Conn())
		return false, fmt.Errorf("rebuild: remove leftovers: %w", err)
	}
	return true, nil
}

// tenantGrantsSQL lists the privileges the tenant role ($2) holds on the
// table $1 (column "" for the table, else the column's name), as GRANT
// lists: a table without kumiko_enable_tenancy may be the tenant role's to
// use through plain grants, which LIKE does not copy.
const tenantGrantsSQL = `SELECT '', string_agg(DISTINCT x.privilege_type, ', ')
FROM pg_class c, aclexplode(c.relacl) x WHERE c.oid = $1::regclass AND x.grantee = $2::regrole
HAVING count(*) > 0
UNION ALL
SELECT a.attname, string_agg(DISTINCT x.privilege_type, ', ')
FROM pg_attribute a, aclexplode(a.attacl) x WHERE a.attrelid = $1::regclass AND x.grantee = $2::regrole
  AND a.attnum > 0 AND NOT a.attisdropped
GROUP BY a.attname`

// policiesSQL lists the row-level security policies of the table $1 as
// the clauses of CREATE POLICY: name, AS, FOR, TO (quoted roles, PUBLIC
// for none) and the USING and WITH CHECK expressions ("" when absent),
// deparsed for this session's search_path.
const policiesSQL = `SELECT p.polname,
  CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
  CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
  coalesce((SELECT string_agg(CASE WHEN r.oid = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.oid)) END, ', ' ORDER BY r.n)
    FROM unnest(p.polroles) WITH ORDINALITY AS r(oid, n)), 'PUBLIC'),
  coalesce(pg_get_expr(p.polqual, p.polrelid), ''), coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '')
FROM pg_policy p WHERE p.polrelid = $1::regclass ORDER BY p.polname`

// policy is one row-level security policy of the live table (policiesSQL).
type policy struct{ name, as, cmd, roles, using, check string }

// createSQL returns the statement that creates p on table.
func (p policy) createSQL(table string) string {
	q := `CREATE POLICY ` + pgx.Identifier{p.name}.Sanitize() + ` ON ` + table + ` AS ` + p.as + ` FOR ` + p.cmd + ` TO ` + p.roles
	if p.using != "" {
		q += ` USING (` + p.using + `)`
	}
	if p.check != "" {
		q += ` WITH CHECK (` + p.check + `)`
	}
	return q
}

// prepare creates the shadow schema and table (with the live table's
// row-level security, its policies as they are, and the tenant role's
// grants of the live table) and checks that the projection's unqualified
// table name resolves to the shadow table, both for the owner and for the
// tenant role.
func (r *run) prepare(ctx context.Context) error {
	rows, err := r.conn.Query(ctx, tenantGrantsSQL, r.live, tenancy.Role)
	if err != nil {
		return fmt.Errorf("rebuild: read grants of %s: %w", r.live, err)
	}
	type grant struct{ column, privileges string }
	grants, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (grant, error) {
		var g grant
		err := row.Scan(&g.column, &g.privileges)
		return g, err
	})
	if err != nil {
		return fmt.Errorf("rebuild: read grants of %s: %w", r.live, err)
	}
	rows, err = r.conn.Query(ctx, policiesSQL, r.live)
	if err != nil {
		return fmt.Errorf("rebuild: read policies of %s: %w", r.live, err)
	}
	policies, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (policy, error) {
		var p policy
		err := row.Scan(&p.name, &p.as, &p.cmd, &p.roles, &p.using, &p.check)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("rebuild: read policies of %s: %w", r.live, err)
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`CREATE SCHEMA ` + pgx.Identifier{r.schema}.Sanitize())
	b.Queue(`GRANT USAGE ON SCHEMA ` + pgx.Identifier{r.schema}.Sanitize() + ` TO ` + tenancy.Role)
	b.Queue(`CREATE TABLE ` + r.shadow + ` (LIKE ` + r.live + ` INCLUDING ALL)`)
	// The live table's row-level security as it is: Kumiko's tenancy
	// policies (kumiko_enable_tenancy) and any written by hand, which may
	// name no tenant_id at all. kumiko_enable_tenancy on the shadow table
	// failed on such a table, and dropped the others.
	if r.rls {
		b.Queue(`ALTER TABLE ` + r.shadow + ` ENABLE ROW LEVEL SECURITY`)
	}
	if r.forceRLS {
		b.Queue(`ALTER TABLE ` + r.shadow + ` FORCE ROW LEVEL SECURITY`)
	}
	for _, p := range policies {
		b.Queue(p.createSQL(r.shadow))
	}
	for _, g := range grants {
		// The privilege names come from aclexplode (SELECT, INSERT, ...);
		// a column's are each followed by the column.
		privileges := g.privileges
		if g.column != "" {
			col := " (" + pgx.Identifier{g.column}.Sanitize() + ")"
			privileges = strings.ReplaceAll(privileges, ", ", col+", ") + col
		}
		b.Queue(`GRANT ` + privileges + ` ON ` + r.shadow + ` TO ` + tenancy.Role)
	}
	b.Queue(`COMMIT`)
	if err := r.conn.SendBatch(ctx, b).Close(); err != nil {
		rollback(r.conn.Conn())
		return fmt.Errorf("rebuild: create shadow table %s: %w", r.shadow, err)
	}
	if err := r.conn.QueryRow(ctx, `SELECT $1::regclass::oid::bigint`, r.shadow).Scan(&r.shadowOID); err != nil {
		return fmt.Errorf("rebuild: shadow table: %w", err)
	}
	var asOwner, asTenant bool
	b = &pgx.Batch{}
	b.Queue(`BEGIN READ ONLY`)
	b.Queue(`SELECT set_config('search_path', $1, true)`, r.searchPath)
	b.Queue(`SELECT to_regclass($1) = $2::regclass`, pgx.Identifier{r.table}.Sanitize(), r.shadow).QueryRow(func(row pgx.Row) error { return row.Scan(&asOwner) })
	tenancy.QueueScope(b, "kumiko-rebuild-check")
	b.Queue(`SELECT coalesce(to_regclass($1) = $2::regclass, false)`, pgx.Identifier{r.table}.Sanitize(), r.shadow).QueryRow(func(row pgx.Row) error { return row.Scan(&asTenant) })
	b.Queue(`ROLLBACK`)
	if err := r.conn.SendBatch(ctx, b).Close(); err != nil {
		rollback(r.conn.Conn())
		return fmt.Errorf("rebuild: check shadow table: %w", err)
	}
	if !asOwner || !asTenant {
		return fmt.Errorf("rebuild: %q does not resolve to the shadow table %s on the rebuild's search_path (owner %t, tenant role %t)", r.table, r.shadow, asOwner, asTenant)
	}
	return nil
}

// dispatcher returns a dispatcher running the temporary consumer, with its
// state row registered at the start of the log.
func (r *run) dispatcher(ctx context.Context) (*dispatcher.Dispatcher, error) {
	o := r.p.Options()
	d, err := dispatcher.New(r.pool, r.reg, []dispatcher.Consumer{{
		Name:            r.consumer,
		Delivery:        framework.DeliveryShared,
		EventTypes:      r.p.EventTypes(),
		Apply:           r.apply,
		SkipApplyErrors: o.SkipApplyErrors,
		MaxAttempts:     3,
		BatchSize:       r.cfg.BatchSize,
		SearchPath:      r.searchPath,
		BeforeCommit:    r.verify,
	}}, &dispatcher.Config{
		InstanceID:     "kumiko-rebuild",
		Logger:         r.log,
		BatchSize:      r.cfg.BatchSize,
		RetryBaseDelay: 50 * time.Millisecond,
		RetryMaxDelay:  500 * time.Millisecond,
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	if err := d.Register(ctx); err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	return d, nil
}

// apply runs the projection's handler in a rebuild pass; it fails the
// rebuild when the handler appends events. At the first event of each pass
// transaction it reads the backend's table write counters, which
// [run.verify] compares before the pass commits.
func (r *run) apply(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
	// A new pass transaction: a new RunOnce, or the dispatcher's re-run of
	// a pass up to a failed event (it starts again from the first event).
	if r.newPass || !r.last.Less(env.Cursor()) {
		base, err := r.writes(ctx, tx)
		if err != nil {
			return err
		}
		r.baseline, r.newPass, r.first = base, false, env.Position
	}
	r.last = env.Cursor()
	if err := r.p.Apply(ctx, tx, env); err != nil {
		if errors.Is(err, framework.ErrNewerEventVersion) {
			// A live consumer waits for the newer code (the dispatcher
			// retries such an event without end); a rebuild cannot, and a
			// table built without the event would be wrong.
			return r.abort(fmt.Errorf("rebuild: %s: %w", r.p.Name(), err))
		}
		return err
	}
	if tx.HasPending() || tx.Written() > 0 {
		return r.abort(fmt.Errorf("%w: %s appended events while handling event %d (%s); a projection that appends events is a saga",
			ErrNotRebuildable, r.p.Name(), env.Position, env.Type))
	}
	return nil
}

// verify runs before a rebuild pass commits: it fails the pass, and the
// rebuild, when the pass's handlers wrote to any table but the shadow
// table (pg_stat_xact counters also hold earlier transactions' writes until
// the backend reports them, so it compares with the counters taken at the
// pass's first event, never absolute values).
func (r *run) verify(ctx context.Context, db framework.DB) error {
	now, err := r.writes(ctx, db)
	if err != nil {
		return err
	}
	var others []string
	for rel, n := range now {
		if rel != r.shadowOID && n > r.baseline[rel] {
			others = append(others, r.names[rel])
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		return r.abort(fmt.Errorf("%w: %s wrote to %s while handling events %d to %d; a rebuildable projection writes only to its table %s",
			ErrNotRebuildable, r.p.Name(), strings.Join(others, ", "), r.first, r.last.Position, r.table))
	}
	return nil
}

// writes reads the backend's table write counters.
func (r *run) writes(ctx context.Context, db framework.DB) (map[int64]int64, error) {
	rows, err := db.Query(ctx, writesSQL)
	if err != nil {
		return nil, fmt.Errorf("rebuild: read write counters: %w", err)
	}
	defer rows.Close()
	out := map[int64]int64{}
	for rows.Next() {
		var rel, n int64
		var name string
		if err := rows.Scan(&rel, &name, &n); err != nil {
			return nil, fmt.Errorf("rebuild: read write counters: %w", err)
		}
		out[rel] = n
		if r.names == nil {
			r.names = map[int64]string{}
		}
		r.names[rel] = name
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rebuild: read write counters: %w", err)
	}
	return out, nil
}

// abort records a fatal error (the dispatcher would retry or skip the
// event; the rebuild must stop) and returns it.
func (r *run) abort(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal == nil {
		r.fatal = err
	}
	return err
}

func (r *run) fatalErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// consumerState is the temporary consumer's state row.
type consumerState struct {
	status    string
	attempts  int
	lastError string
	failedAt  *int64
	cursor    eventstore.Cursor
	processed int64
	// more is set when visible events of the consumer's types lie after
	// the cursor.
	more bool
}

func (r *run) state(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (consumerState, error) {
	var st consumerState
	err := db.QueryRow(ctx, rebuildStateSQL, r.consumer, dispatcher.SharedInstance).
		Scan(&st.status, &st.attempts, &st.lastError, &st.failedAt, &st.cursor.CommitKey, &st.cursor.Position, &st.processed, &st.more)
	if err != nil {
		return st, fmt.Errorf("rebuild: read state of %s: %w", r.consumer, err)
	}
	return st, nil
}

// EventError is returned when the projection's handler kept failing on an
// event of the replay: the rebuild stopped, removed what it built and left
// the live table as it was. Fix the handler (or the event's data) and
// rebuild again.
type EventError struct {
	// Projection is the projection's name.
	Projection string
	// Position is the failing event's position (0 when not recorded).
	Position int64
	// Attempts counts the handler's failed attempts on it.
	Attempts int
	// LastError is the handler's last error.
	LastError string
}

// Error names the projection, the event and the handler's error.
func (e *EventError) Error() string {
	at := "?"
	if e.Position > 0 {
		at = fmt.Sprint(e.Position)
	}
	return fmt.Sprintf("rebuild: %s failed at event %s after %d attempts: %s", e.Projection, at, e.Attempts, e.LastError)
}

// failed turns a dead temporary consumer into the rebuild's *EventError.
func (r *run) failed(st consumerState) error {
	e := &EventError{Projection: r.p.Name(), Attempts: st.attempts, LastError: st.lastError}
	if st.failedAt != nil {
		e.Position = *st.failedAt
	}
	return e
}

// catchUp runs passes of the temporary consumer until one comes back with
// less than a full batch, no failure pending and no visible event left
// after its cursor (the end of the visible log; a pass that skipped an
// event of a SkipApplyErrors projection also delivers less than a batch),
// or maxPasses passes ran (0: no limit).
func (r *run) catchUp(ctx context.Context, d *dispatcher.Dispatcher, phase Phase, maxPasses int) error {
	for passes := 0; maxPasses == 0 || passes < maxPasses; passes++ {
		r.newPass = true
		n, err := d.RunOnce(ctx, r.consumer)
		if ferr := r.fatalErr(); ferr != nil {
			return ferr
		}
		if err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
		r.events += int64(n)
		if r.cfg.Progress != nil {
			r.cfg.Progress(Progress{Projection: r.p.Name(), Phase: phase, Events: r.events})
		}
		if n >= r.cfg.BatchSize {
			continue
		}
		st, err := r.state(ctx, r.pool)
		if err != nil {
			return err
		}
		switch {
		case st.status == "dead":
			return r.failed(st)
		case st.status == "disabled":
			// No pass delivers to it any more: polling would never end.
			return fmt.Errorf("%w: %s; the rebuild of %s stopped (rebuild again to start over)", ErrDisabled, r.consumer, r.p.Name())
		case st.attempts > 0 || st.failedAt != nil: // a failed event waits for its retry
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		case st.more: // a pass that skipped an event; the log goes on
		default:
			return nil
		}
	}
	return nil
}

// swap runs the swap transaction, retrying it after lock timeouts.
func (r *run) swap(ctx context.Context, d *dispatcher.Dispatcher) (*Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := r.swapOnce(ctx, d)
		if err == nil {
			return res, nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || attempt >= r.cfg.SwapAttempts {
			return nil, err
		}
		r.log.Info("rebuild swap timed out waiting for a lock; retrying", "projection", r.p.Name(), "attempt", attempt)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// swapOnce takes the live consumer's pass lock, catches up a last time,
// swaps the tables and hands the cursor over, in one transaction.
func (r *run) swapOnce(ctx context.Context, d *dispatcher.Dispatcher) (*Result, error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("rebuild: swap: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	timeout := fmt.Sprintf("%dms", max(r.cfg.SwapLockTimeout.Milliseconds(), 1))
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, timeout); err != nil {
		return nil, fmt.Errorf("rebuild: swap: %w", err)
	}
	// First the registration lock: no dispatcher converts the rows while
	// the swap replaces them (the dispatcher takes it first too).
	partitions := max(r.p.Options().Partitions, 1)
	if _, err := tx.Exec(ctx, passLockSQL, dispatcher.LayoutLockKey(r.p.Name(), dispatcher.SharedInstance)); err != nil {
		return nil, fmt.Errorf("rebuild: swap: lock live consumer: %w", err)
	}
	// Then the dispatcher's pass locks of the live consumer's state rows,
	// those stored and those its partitioning declares now: no live pass
	// runs (or is in flight) until this transaction ends. Taken in name
	// order, as the dispatcher's registration takes them.
	declared := dispatcher.RowNames(r.p.Name(), partitions)
	stored, _, err := dispatcher.StoredRows(ctx, tx, r.p.Name(), dispatcher.SharedInstance, false)
	if err != nil {
		return nil, fmt.Errorf("rebuild: swap: %w", err)
	}
	locks := slices.Concat(declared, stored)
	slices.Sort(locks)
	for _, name := range slices.Compact(locks) {
		if _, err := tx.Exec(ctx, passLockSQL, dispatcher.LockKey(name, dispatcher.SharedInstance)); err != nil {
			return nil, fmt.Errorf("rebuild: swap: lock live consumer: %w", err)
		}
	}
	if err := r.catchUp(ctx, d, PhaseSwap, 20); err != nil {
		return nil, err
	}
	st, err := r.state(ctx, tx)
	if err != nil {
		return nil, err
	}
	if st.status == "dead" {
		return nil, r.failed(st)
	}
	// The consumer table before the live table: an events prune holds it
	// in SHARE mode while it runs, and the swap must wait for that (up to
	// the lock timeout) before it drops the live table, not while holding
	// it, or every reader of the table waits too. (Not before the last
	// catch-up: its passes' cursor updates would queue behind a prune
	// waiting for this transaction.)
	if _, err := tx.Exec(ctx, `LOCK TABLE event_consumers IN ROW EXCLUSIVE MODE`); err != nil {
		return nil, fmt.Errorf("rebuild: swap: lock event_consumers: %w", err)
	}
	owned, err := ownedSequences(ctx, tx, r.live)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	for _, o := range owned {
		b.Queue(`ALTER SEQUENCE ` + o.sequence + ` OWNED BY NONE`)
	}
	b.Queue(`DROP TABLE ` + r.live)
	b.Queue(`ALTER TABLE ` + r.shadow + ` SET SCHEMA ` + pgx.Identifier{r.liveSchema}.Sanitize())
	for _, o := range owned {
		b.Queue(`ALTER SEQUENCE ` + o.sequence + ` OWNED BY ` + r.live + `.` + pgx.Identifier{o.column}.Sanitize())
	}
	b.Queue(`DROP SCHEMA ` + pgx.Identifier{r.schema}.Sanitize())
	// The live rows start at the rebuild's cursor, in the partitioning
	// declared now; a live consumer an operator disabled (any of its rows)
	// stays disabled.
	stored, statuses, err := dispatcher.StoredRows(ctx, tx, r.p.Name(), dispatcher.SharedInstance, true)
	if err != nil {
		return nil, fmt.Errorf("rebuild: swap: %w", err)
	}
	status := "idle"
	if slices.Contains(statuses, "disabled") {
		status = "disabled"
	}
	b.Queue(`DELETE FROM event_consumers WHERE name = ANY($1) AND instance_id = $2`, stored, dispatcher.SharedInstance)
	for i, name := range declared {
		processed := int64(0)
		if i == 0 {
			processed = st.processed
		}
		b.Queue(takeOverSQL, name, dispatcher.SharedInstance, r.p.EventTypes(), st.cursor.CommitKey, st.cursor.Position,
			processed, status, i, partitions)
	}
	b.Queue(`DELETE FROM event_consumers WHERE name = $1`, r.consumer)
	// The live consumer's dead letters are events the old table skipped;
	// the new one holds every event but the rebuild's own dead letters.
	b.Queue(`DELETE FROM event_dead_letters WHERE consumer = ANY($1)`, slices.Concat(declared, stored))
	b.Queue(moveDeadLettersSQL, r.p.Name(), r.consumer, partitions)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("rebuild: swap %s: %w", r.live, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("rebuild: swap: commit: %w", err)
	}
	return &Result{Projection: r.p.Name(), Table: r.live, Events: st.processed, Cursor: st.cursor}, nil
}

// ownedSequencesSQL lists the sequences owned by the columns of a table
// (serial and bigserial columns; an identity column's sequence is its own,
// and LIKE gives the shadow a new one).
const ownedSequencesSQL = `SELECT d.objid::regclass::text, a.attname
FROM pg_depend d
JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
  AND d.refobjid = $1::regclass AND d.deptype = 'a'
ORDER BY a.attnum`

// ownedSequence is a sequence a column owns.
type ownedSequence struct {
	sequence string // quoted, qualified as needed
	column   string
}

// ownedSequences returns the sequences the columns of table own. The shadow
// table's defaults draw from the same sequences (LIKE copies the
// nextval() defaults), so the swap hands them over: dropping the live
// table would otherwise drop them, which the shadow's defaults forbid.
func ownedSequences(ctx context.Context, tx pgx.Tx, table string) ([]ownedSequence, error) {
	rows, err := tx.Query(ctx, ownedSequencesSQL, table)
	if err != nil {
		return nil, fmt.Errorf("rebuild: swap: owned sequences: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ownedSequence, error) {
		var o ownedSequence
		err := r.Scan(&o.sequence, &o.column)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild: swap: owned sequences: %w", err)
	}
	return out, nil
}

// rollback ends a failed batch's transaction on conn; a connection that
// cannot is closed.
func rollback(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		_ = c.Close(ctx)
	}
}
