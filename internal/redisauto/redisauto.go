// Package redisauto sends the commands of concurrent callers to Redis in
// shared pipelines, and bounds each caller's wait by its context.
package redisauto

import (
	"context"
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	"encoding/hex"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Client sends commands through go-redis's autopipeliner when the client
// has one (*redis.Client, *redis.ClusterClient, *redis.Ring): each call
// still waits for its own answer, but commands issued meanwhile by other
// goroutines travel in the same pipeline, so that under load a request
// costs a share of a round trip instead of one (both in this process and
// in Redis). Unlike go-redis's own command surface on the autopipeliner,
// every wait ends when the caller's context does: the autopipeliner does
// not look at a command's context once it is queued, and retries a command
// that timed out, so a Redis that stops answering would otherwise hold a
// caller for (1 + MaxRetries) read timeouts. The autopipeliner is closed
// with its client.
type Client struct {
	ap  *redis.AutoPipeliner // nil: commands go to rdb directly
	rdb redis.UniversalClient
}

// New returns a Client on rdb.
func New(rdb redis.UniversalClient) *Client {
	c := &Client{rdb: rdb}
	if a, ok := rdb.(interface {
		AsyncAutoPipelineWithOptions(*redis.AutoPipelineOptions) (*redis.AutoPipeliner, error)
	}); ok {
		// The options of the blocking face (AutoPipeline), whose commands
		// these are; the deferred face is the one that lets a caller stop
		// waiting.
		if ap, err := a.AsyncAutoPipelineWithOptions(redis.DefaultBlockingAutoPipelineOptions()); err == nil {
			c.ap = ap
		}
	}
	return c
}

// Future is a command on its way: [Future.Wait] waits for its answer.
type Future struct {
	cmd  redis.Cmder
	f    redis.AutoFuture
	done chan struct{} // without an autopipeliner: closed when cmd ran
}

// Send queues cmd and returns at once. A ctx that has ended already sends
// nothing: cmd fails with ctx's error (otherwise the command could still
// run and Wait answer either way).
func (c *Client) Send(ctx context.Context, cmd redis.Cmder) Future {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		done := make(chan struct{})
		close(done)
		return Future{cmd: cmd, done: done}
	}
	if c.ap != nil {
		return Future{cmd: cmd, f: c.ap.Submit(ctx, cmd)}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.rdb.Process(context.WithoutCancel(ctx), cmd)
	}()
	return Future{cmd: cmd, done: done}
}

// Wait waits until the command ran, and returns its error, or until ctx
// ends, and returns ctx's error: the command may then still run, and its
// result must not be read until a later Wait returned another error.
func (f Future) Wait(ctx context.Context) error {
	if f.done == nil {
		return f.f.WaitContext(ctx)
	}
	select {
	case <-f.done:
		return f.cmd.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answered reports whether the command ran, so that Wait returns at once.
func (f Future) answered() bool {
	if f.done != nil {
		select {
		case <-f.done:
			return true
		default:
			return false
		}
	}
	// WaitContext looks at the command before the context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return !errors.Is(f.f.WaitContext(ctx), context.Canceled)
}

// Do sends cmd and waits for its answer at most until ctx ends.
func (c *Client) Do(ctx context.Context, cmd redis.Cmder) error {
	return c.Send(ctx, cmd).Wait(ctx)
}

// Script is a Lua script, sent by its SHA-1 (EVALSHA) and loaded on the
// first NOSCRIPT answer.
type Script struct {
	src  string
	hash string
}

// NewScript returns the script with source src.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src)) //nolint:gosec // Redis names scripts by their SHA-1
	return &Script{src: src, hash: hex.EncodeToString(sum[:])}
}

// evalCmd builds the EVALSHA or EVAL command of s, as go-redis does.
func (s *Script) evalCmd(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, payload, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// Run runs s with keys and args and waits for its answer at most until ctx
// ends (then the returned command's error is ctx's). Slices among args are
// sent as they are ([]byte as one bulk string), not spread.
func (c *Client) Run(ctx context.Context, s *Script, keys []string, args ...any) *redis.Cmd {
	return c.RunThen(ctx, s, keys, nil, args...)
}

// RunThen is [Client.Run] for a script whose effect must be undone when
// the caller stops waiting: when ctx ends first, late (when not nil) gets
// the command once it ran, in a goroutine of its own, with its answer or
// error (a NOSCRIPT error: it did not run).
func (c *Client) RunThen(ctx context.Context, s *Script, keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	return c.Start(ctx, s, keys, args...).WaitThen(ctx, late)
}

// Running is a script call on its way ([Client.Start]).
type Running struct {
	c    *Client
	s    *Script
	keys []string
	args []any
	cmd  *redis.Cmd
	f    Future
}

// Start sends s with keys and args (by its SHA-1) and returns at once, so
// that commands the caller sends next share its pipeline; [Running.Wait]
// waits for the answer.
func (c *Client) Start(ctx context.Context, s *Script, keys []string, args ...any) *Running {
	cmd := s.evalCmd(ctx, "evalsha", s.hash, keys, args)
	return &Running{c: c, s: s, keys: keys, args: args, cmd: cmd, f: c.Send(ctx, cmd)}
}

// Answered reports whether [Running.Wait] would return at once: the
// answer is in, and it is not NOSCRIPT (on which Wait sends the script
// itself and waits again).
func (r *Running) Answered() bool {
	return r.f.answered() && !redis.HasErrorPrefix(r.cmd.Err(), "NOSCRIPT")
}

// Wait is [Running.WaitThen] without late.
func (r *Running) Wait(ctx context.Context) *redis.Cmd { return r.WaitThen(ctx, nil) }

// WaitThen waits for the script's answer at most until ctx ends (then the
// returned command's error is ctx's), loading the script on a NOSCRIPT
// answer. When ctx ends first, late (when not nil) gets the command once
// it ran, in a goroutine of its own, with its answer or error (a NOSCRIPT
// error: it did not run). Call it once.
func (r *Running) WaitThen(ctx context.Context, late func(*redis.Cmd)) *redis.Cmd {
	cmd, f := r.cmd, r.f
	err := f.Wait(ctx)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Not loaded yet (or Redis restarted): EVAL loads it.
		cmd = r.s.evalCmd(ctx, "eval", r.s.src, r.keys, r.args)
		f = r.c.Send(ctx, cmd)
		err = f.Wait(ctx)
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		if late != nil {
			go func() {
				_ = f.Wait(context.WithoutCancel(ctx))
				late(cmd)
			}()
		}
		// cmd may still be written to: answer with a command of our own.
		out := redis.NewCmd(ctx)
		out.SetErr(err)
		return out
	}
	return cmd
}
