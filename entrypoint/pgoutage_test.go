package entrypoint_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/internal/pgcluster"
)

// outageBound is how long a write or a readiness probe may take while the
// database is away or coming back, and how soon after it answers again
// writes and readiness must recover. The process's own bounds are shorter
// (DATABASE_POOL_CONNECT_TIMEOUT 1 s, the readiness budget 1.5 s); the
// rest is margin for a loaded machine.
const outageBound = 5 * time.Second

// privatePG is a private Postgres server with a migrated database, which
// a test takes away (a restart or a crash) and brings back on the same
// port, where the processes' pools expect it.
type privatePG struct {
	cluster *pgcluster.Dir
	dataDir string
	srv     *pgcluster.Server
	// settings are the server's "name=value" settings, at every start.
	settings []string
	// url is the migrated database's URL; it stays the same over outages.
	url string
}

// startPrivatePG starts a private Postgres server (with the "name=value"
// settings, at this and every later start) and migrates its postgres
// database.
func startPrivatePG(t *testing.T, settings ...string) *privatePG {
	t.Helper()
	ctx := context.Background()
	cluster := pgcluster.New(t)
	dataDir := cluster.InitDB("data")
	srv := cluster.Start(dataDir, settings...)
	pg := &privatePG{cluster: cluster, dataDir: dataDir, srv: srv, settings: settings, url: srv.URL("postgres")}
	pool, err := pgxpool.New(ctx, pg.url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = migrate.Up(ctx, pool, nil, nil)
	require.NoError(t, err)
	return pg
}

// outage is one time the database was away: from the moment it was told
// to go (stopping) and the moment it no longer answered (down) to the
// moment it accepted connections again (up).
type outage struct {
	name       string
	stopping   time.Time
	down, up   time.Time
	recoveredW time.Time // the end of the first 200 write started after up
	recoveredR time.Time // the end of the first 200 probe started after up
}

// takeAway shuts the server down (fast shutdown, or immediate shutdown
// when crash is set), runs away while it is gone, and starts it again on
// the same port. A crash's start must run crash recovery. It returns the
// outage's times; up is taken just before the start, so a client that
// succeeds after it talked to the new server.
func (pg *privatePG) takeAway(t *testing.T, name string, crash bool, away func()) *outage {
	t.Helper()
	o := &outage{name: name, stopping: time.Now()}
	if crash {
		pg.srv.Crash()
	} else {
		pg.srv.Stop()
	}
	o.down = time.Now()
	away()
	o.up = time.Now()
	pg.srv = pg.cluster.StartOn(pg.dataDir, pg.srv.Port, pg.settings...)
	if crash {
		log, err := os.ReadFile(pg.srv.Log)
		require.NoError(t, err)
		require.Contains(t, string(log), "automatic recovery in progress", "%s: the crash made the start run crash recovery", name)
	}
	return o
}

// outages are the times a test took the database away.
type outages []*outage

// during returns the outage a request from start to end fell entirely
// into (the database was away all along), or nil.
func (os outages) during(start, end time.Time) *outage {
	for _, o := range os {
		if start.After(o.down) && end.Before(o.up) {
			return o
		}
	}
	return nil
}

// inFlight returns the outage whose server went away (from being told to
// go until it was gone) while a request from start to end was under way,
// or nil: such a request may have sent its COMMIT on a connection that
// then ended. On a loaded machine a request that began after the server
// was told to go can still get that far before its backend ends.
func (os outages) inFlight(start, end time.Time) *outage {
	for _, o := range os {
		if start.Before(o.down) && end.After(o.stopping) {
			return o
		}
	}
	return nil
}

// probeAnswer is what one GET /health/ready got.
type probeAnswer struct {
	start, end time.Time
	code       int
	body       []byte
	err        error
}

// readyProber asks a process's /health/ready every 50 ms and keeps the
// answers.
type readyProber struct {
	stopCh chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	all    []probeAnswer
}

// probeReady starts probing base+"/health/ready" until stop.
func probeReady(base string) *readyProber {
	pr := &readyProber{stopCh: make(chan struct{})}
	pr.wg.Go(func() {
		for {
			select {
			case <-pr.stopCh:
				return
			default:
			}
			a := probeAnswer{start: time.Now()}
			ctx, cancel := context.WithTimeout(context.Background(), 2*outageBound)
			a.code, a.body, a.err = get(ctx, base+"/health/ready")
			cancel()
			a.end = time.Now()
			pr.mu.Lock()
			pr.all = append(pr.all, a)
			pr.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	})
	return pr
}

// stop ends the probing and waits for the probe under way; stopping twice
// does nothing.
func (pr *readyProber) stop() {
	pr.once.Do(func() { close(pr.stopCh) })
	pr.wg.Wait()
}

// answers returns the answers so far.
func (pr *readyProber) answers() []probeAnswer {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]probeAnswer(nil), pr.all...)
}

// readyAfter returns the end of the first 200 answer to a probe started
// after since, or zero when there is none yet.
func (pr *readyProber) readyAfter(since time.Time) time.Time {
	var first time.Time
	for _, a := range pr.answers() {
		if a.code == http.StatusOK && a.start.After(since) && (first.IsZero() || a.end.Before(first)) {
			first = a.end
		}
	}
	return first
}

// requireNotReadyWhileAway checks a process's readiness answers: each came
// in time, and every probe made while the database was away said 503 with
// the database check failing, at least one per outage.
func requireNotReadyWhileAway(t *testing.T, what string, probes []probeAnswer, os outages) {
	t.Helper()
	notReady := map[string]int{}
	for _, a := range probes {
		require.NoError(t, a.err, "%s: probe at %s", what, a.start.Format(time.StampMilli))
		took := a.end.Sub(a.start)
		require.Less(t, took, 2500*time.Millisecond, "%s: a readiness probe took %s: %s", what, took, a.body)
		if o := os.during(a.start, a.end); o != nil {
			require.Equal(t, http.StatusServiceUnavailable, a.code, "%s: %s: ready while the database was away: %s", what, o.name, a.body)
			require.Contains(t, string(a.body), `{"name":"database","ok":false`, "%s: %s", what, a.body)
			notReady[o.name]++
		}
	}
	for _, o := range os {
		require.Positive(t, notReady[o.name], "%s: %s: readiness was not probed while the database was away", what, o.name)
	}
}

// writeLoad is a trickle of writes from several clients, each placing
// one order every 20 ms until halted, and the answers they got.
type writeLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	// writes are the answers so far; read it directly only after halt.
	writes []writeAnswer
}

// startWriteLoad starts clients goroutines calling place(c, i) for client
// c's i-th write; i advances when place says so (a keyed client retries
// its write under the same key instead).
func startWriteLoad(clients int, place func(c, i int) (writeAnswer, bool)) *writeLoad {
	l := &writeLoad{stop: make(chan struct{})}
	for c := range clients {
		l.wg.Go(func() {
			for i := 0; ; {
				select {
				case <-l.stop:
					return
				default:
				}
				a, next := place(c, i)
				l.mu.Lock()
				l.writes = append(l.writes, a)
				l.mu.Unlock()
				if next {
					i++
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return l
}

// halt stops the clients and waits for them.
func (l *writeLoad) halt() { close(l.stop); l.wg.Wait() }

// answers returns a copy of the answers so far.
func (l *writeLoad) answers() []writeAnswer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// oks counts the writes answered 200 that began after after.
func (l *writeLoad) oks(after time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.writes {
		if a.code == http.StatusOK && a.start.After(after) {
			n++
		}
	}
	return n
}
