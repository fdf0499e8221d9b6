package web_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

// commitCutter loses the database connection of the next transaction
// whose COMMIT it sees go out, after the server answered it: the write
// commits, and the process never learns it did.
type commitCutter struct {
	armed atomic.Bool
	// cuts counts the connections cut.
	cuts atomic.Int32
}

func (cc *commitCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, cc: cc}, nil
}

// cutConn is a connection of a commitCutter.
type cutConn struct {
	net.Conn
	cc  *commitCutter
	cut atomic.Bool
	// head is the type and length of the server message being skipped,
	// left how many of its body bytes remain.
	head []byte
	left int
	// body is the body of a CommandComplete being read; committed is set
	// once the COMMIT's was, failed once an error was.
	body              []byte
	committed, failed bool
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.cc.armed.Load() && bindsCommit(p) && c.cc.armed.CompareAndSwap(true, false) {
		c.cut.Store(true)
	}
	return c.Conn.Write(p)
}

// commitStatement is the name pgx's statement cache gives COMMIT.
var commitStatement = func() []byte {
	sum := sha256.Sum256([]byte("COMMIT"))
	return []byte("stmtcache_" + hex.EncodeToString(sum[:24]) + "\x00")
}()

// bindsCommit reports whether p holds a Bind message (type 'B', length,
// the empty portal name) of the prepared COMMIT: the batch that runs it.
func bindsCommit(p []byte) bool {
	for off := 0; ; {
		i := bytes.Index(p[off:], commitStatement)
		if i < 0 {
			return false
		}
		at := off + i
		if at >= 6 && p[at-6] == 'B' && p[at-1] == 0 {
			return true
		}
		off = at + 1
	}
}

// Read passes the server's answers through until the cut; from then on it
// reads and drops them up to the ReadyForQuery that ends the batch (so the
// COMMIT has run) and fails as a lost connection does.
func (c *cutConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.cut.Load() {
		return n, err
	}
	buf := append([]byte(nil), p[:n]...)
	for {
		if c.skip(buf) {
			c.cc.cuts.Add(1)
			_ = c.Conn.Close()
			return 0, io.ErrUnexpectedEOF
		}
		if err != nil {
			return 0, err
		}
		var more [4096]byte
		var m int
		m, err = c.Conn.Read(more[:])
		buf = more[:m]
	}
}

// skip consumes b as server messages and reports whether the
// ReadyForQuery ('Z') after the COMMIT's CommandComplete was complete in
// it: the COMMIT ran and committed.
func (c *cutConn) skip(b []byte) bool {
	for len(b) > 0 {
		if len(c.head) < 5 { // the type byte and the length
			k := min(5-len(c.head), len(b))
			c.head, b = append(c.head, b[:k]...), b[k:]
			if len(c.head) < 5 {
				return false
			}
			c.left = int(binary.BigEndian.Uint32(c.head[1:])) - 4
			c.body = c.body[:0]
		}
		k := min(c.left, len(b))
		if c.head[0] == 'C' {
			c.body = append(c.body, b[:k]...)
		}
		c.left, b = c.left-k, b[k:]
		if c.left == 0 {
			switch c.head[0] {
			case 'C':
				if string(c.body) == "COMMIT\x00" {
					c.committed = true
				}
			case 'E':
				c.failed = true // the test's checks say what went wrong
			case 'Z':
				if c.committed || c.failed {
					return true
				}
			}
			c.head = c.head[:0]
		}
	}
	return false
}

// A write whose database connection is lost after its COMMIT went out may
// have committed: here it did. Unkeyed, the client is told that the
// outcome is unknown (not a bare "internal error"). Keyed, that answer is
// not stored (a retry would replay it forever, never learning that the
// write committed) and the key is not freed (a retry would run the write
// again): the claim runs out, and the retry finds the committed events and
// answers 409 conflict listing them, which is then what the key replays.
func TestWriteThatLostItsConnectionWhileCommitting(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	cc := &commitCutter{}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = cc.dial
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const lease = 600 * time.Millisecond
	b := setupIdem(t, idemOptions{db: &kumikotest.DB{Name: db.Name, URL: db.URL, Pool: pool}, lease: lease})
	tok := b.tokenFor(t, "acme", "alice")
	placed := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM events WHERE type = 'orders:event:placed'`).Scan(&n))
		return n
	}

	// Unkeyed: the write committed; the client hears that it may have.
	cc.armed.Store(true)
	r := b.keyed(t, "/api/write", tok, "", place("Ada"))
	env := r.requireError(t, http.StatusInternalServerError, "internal")
	require.Contains(t, env.Error.Message, "whether it committed is unknown", "%s", r.body)
	require.Equal(t, int32(1), cc.cuts.Load(), "the connection was cut after the COMMIT")
	require.Equal(t, 1, placed(), "the write committed")

	// Keyed: the same, and the key is neither replayed nor freed.
	key := "cut-" + randHex(8)
	cc.armed.Store(true)
	// The claim is taken after start: its lease ends lease after it at
	// the earliest (on Redis's clock, in whole milliseconds), however long
	// this answer takes on a busy machine.
	start := time.Now()
	r = b.keyed(t, "/api/write", tok, key, place("Bea"))
	env = r.requireError(t, http.StatusInternalServerError, "internal")
	require.Contains(t, env.Error.Message, "retry with the same Idempotency-Key", "%s", r.body)
	require.Equal(t, key, env.Error.Details["idempotencyKey"])
	require.Equal(t, int32(2), cc.cuts.Load())
	require.Equal(t, 1, b.eventsWithKey(t, key), "the write committed")

	retry := b.keyed(t, "/api/write", tok, key, place("Bea"))
	env = retry.requireError(t, http.StatusConflict, "conflict")
	require.Equal(t, true, env.Error.Details["committed"], "%s", retry.body)
	require.Len(t, env.Error.Details["events"], 1, "%s", retry.body)
	require.Empty(t, retry.header.Get(web.HeaderIdempotentReplayed), "the 500 was not stored")
	require.Greater(t, time.Since(start), lease-10*time.Millisecond, "the retry waited for the claim to run out")
	require.Equal(t, 1, b.eventsWithKey(t, key), "the retry did not run the write again")
	requireReplayOf(t, retry, b.keyed(t, "/api/write", tok, key, place("Bea")))
	require.Equal(t, 2, placed())

	// Batches say the same, without naming a command: none of them failed.
	cc.armed.Store(true)
	r = b.keyed(t, "/api/batch", tok, "", map[string]any{"commands": []any{place("Cy"), place("Di")}})
	env = r.requireError(t, http.StatusInternalServerError, "internal")
	require.Contains(t, env.Error.Message, "whether it committed is unknown", "%s", r.body)
	require.NotContains(t, env.Error.Details, "index", "%s", r.body)
	require.Equal(t, 4, placed())
	key = "cut-batch-" + randHex(8)
	cc.armed.Store(true)
	r = b.keyed(t, "/api/batch", tok, key, map[string]any{"commands": []any{place("Ed")}})
	env = r.requireError(t, http.StatusInternalServerError, "internal")
	require.Contains(t, env.Error.Message, "retry with the same Idempotency-Key", "%s", r.body)
	require.Equal(t, int32(4), cc.cuts.Load())
	require.Equal(t, 5, placed())
}
