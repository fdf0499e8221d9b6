package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

func TestScheduleTicksAreTheSameInEveryProcess(t *testing.T) {
	t.Parallel()
	s, err := parseSchedule("@every 2s", time.UTC)
	require.NoError(t, err)
	// Processes started at different moments compute the same ticks.
	a := s.Next(time.Unix(1000, 300_000_000))
	b := s.Next(time.Unix(1001, 900_000_000))
	require.Equal(t, time.Unix(1002, 0).Unix(), a.Unix())
	require.Equal(t, a.Unix(), b.Unix())
	require.Equal(t, int64(1004), s.Next(a).Unix())

	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	s, err = parseSchedule("0 3 * * *", berlin)
	require.NoError(t, err)
	next := s.Next(time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC))
	require.Equal(t, time.Date(2026, 7, 2, 1, 0, 0, 0, time.UTC), next.UTC(), "03:00 in Berlin (CEST) is 01:00 UTC")

	s, err = parseSchedule("CRON_TZ=America/New_York 30 8 * * 1", time.UTC)
	require.NoError(t, err)
	next = s.Next(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)) // a Sunday
	require.Equal(t, time.Date(2026, 11, 30, 13, 30, 0, 0, time.UTC), next.UTC())

	s, err = parseSchedule("@hourly", time.UTC)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 1, 11, 0, 0, 0, time.UTC), s.Next(time.Date(2026, 1, 1, 10, 59, 59, 0, time.UTC)))

	for _, bad := range []string{"", "* * *", "@every", "@every soon", "@every 500ms", "0 0 30 2 * *"} {
		_, err := parseSchedule(bad, time.UTC)
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
