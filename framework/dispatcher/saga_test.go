package dispatcher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// derived is the event a saga appends for each noted event.
type derived struct {
	N int `json:"n"`
}

// sagaWithInline registers test:saga, which appends a derived event for
// every noted event (then runs sagaStep, when set), and test:derived-log,
// an inline projection of derived events that writes them to the seen table
// (after failing with inlineErr, when it returns one).
func sagaWithInline(b *bundle, sagaStep func(ctx context.Context, tx *framework.Tx, n int) error, inlineErr func(n int) error) {
	der := framework.DefineEvent[derived](b.f, "derived", nil)
	inl := framework.InlineProjection(b.f, "derived-log")
	framework.On(inl, der, func(ctx context.Context, tx *framework.Tx, e framework.Event[derived]) error {
		if inlineErr != nil {
			if err := inlineErr(e.Payload.N); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'derived-log', $2, $3, $4, $5)`,
			tx.TenantID(), e.ID, e.Payload.N, tx.CausationID(), tx.CorrelationID())
		return err
	})
	saga := framework.MultiStreamProjection(b.f, "saga", &framework.ProjectionOptions{Saga: true, MaxAttempts: 1})
	framework.On(saga, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		if err := tx.Append(framework.Stream{Type: "d", ID: "1"}, framework.AnyVersion, der.With(derived{N: e.Payload.N})); err != nil {
			return err
		}
		if sagaStep != nil {
			return sagaStep(ctx, tx, e.Payload.N)
		}
		return nil
	})
}

// positions returns the first column of sql's rows.
func positions(t *testing.T, b *bundle, sql string) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), sql)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return out
}

// TestSagaAppendedEventsRunInlineProjections: the events a saga appends in
// a dispatcher pass run the inline projections of their type in the pass's
// transaction, as a write's events do in the write's: each derived event has
// one read-model row (also when the saga read it back, which wrote and
// projected it early), written by the saga's Tx (whose causation, while
// the projection runs, is the derived event). An event whose saga step fails after the inline projection ran
// (here after an explicit flush) is rolled back with that row: neither the
// event nor the row exists.
func TestSagaAppendedEventsRunInlineProjections(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		sagaWithInline(b, func(ctx context.Context, tx *framework.Tx, n int) error {
			switch n {
			case 1:
				// Reads its event back: written, and projected, now.
				_, err := tx.ReadStream(ctx, framework.Stream{Type: "d", ID: "1"}, framework.AsOf{})
				return err
			case 2:
				if _, err := tx.Flush(ctx); err != nil { // the inline projection runs now
					return err
				}
				return errors.New("saga refused")
			}
			return nil
		}, nil)
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)
	n, err := d.RunOnce(context.Background(), "test:saga")
	require.NoError(t, err)
	require.Equal(t, 2, n, "events 0 and 1 delivered, event 2 failed")
	require.Equal(t, "dead", state(t, b, "test:saga", dispatcher.SharedInstance).status)

	derivedAt := positions(t, b, `SELECT position FROM events WHERE type = 'test:event:derived' ORDER BY position`)
	require.Len(t, derivedAt, 2, "the failed event's derived event was rolled back")
	require.Equal(t, derivedAt, positions(t, b, `SELECT position FROM seen WHERE consumer = 'derived-log' ORDER BY position`),
		"every derived event, and only those, has its inline projection row")
	require.Equal(t, derivedAt,
		positions(t, b, `SELECT causation::bigint FROM seen WHERE consumer = 'derived-log' ORDER BY position`),
		"in the inline projection, the causation is the derived event it handles")
	require.Zero(t, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'derived-log' AND n = 2`),
		"the inline row of the rolled-back event stayed")
}

// TestInlineProjectionFailureInPassFailsTheEvent: an inline projection of
// an event a saga appends fails like the saga's own handler: the pass
// commits the events before, and the triggering event is recorded as failed
// with the projection's error, its appended event rolled back. That holds
// also when the projection failed in a read of the saga that ignored the
// read's error.
func TestInlineProjectionFailureInPassFailsTheEvent(t *testing.T) {
	t.Parallel()
	for name, sagaStep := range map[string]func(ctx context.Context, tx *framework.Tx, n int) error{
		"after the handler": nil,
		"in an ignored read": func(ctx context.Context, tx *framework.Tx, n int) error {
			_, _ = tx.ReadStream(ctx, framework.Stream{Type: "d", ID: "1"}, framework.AsOf{})
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(b *bundle) {
				sagaWithInline(b, sagaStep, func(n int) error {
					if n == 1 {
						return errors.New("read model refused")
					}
					return nil
				})
			})
			d := newDispatcher(t, b, nil)
			b.write(t, "t1", 0, 3, 1)
			b.db.WaitVisible(t)
			n, err := d.RunOnce(context.Background(), "test:saga")
			require.NoError(t, err)
			require.Equal(t, 1, n, "event 0 delivered, event 1 failed")

			st := state(t, b, "test:saga", dispatcher.SharedInstance)
			require.Equal(t, "dead", st.status)
			require.NotNil(t, st.lastErr)
			require.Contains(t, *st.lastErr, "projection test:derived-log")
			require.Contains(t, *st.lastErr, "read model refused")
			notedAt := positions(t, b, `SELECT position FROM events WHERE type = 'test:event:noted' ORDER BY position`)
			require.Equal(t, notedAt[0], st.position, "the cursor stops before the failed event")
			require.Equal(t, 1, count(t, b, `SELECT count(*) FROM events WHERE type = 'test:event:derived'`))
			require.Equal(t, []int64{0}, positions(t, b, `SELECT n::bigint FROM seen WHERE consumer = 'derived-log'`))
		})
	}
}

// TestPanickingInlineProjectionInAPassFailsTheEvent: an inline projection
// of an event a saga appends runs in the pass (in the flush after the
// saga's handler); its panic fails the saga's event like the handler's own
// would, instead of ending the process.
func TestPanickingInlineProjectionInAPassFailsTheEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		sagaWithInline(b, nil, func(n int) error {
			if n == 1 {
				var m map[string]int
				//lint:ignore SA5000 the projection panics on purpose
				m["boom"] = 1
			}
			return nil
		})
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)
	n, err := d.RunOnce(context.Background(), "test:saga")
	require.NoError(t, err)
	require.Equal(t, 1, n, "the event before the panic commits")
	st := state(t, b, "test:saga", dispatcher.SharedInstance)
	require.Equal(t, "dead", st.status)
}

// TestNewBuildsTheRegistry: a dispatcher given a registry nobody built yet
// (no Runtime made from it) builds it, so that a saga's events still run
// their inline projections; a registry with registration problems is
// refused.
func TestNewBuildsTheRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // writes the noted events
	unbuilt := &bundle{db: b.db, reg: framework.NewRegistry()}
	unbuilt.f = unbuilt.reg.Feature("test")
	unbuilt.noted = framework.DefineEvent[noted](unbuilt.f, "noted", nil)
	sagaWithInline(unbuilt, nil, nil)
	d := newDispatcher(t, unbuilt, nil)
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)
	n, err := d.RunOnce(context.Background(), "test:saga")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Len(t, positions(t, b, `SELECT position FROM seen WHERE consumer = 'derived-log'`), 3,
		"the saga's events skipped their inline projection")

	broken := framework.NewRegistry()
	framework.DefineEvent[noted](broken.Feature("test"), "noted", nil)
	framework.DefineEvent[noted](broken.Feature("test"), "noted", nil)
	_, err = dispatcher.New(b.db.Pool, broken, nil, &dispatcher.Config{InstanceID: "broken"})
	require.ErrorContains(t, err, "noted")
}

// TestNewRefusesNegativeSettings: a negative duration or size set in code
// is refused up front; a negative PollInterval used to panic the poll loop
// at its first wait.
func TestNewRefusesNegativeSettings(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	for name, cfg := range map[string]dispatcher.Config{
		"PollInterval": {PollInterval: -time.Second},
		"BatchSize":    {BatchSize: -1},
		"PassTimeout":  {PassTimeout: -1},
	} {
		cfg.InstanceID = "negative"
		_, err := dispatcher.New(nil, reg, nil, &cfg)
		require.ErrorContains(t, err, name+" must not be negative", name)
	}
	_, err := dispatcher.New(nil, reg, nil, &dispatcher.Config{InstanceID: "no-revivals", MaxRevivals: -1})
	require.NoError(t, err, "a negative MaxRevivals turns revival off")
}
