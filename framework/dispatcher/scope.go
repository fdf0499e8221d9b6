package dispatcher

import (
	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// scopes tracks the tenant scope of a pass transaction. A handler gets a
// connection that re-scopes the transaction to its event's tenant with
// the first statement it sends, in one pipeline with that statement
// (tenancy.SwitchLazily): events whose handler sends nothing (no handler
// for the type, in-memory consumers such as SSE) cost no scoping, and
// those that do cost no extra round trip. No statement runs before its
// scope is in effect.
type scopes struct {
	conn *pgx.Conn
	// applied is the scope in effect ("" when unknown after a failed
	// switch: the next handler's statement switches again).
	applied string
	// want is the scope of the latest db call.
	want string
	// pending is the lazy switch handed out by the latest db call.
	pending *tenancy.Lazy
	// direct makes framework.Tx.Queue run statements at once (the re-run
	// of a pass whose deferred statements failed).
	direct bool
	// queue holds statements deferred by framework.Tx.Queue.
	queue []queuedStmt
	// queueErr is the failure of a flush of the queue.
	queueErr error
	// current is the connection handed out for the applied scope, and
	// unused the latest switch whose handler sent nothing: the next events
	// of those tenants get them again, so a pass does not allocate a
	// connection per event.
	current, unused *passDB
}

// db returns the connection for statements in tenant's scope.
func (s *scopes) db(tenant string) framework.DB {
	s.want = tenant
	s.pending = nil
	if tenant == s.applied {
		if s.current == nil || s.current.tenant != tenant {
			s.current = &passDB{s: s, tenant: tenant, inner: s.conn}
		}
		return s.current
	}
	if s.unused == nil || s.unused.tenant != tenant {
		l := tenancy.SwitchLazily(s.conn, tenant)
		s.unused = &passDB{s: s, tenant: tenant, inner: l, lazy: l}
	}
	s.pending = s.unused.lazy
	return s.unused
}

// settle records the effect of the latest lazy switch once its handler is
// done.
func (s *scopes) settle() {
	switch l := s.pending; {
	case l == nil:
	case l.Err() != nil:
		s.applied = "" // unknown; the pass fails or switches again
		s.unused = nil
	case l.Begun():
		s.applied = s.want
		s.unused = nil // a Lazy switches once
	}
	s.pending = nil
}
