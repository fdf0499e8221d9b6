// Package tenancy scopes a Postgres transaction to one tenant, so that
// row-level security confines every statement in it to that tenant's rows.
//
// A tenant-scoped transaction sets kumiko.tenant_id and switches to the
// non-privileged role kumiko_tenant, both transaction-local (one statement:
// set_config(..., true) of both settings, the equivalent of SET LOCAL ROLE);
// the policies created by kumiko_enable_tenancy (FORCE ROW LEVEL SECURITY)
// then apply even when the pool connects as a superuser. The system tenant
// keeps the connecting role and so sees every tenant. [Begin] sends BEGIN
// and the scoping in one pipelined batch: one round trip. [BeginLazy] sends
// them with the transaction's first statement instead, and [SwitchLazily]
// re-scopes an open transaction with its next statement: no round trip of
// their own.
package tenancy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SystemTenantID is the tenant of framework-internal work; its transactions
// run unrestricted. No caller's token can carry it.
const SystemTenantID = "system"

// Role is the non-privileged role tenant-scoped transactions switch to.
const Role = "kumiko_tenant"

// Conn is the part of *pgx.Conn the package needs.
type Conn interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ScopeError is the failure of BEGIN or of the scoping statement of a
// tenant-scoped transaction ([Begin], [Switch] and the prefix of a [Lazy]).
// No caller's input reaches these statements, so the failure is the
// server's, never the client's: in particular insufficient_privilege
// (42501) here means the connecting database user may not switch to [Role]
// (it is not a member), not a row-level security violation. Err is the
// cause.
type ScopeError struct {
	// Tenant is the tenant the transaction was to be scoped to.
	Tenant string
	// Switch is true for the re-scoping of an open transaction.
	Switch bool
	// Err is the cause.
	Err error
}

// Error names the tenant and the cause, and how to fix a missing
// membership in [Role].
func (e *ScopeError) Error() string {
	what := "begin for"
	if e.Switch {
		what = "switch to"
	}
	msg := fmt.Sprintf("tenancy: %s tenant %q: %v", what, e.Tenant, e.Err)
	if e.Err != nil && e.Tenant != SystemTenantID && missingRole(e.Err) {
		msg += " (the database user may not SET ROLE " + Role + ": have the role's owner or a superuser run GRANT " + Role + " TO <the user>)"
	}
	return msg
}

// Unwrap returns the cause.
func (e *ScopeError) Unwrap() error { return e.Err }

// missingRole reports whether err is Postgres' insufficient_privilege.
func missingRole(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Options tune [Begin].
type Options struct {
	// ReadOnly starts a READ ONLY transaction. Defaults to false.
	ReadOnly bool
	// Lock, when not empty, is the key of a transaction-scoped advisory
	// lock (pg_advisory_xact_lock of the two int4 keys [LockIDs] derives
	// from it) that the transaction takes right after BEGIN, in the
	// statement that scopes it (before the scope takes effect) and so
	// before its first statement: the lock is held by every transaction
	// that can commit anything. Defaults to none.
	Lock string
}

// QueueScope queues the statement that scopes the open transaction to
// tenant (or lifts the restriction for [SystemTenantID]): one statement
// setting kumiko.tenant_id and the role, as SET LOCAL ROLE would
// (set_config('role', ..., true) is the same setting; "none" resets it to
// the session user).
func QueueScope(b *pgx.Batch, tenant string) {
	queueScope(b, tenant, "")
}

// queueScope queues QueueScope's statement; with a lock key (see
// [Options].Lock) the same statement takes the advisory lock too, so that
// a keyed write costs the database no statement of its own for it. Whatever
// order Postgres evaluates the target list in (left to right in practice),
// the statement succeeds or fails as a whole, its settings are local to
// the transaction, and it precedes every statement of the caller.
func queueScope(b *pgx.Batch, tenant, lock string) {
	role := Role
	if tenant == SystemTenantID {
		role = "none"
	}
	if lock != "" {
		k1, k2 := LockIDs(lock)
		b.Queue(`SELECT pg_advisory_xact_lock($3::int4, $4::int4), set_config('kumiko.tenant_id', $1, true), set_config('role', $2, true)`,
			tenant, role, k1, k2)
		return
	}
	b.Queue(`SELECT set_config('kumiko.tenant_id', $1, true), set_config('role', $2, true)`, tenant, role)
}

// LockIDs returns the two int4 keys of the advisory lock of key (see
// [Options].Lock): the first eight bytes of its SHA-256. A lock key may
// hold what a client chose (a keyed write's holds its idempotency key), so
// it is hashed with a hash nobody can aim at a given value, and the lock
// lives in Postgres' space of two-key advisory locks, apart from the
// single bigint keys of the framework's own locks (hashtextextended of a
// consumer's name for its passes, of a rebuild or of a prune; goose's
// migration lock): hashtextextended is Bob Jenkins' lookup3, which a
// client can invert, and a key hashed with it could be made to take a
// shared consumer's lock and pause it for every tenant.
func LockIDs(key string) (int32, int32) {
	sum := sha256.Sum256([]byte(key))
	return int32(binary.BigEndian.Uint32(sum[:4])), int32(binary.BigEndian.Uint32(sum[4:8]))
}

// Begin starts a transaction on conn scoped to tenant, in one round trip.
// On error the connection may be mid-transaction: the caller must roll back
// or discard it.
func Begin(ctx context.Context, conn Conn, tenant string, opts Options) error {
	if tenant == "" {
		return fmt.Errorf("tenancy: empty tenant id")
	}
	b := &pgx.Batch{}
	if opts.ReadOnly {
		b.Queue(`BEGIN READ ONLY`)
	} else {
		b.Queue(`BEGIN`)
	}
	queueScope(b, tenant, opts.Lock)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return &ScopeError{Tenant: tenant, Err: err}
	}
	return nil
}

// Switch re-scopes an open transaction to another tenant (the dispatcher
// runs events of several tenants in one pass).
func Switch(ctx context.Context, conn Conn, tenant string) error {
	b := &pgx.Batch{}
	QueueScope(b, tenant)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return &ScopeError{Tenant: tenant, Switch: true, Err: err}
	}
	return nil
}
