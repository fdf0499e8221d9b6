package dispatcher_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// A pass that fails because the database is out of reach (here every new
// connection is refused and the open ones were ended, as in a restart) is
// a warning, like the dispatcher's other outage logs: the loop rides it
// out and goes on when the database is back. An operator watching for
// ERROR lines sees none for an outage, and the events are delivered
// afterwards.
func TestPassFailingOnAnOutageIsAWarning(t *testing.T) {
	t.Parallel()
	testOutageIsAWarning(t, func(cc *pgx.ConnConfig) {
		cc.Port = 1 // nothing listens there: connection refused
	})
}

// A database host that does not answer at all (powered off, a network
// partition: the connect is not refused, it times out) is an outage too:
// the passes' failed connects warn like refused ones instead of logging
// an ERROR every second until the host is back.
func TestPassFailingOnAConnectTimeoutIsAWarning(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		silent.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	port := uint16(silent.Addr().(*net.TCPAddr).Port)
	testOutageIsAWarning(t, func(cc *pgx.ConnConfig) {
		cc.Host, cc.Port, cc.ConnectTimeout = "127.0.0.1", port, 200*time.Millisecond
	})
}

// testOutageIsAWarning runs a dispatcher whose pool connects through down
// once the outage has begun, ends its connections, waits for a failed
// pass, ends the outage, and requires the events delivered and no ERROR
// logged.
func testOutageIsAWarning(t *testing.T, down func(cc *pgx.ConnConfig)) {
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "outage-dispatcher"
	var isDown atomic.Bool
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		if isDown.Load() {
			down(cc)
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	var logs proctest.Buffer
	d, err := dispatcher.New(pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{
		InstanceID: "outage", PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	b.write(t, "t1", 0, 1, 1)
	waitCount(t, b, `SELECT count(*) FROM seen`, 1, 20*time.Second)

	isDown.Store(true)
	_, err = b.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'outage-dispatcher'`)
	require.NoError(t, err)
	// The first failed pass may be the one on a connection the server
	// ended; the later ones fail to connect.
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(logs.String(), "dispatcher pass failed") < 3 {
		require.True(t, time.Now().Before(deadline), "too few passes failed during the outage:\n%s", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
	isDown.Store(false)
	b.write(t, "t1", 1, 1, 1)
	waitCount(t, b, `SELECT count(*) FROM seen`, 2, 20*time.Second)

	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "dispatcher pass failed") {
			require.Contains(t, line, "level=WARN", "an outage's pass failure: %s", line)
		}
		require.NotContains(t, line, "level=ERROR", "an outage logged an error")
	}
}
