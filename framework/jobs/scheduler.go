package jobs

import (
	"context"
	"errors"
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

// ValidateCronSpec reports whether [Cron] accepts spec: it returns the
// problem Cron would report at registration (a bad field, an @every shorter
// than one second, an unknown CRON_TZ= zone, a date no month has), or nil. It lets a
// configuration check a spec read from the environment at boot, before any
// feature registers.
func ValidateCronSpec(spec string) error {
	_, _, err := parseSchedule(spec, time.UTC)
	return err
}

// parseSchedule parses a cron job's spec (see [Cron]) in loc, or in the
// zone of its CRON_TZ= (or TZ=) prefix, and returns the zone it ticks in.
func parseSchedule(spec string, loc *time.Location) (schedule, *time.Location, error) {
	loc, spec, err := cutZone(strings.TrimSpace(spec), loc)
	if err != nil {
		return nil, nil, err
	}
	if rest, ok := strings.CutPrefix(spec, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, nil, fmt.Errorf("bad @every duration: %w", err)
		}
		if d < time.Second {
			return nil, nil, fmt.Errorf("@every %s is shorter than one second", d)
		}
		return everySchedule{d: d}, loc, nil
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, nil, err
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, nil, fmt.Errorf("unsupported schedule %T", s)
	}
	ss.Location = loc
	var sched schedule = ss
	if fixedTime(spec) {
		onWall := *ss
		onWall.Location = time.UTC
		sched = wallSchedule{spec: &onWall, loc: loc}
	}
	// A spec of a date no month has (February 30, April 31) is valid
	// syntax that never ticks: the job would never run.
	if sched.Next(time.Now()).IsZero() {
		return nil, nil, errors.New("never fires: no such date")
	}
	return sched, loc, nil
}

// cutZone splits a "CRON_TZ=<zone> " (or "TZ=<zone> ") prefix off spec and
// returns the zone it names; without one it returns loc and spec as they
// are.
func cutZone(spec string, loc *time.Location) (*time.Location, string, error) {
	var rest string
	var ok bool
	if rest, ok = strings.CutPrefix(spec, "CRON_TZ="); !ok {
		if rest, ok = strings.CutPrefix(spec, "TZ="); !ok {
			return loc, spec, nil
		}
	}
	name, spec, _ := strings.Cut(rest, " ")
	zone, err := time.LoadLocation(name)
	if err != nil {
		return nil, "", fmt.Errorf("bad time zone %q: %w", name, err)
	}
	return zone, strings.TrimSpace(spec), nil
}

// fixedTime reports whether a cron spec runs at particular times of day:
// neither its minute nor its hour field is a wildcard ('*', "*/n", '?'),
// or it is a descriptor of a day or longer (@daily, @midnight, @weekly,
// @monthly, @yearly, @annually; @hourly is "0 * * * *", a wildcard).
// These are the specs Vixie cron shields from daylight saving time
// changes (see [wallSchedule]).
func fixedTime(spec string) bool {
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "CRON_TZ=") || strings.HasPrefix(spec, "TZ=") {
		_, spec, _ = strings.Cut(spec, " ")
		spec = strings.TrimSpace(spec)
	}
	switch spec {
	case "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually":
		return true
	}
	f := strings.Fields(spec)
	wild := func(field string) bool { return strings.HasPrefix(field, "*") || strings.HasPrefix(field, "?") }
	return len(f) == 5 && !wild(f[0]) && !wild(f[1])
}

// wallSchedule is a fixed-time cron spec in a zone that may change its
// offset, ticking by the zone's wall clock as Vixie cron does (cron(8)): a
// time a spring-forward gap skips ticks at the first instant after the
// gap, and a time a fall-back repeats ticks once, at its first occurrence.
// So a daily "30 2 * * *" in Europe/Berlin ticks once on both days, and
// every other tick is the instant robfig/cron computes. Ticks are instants,
// so the times a gap skips and a time at its end make one tick (where Vixie
// cron would run "0,30 2 * * *" twice at 03:00, this runs once). Ticks stay
// a function of the spec and the zone alone, so every process computes the
// same ones, and the same task ids.
type wallSchedule struct {
	spec *cron.SpecSchedule // the spec in UTC, which has no gaps: wall-clock arithmetic
	loc  *time.Location
}

// Next returns the first tick after t, in t's location (the zero time when
// the spec never fires again).
func (s wallSchedule) Next(t time.Time) time.Time {
	// The ticks are firstAt(w) for every wall-clock time w the spec
	// matches. firstAt never decreases as w grows, and it is at or before
	// t for every w at or before t's own wall clock, so the next tick is
	// the first match after t's wall clock whose firstAt is after t; only
	// the matches in a repeated hour that t already passed are skipped.
	w := wallClock(t, s.loc)
	for {
		if w = s.spec.Next(w); w.IsZero() {
			return w
		}
		if at := firstAt(w, s.loc); at.After(t) {
			return at.In(t.Location())
		}
	}
}

// wallClock returns the wall-clock time of t in loc as a UTC time.
func wallClock(t time.Time, loc *time.Location) time.Time {
	t = t.In(loc)
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// firstAt returns the first instant whose wall clock in loc reaches w (a
// wall-clock time as a UTC time): the earlier of the two when a fall-back
// repeats w, the end of the gap when a spring-forward skips it.
func firstAt(w time.Time, loc *time.Location) time.Time {
	// time.Date leaves unspecified which instant it picks for a repeated
	// or skipped wall clock, so both cases are checked.
	u := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), loc)
	start, end := u.ZoneBounds()
	switch wall := wallClock(u, loc); {
	case wall.Equal(w):
		// A repeated w reads the same under the offset of the zone
		// period before u's.
		if !start.IsZero() {
			_, off := start.Add(-time.Second).Zone()
			if e := w.Add(-time.Duration(off) * time.Second); e.Before(start) && wallClock(e, loc).Equal(w) {
				return e.In(loc)
			}
		}
		return u
	case wall.After(w):
		// w is in a gap, and u after it: the gap ends where u's zone
		// period starts.
		return start
	default:
		// w is in a gap, and u before it: the gap ends where u's zone
		// period ends.
		return end
	}
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
	w := &wire{Tenant: framework.SystemTenantID, Tick: tick.Unix(), TickNanos: int64(tick.Nanosecond())}
	hdr := map[string]string{headerCorrelation: id}
	giveUp := j.sched.Next(tick)
	delay := 100 * time.Millisecond
	for {
		dup, err := r.client.enqueue(ctx, j, w, id, hdr, true)
		if err == nil {
			msg := "cron tick enqueued"
			if dup != takenNone {
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
