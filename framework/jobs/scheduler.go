package jobs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/kumiko-go/kumiko/framework"
)

// schedule yields the tick after a time.
type schedule interface {
	Next(t time.Time) time.Time
}

// everySchedule ticks at the multiples of d since the Unix epoch, so that
// every process computes the same ticks whenever it started.
type everySchedule struct{ d time.Duration }

func (e everySchedule) Next(t time.Time) time.Time {
	n := t.UnixNano()
	d := int64(e.d)
	return time.Unix(0, (n/d+1)*d).In(t.Location())
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSchedule parses a cron job's spec (see [Cron]) in loc.
func parseSchedule(spec string, loc *time.Location) (schedule, error) {
	spec = strings.TrimSpace(spec)
	if rest, ok := strings.CutPrefix(spec, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("bad @every duration: %w", err)
		}
		if d < time.Second {
			return nil, fmt.Errorf("@every %s is shorter than one second", d)
		}
		return everySchedule{d: d}, nil
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, err
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("unsupported schedule %T", s)
	}
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		ss.Location = loc
	}
	return ss, nil
}

// runCron enqueues j at every tick until ctx ends.
func (r *Runner) runCron(ctx context.Context, j *Job) {
	now := time.Now()
	for {
		tick := j.sched.Next(now)
		if tick.IsZero() {
			r.log.Error("cron schedule never fires again", "job", j.name, "spec", j.spec)
			return
		}
		t := time.NewTimer(time.Until(tick))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		r.fireTick(ctx, j, tick)
		now = tick
	}
}

// fireTick enqueues the run of one tick under the tick's task id (so that
// the other workers' enqueues of the same tick are duplicates), retrying
// while Redis fails until the following tick is due.
func (r *Runner) fireTick(ctx context.Context, j *Job, tick time.Time) {
	id := tickTaskID(j.name, tick)
	w := &wire{Tenant: framework.SystemTenantID, Tick: tick.Unix()}
	hdr := map[string]string{headerCorrelation: id}
	giveUp := j.sched.Next(tick)
	delay := 100 * time.Millisecond
	for {
		dup, err := r.client.enqueue(ctx, j, w, id, hdr, true)
		if err == nil {
			msg := "cron tick enqueued"
			if dup {
				msg = "cron tick already enqueued"
			}
			r.log.Debug(msg, "job", j.name, "task_id", id, "tick", tick.Unix())
			return
		}
		if time.Now().Add(delay).After(giveUp) {
			r.log.Error("cron tick lost: enqueue kept failing until the next tick", "job", j.name, "task_id", id, "error", err)
			return
		}
		r.log.Warn("cron tick enqueue failed, retrying", "job", j.name, "task_id", id, "error", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, 5*time.Second)
	}
}
