package framework_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// commandCompleteCommit is the server's CommandComplete message of a
// COMMIT that committed.
var commandCompleteCommit = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

// afterCommitCutter loses, when armed, the connection right after the
// server's answer to a COMMIT arrived: the client reads that the write
// committed, and then nothing more (not the ReadyForQuery that ends the
// batch), as when the server is shut down or the network fails there.
// With before set, the client does not read that answer either.
type afterCommitCutter struct {
	armed  atomic.Bool
	before bool
	cuts   atomic.Int32
}

func (ac *afterCommitCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &afterCommitConn{Conn: c, ac: ac}, nil
}

// afterCommitConn is a connection of an afterCommitCutter.
type afterCommitConn struct {
	net.Conn
	ac   *afterCommitCutter
	tail []byte // the last bytes read, for a message split across reads
	cut  bool
}

func (c *afterCommitConn) Read(p []byte) (int, error) {
	if c.cut {
		return 0, io.ErrUnexpectedEOF
	}
	n, err := c.Conn.Read(p)
	if n == 0 || !c.ac.armed.Load() {
		return n, err
	}
	seen := append(c.tail, p[:n]...)
	if i := bytes.Index(seen, commandCompleteCommit); i >= 0 && c.ac.armed.CompareAndSwap(true, false) {
		end := i + len(commandCompleteCommit) - len(c.tail)
		if c.ac.before {
			end = max(0, i-len(c.tail))
		}
		c.cut = true
		c.ac.cuts.Add(1)
		_ = c.Conn.Close()
		return end, nil
	}
	c.tail = append(c.tail[:0], seen[max(0, len(seen)-len(commandCompleteCommit)):]...)
	return n, err
}

// A write without a consistency token (Runtime.Write, a job's InTx) whose
// connection is lost after the COMMIT's answer arrived, before the batch
// ended, committed: it succeeds, it does not panic.
func TestWriteThatLostItsConnectionAfterTheCommitAnswer(t *testing.T) {
	t.Parallel()
	ac := &afterCommitCutter{}
	db, rt := cutRuntime(t, ac)

	ac.armed.Store(true)
	var werr error
	require.NotPanics(t, func() {
		_, werr = rt.Write(t.Context(), callAs("t1", "u-t1"), []framework.Command{
			command(t, "orders:write:place", orders.PlaceInput{Customer: "ada", AmountCents: 100})})
	})
	require.Equal(t, int32(1), ac.cuts.Load(), "the connection was cut after the COMMIT's answer")
	require.NoError(t, werr, "the write committed")
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders WHERE customer = 'ada'`).Scan(&n))
	require.Equal(t, 1, n)
}

// A query is a read-only transaction: when its connection is lost while
// its COMMIT is under way, nothing it did needed committing, so it is 503
// unavailable (retry) like a query whose connection was lost before, not
// the 500 of a write whose outcome is unknown.
func TestQueryThatLostItsConnectionWhileCommittingIsUnavailable(t *testing.T) {
	t.Parallel()
	ac := &afterCommitCutter{before: true}
	_, rt := cutRuntime(t, ac)

	ac.armed.Store(true)
	_, err := rt.Query(t.Context(), callAs("t1", "u-t1"), command(t, "orders:query:totals", orders.TotalsInput{}))
	require.Equal(t, int32(1), ac.cuts.Load(), "the connection was cut before the COMMIT's answer")
	require.Error(t, err)
	require.NotErrorIs(t, err, framework.ErrCommitOutcomeUnknown)
	require.Equal(t, framework.CodeUnavailable, framework.ToError(err).Code, "%v", err)
}

// cutRuntime returns a fresh database and a runtime with the orders
// feature whose pool dials through ac.
func cutRuntime(t *testing.T, ac *afterCommitCutter) (*kumikotest.DB, *framework.Runtime) {
	t.Helper()
	db := kumikotest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = ac.dial
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := framework.NewRegistry()
	orders.Register(reg)
	rt, err := framework.NewRuntime(reg, pool, nil)
	require.NoError(t, err)
	return db, rt
}
