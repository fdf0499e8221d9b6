package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

func TestScheduleTicksAreTheSameInEveryProcess(t *testing.T) {
	t.Parallel()
	s, _, err := parseSchedule("@every 2s", time.UTC)
	require.NoError(t, err)
	// Processes started at different moments compute the same ticks.
	a := s.Next(time.Unix(1000, 300_000_000))
	b := s.Next(time.Unix(1001, 900_000_000))
	require.Equal(t, time.Unix(1002, 0).Unix(), a.Unix())
	require.Equal(t, a.Unix(), b.Unix())
	require.Equal(t, int64(1004), s.Next(a).Unix())

	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	s, _, err = parseSchedule("0 3 * * *", berlin)
	require.NoError(t, err)
	next := s.Next(time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC))
	require.Equal(t, time.Date(2026, 7, 2, 1, 0, 0, 0, time.UTC), next.UTC(), "03:00 in Berlin (CEST) is 01:00 UTC")

	s, _, err = parseSchedule("CRON_TZ=America/New_York 30 8 * * 1", time.UTC)
	require.NoError(t, err)
	next = s.Next(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)) // a Sunday
	require.Equal(t, time.Date(2026, 11, 30, 13, 30, 0, 0, time.UTC), next.UTC())

	s, _, err = parseSchedule("@hourly", time.UTC)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 1, 11, 0, 0, 0, time.UTC), s.Next(time.Date(2026, 1, 1, 10, 59, 59, 0, time.UTC)))

	for _, bad := range []string{"", "* * *", "@every", "@every soon", "@every 500ms", "0 0 30 2 * *", "CRON_TZ=Nowhere/Zone 0 2 * * *", "CRON_TZ=Europe/Berlin"} {
		_, _, err := parseSchedule(bad, time.UTC)
		require.Error(t, err, bad)
	}
}

func TestTaskIDsAreDerivedFromTheTrigger(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders:job:render-invoice@event-42", eventTaskID("orders:job:render-invoice", 42))
	require.Equal(t, "x:job:y@tick-1700000000", tickTaskID("x:job:y", time.Unix(1700000000, 0)))
	require.Equal(t, keyTaskID("x:job:y", "acme", "k"), keyTaskID("x:job:y", "acme", "k"))
	require.NotEqual(t, keyTaskID("x:job:y", "acme", "k"), keyTaskID("x:job:y", "globex", "k"))
	require.NotEqual(t, keyTaskID("x:job:y", "acme", "k"), keyTaskID("x:job:y", "acm", "ek"))
}

// TestManualTaskPayloadIsAlwaysValidJSON: whatever raw payload passes a
// manual job's check, the task built from it is valid JSON carrying the
// tenant; a blank payload is no payload.
func TestManualTaskPayloadIsAlwaysValidJSON(t *testing.T) {
	t.Parallel()
	type input struct {
		Note string `json:"note"`
	}
	f := framework.NewRegistry().Feature("test")
	m := Manual[input](f, "note", nil, func(context.Context, *Context, input) error { return nil })
	for _, raw := range []string{"", " ", " \n", "\t\r\n", "null", " null ", "{}", ` {"note":"x"} `, "\n{}\n"} {
		p, err := m.job.check(json.RawMessage(raw))
		require.NoError(t, err, "%q", raw)
		task, err := newTask(m.job, &wire{Tenant: "acme", Payload: p}, nil)
		require.NoError(t, err, "%q", raw)
		require.True(t, json.Valid(task.Payload()), "%q became the task %q", raw, task.Payload())
		w, err := decodeWire(task.Payload())
		require.NoError(t, err, "%q", raw)
		require.Equal(t, "acme", w.Tenant)
	}
	_, err := m.job.check(json.RawMessage(" {"))
	require.Error(t, err)
}

// ticks returns the ticks of s in [from, to).
func ticks(s schedule, from, to time.Time) []time.Time {
	var out []time.Time
	for t := s.Next(from.Add(-time.Nanosecond)); !t.IsZero() && t.Before(to); t = s.Next(t) {
		out = append(out, t)
	}
	return out
}

// TestFixedTimeCronTicksOncePerDayAcrossDST: a daily job at a fixed time
// of day in Europe/Berlin runs once on the spring-forward day (the skipped
// 02:xx ticks when the clock jumps to 03:00) and once on the fall-back day
// (the first 02:xx, CEST, not again an hour later), as in Vixie cron. Every
// other tick, and so its task id, is the one robfig/cron computes, and a
// scheduler started at any moment computes the same next tick.
func TestFixedTimeCronTicksOncePerDayAcrossDST(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	from, to := time.Date(2025, 1, 1, 0, 0, 0, 0, berlin), time.Date(2026, 1, 1, 0, 0, 0, 0, berlin)
	spring, fall := "2025-03-30", "2025-10-26"
	for _, tc := range []struct {
		spec         string
		loc          *time.Location
		spring, fall time.Time
	}{
		{"0 2 * * *", berlin, time.Date(2025, 3, 30, 1, 0, 0, 0, time.UTC), time.Date(2025, 10, 26, 0, 0, 0, 0, time.UTC)},
		{"30 2 * * *", berlin, time.Date(2025, 3, 30, 1, 0, 0, 0, time.UTC), time.Date(2025, 10, 26, 0, 30, 0, 0, time.UTC)},
		{"CRON_TZ=Europe/Berlin 30 2 * * *", time.UTC, time.Date(2025, 3, 30, 1, 0, 0, 0, time.UTC), time.Date(2025, 10, 26, 0, 30, 0, 0, time.UTC)},
	} {
		s, _, err := parseSchedule(tc.spec, tc.loc)
		require.NoError(t, err)
		got := ticks(s, from, to)

		perDay := map[string][]time.Time{}
		ids := map[string]bool{}
		for _, tk := range got {
			day := tk.In(berlin).Format(time.DateOnly)
			perDay[day] = append(perDay[day], tk)
			ids[tickTaskID("x:job:daily", tk)] = true
		}
		require.Len(t, perDay, 365, tc.spec)
		for day, tks := range perDay {
			require.Len(t, tks, 1, "%s on %s: %v", tc.spec, day, tks)
		}
		require.Len(t, ids, 365, "one task id per day")
		require.Equal(t, tc.spring, perDay[spring][0].UTC(), "%s: the skipped tick runs when the gap ends", tc.spec)
		require.Equal(t, tc.fall, perDay[fall][0].UTC(), "%s: the repeated time runs at its first occurrence", tc.spec)

		// Off the two transition days, the ticks (and task ids) are
		// robfig/cron's.
		ss, err := cronParser.Parse(tc.spec)
		require.NoError(t, err)
		if tc.loc != time.UTC {
			ss.(*cron.SpecSchedule).Location = tc.loc
		}
		var want []time.Time
		for _, tk := range ticks(ss, from, to) {
			if day := tk.In(berlin).Format(time.DateOnly); day != spring && day != fall {
				want = append(want, tk)
			}
		}
		var kept []time.Time
		for _, tk := range got {
			if day := tk.In(berlin).Format(time.DateOnly); day != spring && day != fall {
				kept = append(kept, tk)
			}
		}
		require.Equal(t, want, kept, tc.spec)

		// A scheduler started at any moment around the transitions (in the
		// repeated hour too) computes the next tick of the same sequence.
		for _, day := range []time.Time{time.Date(2025, 3, 29, 20, 0, 0, 0, time.UTC), time.Date(2025, 10, 25, 20, 0, 0, 0, time.UTC)} {
			for start := day; start.Before(day.Add(30 * time.Hour)); start = start.Add(5 * time.Minute) {
				k := 0
				for !got[k].After(start) {
					k++
				}
				require.Equal(t, got[k].Unix(), s.Next(start).Unix(), "%s started at %s", tc.spec, start.In(berlin))
			}
		}
	}

	// @daily is a fixed time too: São Paulo skipped 2018-11-04 00:00.
	saoPaulo, err := time.LoadLocation("America/Sao_Paulo")
	require.NoError(t, err)
	s, _, err := parseSchedule("@daily", saoPaulo)
	require.NoError(t, err)
	got := ticks(s, time.Date(2018, 11, 3, 0, 0, 0, 0, saoPaulo), time.Date(2018, 11, 6, 0, 0, 0, 0, saoPaulo))
	require.Equal(t, []time.Time{
		time.Date(2018, 11, 3, 3, 0, 0, 0, time.UTC),
		time.Date(2018, 11, 4, 3, 0, 0, 0, time.UTC), // 01:00 -02, when the gap ends
		time.Date(2018, 11, 5, 2, 0, 0, 0, time.UTC),
	}, utc(got))
}

// TestWildcardCronTicksOnRealTimeAcrossDST: specs with a wildcard minute
// or hour, @hourly and @every tick on real time through a transition: the
// repeated hour ticks twice, the skipped one not at all.
func TestWildcardCronTicksOnRealTimeAcrossDST(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	fallDay := [2]time.Time{time.Date(2025, 10, 26, 0, 0, 0, 0, berlin), time.Date(2025, 10, 27, 0, 0, 0, 0, berlin)} // 25 hours
	springDay := [2]time.Time{time.Date(2025, 3, 30, 0, 0, 0, 0, berlin), time.Date(2025, 3, 31, 0, 0, 0, 0, berlin)} // 23 hours
	for _, tc := range []struct {
		spec  string
		day   [2]time.Time
		every time.Duration
		n     int
	}{
		{"*/30 * * * *", fallDay, 30 * time.Minute, 50},
		{"*/30 * * * *", springDay, 30 * time.Minute, 46},
		{"30 * * * *", fallDay, time.Hour, 25},
		{"@hourly", fallDay, time.Hour, 25},
		{"@hourly", springDay, time.Hour, 23},
		{"@every 1h", fallDay, time.Hour, 25},
	} {
		s, _, err := parseSchedule(tc.spec, berlin)
		require.NoError(t, err)
		got := ticks(s, tc.day[0], tc.day[1])
		require.Len(t, got, tc.n, tc.spec)
		for k := 1; k < len(got); k++ {
			require.Equal(t, tc.every, got[k].Sub(got[k-1]), "%s: %v", tc.spec, got)
		}
	}

	// Both 02:00s of the fall-back day, and every minute of both 02:xx hours
	// for a wildcard minute.
	s, _, err := parseSchedule("*/30 * * * *", berlin)
	require.NoError(t, err)
	var twoAM []time.Time
	for _, tk := range ticks(s, fallDay[0], fallDay[1]) {
		if tk.In(berlin).Format(time.TimeOnly) == "02:00:00" {
			twoAM = append(twoAM, tk)
		}
	}
	require.Equal(t, []time.Time{time.Date(2025, 10, 26, 0, 0, 0, 0, time.UTC), time.Date(2025, 10, 26, 1, 0, 0, 0, time.UTC)}, utc(twoAM))
	s, _, err = parseSchedule("* 2 * * *", berlin)
	require.NoError(t, err)
	require.Len(t, ticks(s, fallDay[0], fallDay[1]), 120)
}

// TestCronTicksInUTCAreRobfigs: without a zone that changes its offset,
// every spec ticks exactly as robfig/cron computes (so task ids of deployed
// schedules keep their meaning).
func TestCronTicksInUTCAreRobfigs(t *testing.T) {
	t.Parallel()
	from, to := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, spec := range []string{"0 2 * * *", "30 2 * * 1-5", "15 3,15 1 * *", "0 0 29 2 *", "@daily", "@weekly", "@monthly", "@yearly", "45 9-17 * * 1-5"} {
		s, _, err := parseSchedule(spec, time.UTC)
		require.NoError(t, err)
		ss, err := cronParser.Parse(spec)
		require.NoError(t, err)
		ss.(*cron.SpecSchedule).Location = time.UTC
		want := ticks(ss, from, to)
		require.NotEmpty(t, want, spec)
		require.Equal(t, utc(want), utc(ticks(s, from, to)), spec)
	}
}

func utc(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for k, t := range ts {
		out[k] = t.UTC()
	}
	return out
}

// TestCronTickIsInTheScheduleZone: a cron job's Tick.Time is in the zone
// its schedule runs in, a CRON_TZ= prefix's as much as Options.Location's,
// so a handler reading the tick's date or hour gets the schedule's own.
func TestCronTickIsInTheScheduleZone(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("test")
	got := map[string]time.Time{}
	handler := func(name string) Handler[Tick] {
		return func(_ context.Context, _ *Context, tick Tick) error {
			got[name] = tick.Time
			return nil
		}
	}
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	jobs := map[string]*Job{
		"prefix":          Cron(f, "prefix", "CRON_TZ=Europe/Berlin 30 0 * * *", nil, handler("prefix")),
		"option":          Cron(f, "option", "30 0 * * *", &Options{Location: tokyo}, handler("option")),
		"prefix-wins":     Cron(f, "prefix-wins", "CRON_TZ=Europe/Berlin 30 0 * * *", &Options{Location: tokyo}, handler("prefix-wins")),
		"every-in-prefix": Cron(f, "every-in-prefix", "CRON_TZ=Europe/Berlin @every 1h", nil, handler("every-in-prefix")),
	}
	require.NoError(t, reg.Build())
	for name, j := range jobs {
		// The first tick after noon UTC on 2026-07-01.
		tick := j.sched.Next(time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC))
		payload, err := json.Marshal(wire{Tenant: framework.SystemTenantID, Tick: tick.Unix()})
		require.NoError(t, err)
		require.NoError(t, j.run(context.Background(), &Context{Job: j.name}, payload), name)
		want := "Europe/Berlin"
		if name == "option" {
			want = "Asia/Tokyo"
		}
		require.Equal(t, want, got[name].Location().String(), name)
		if name != "every-in-prefix" {
			require.Equal(t, 0, got[name].Hour(), name)
			require.Equal(t, 30, got[name].Minute(), name)
		}
	}
}
