package dispatcher

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/internal/retry"
)

// notifyLoop sends one NOTIFY per burst of Wake calls, at most every
// NotifyInterval, on a pool connection outside any write transaction (a
// NOTIFY inside write transactions serialises their commits). The payload
// is the instance id, so the sender's own listener ignores it.
func (d *Dispatcher) notifyLoop(ctx context.Context) {
	if d.cfg.PollOnly {
		// Nobody listens; other processes find the events by polling.
		<-ctx.Done()
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.notifyReq:
		}
		nctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := d.pool.Exec(nctx, `SELECT pg_notify($1, $2)`, NotifyChannel, d.cfg.InstanceID); err != nil && ctx.Err() == nil {
			d.log.Warn("dispatcher notify failed", "error", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.cfg.NotifyInterval):
		}
	}
}

// listenLoop keeps a dedicated LISTEN connection and wakes the consumers on
// every other process's NOTIFY. It reconnects with backoff and wakes the
// consumers after each reconnect, since notifications may have been missed.
// The backoff starts over after a connection that listened, so a process
// that loses its connection now and then reconnects after 100 ms each time.
func (d *Dispatcher) listenLoop(ctx context.Context) {
	backoff := retry.First
	for ctx.Err() == nil {
		listened, err := d.listenOnce(ctx)
		d.metrics.listen.Set(0)
		if ctx.Err() != nil {
			return
		}
		if listened {
			backoff = retry.First
		}
		d.log.Warn("dispatcher listen connection lost", "error", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, retry.Max)
	}
}

// listenOnce runs one LISTEN connection until it fails or ctx ends;
// listened reports whether it got as far as listening.
func (d *Dispatcher) listenOnce(ctx context.Context) (listened bool, err error) {
	cfg := d.pool.Config().ConnConfig.Copy()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+NotifyChannel); err != nil {
		return false, err
	}
	d.metrics.listen.Set(1)
	d.wakeLocal()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		if n.Payload != d.cfg.InstanceID {
			d.wakeLocal()
		}
	}
}
