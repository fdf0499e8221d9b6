package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestEventJobOfNewerEventVersionIsRetried: a task carrying an event of a
// schema version newer than this worker declares (a newer release wrote it
// while this one still runs) fails with ErrNewerEventVersion and is retried
// per the job's options, since a worker of the newer release can run it;
// it is not archived at once like a payload no release can decode.
func TestEventJobOfNewerEventVersionIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "count", b.noted, &jobs.Options{
			MaxRetries: 2,
			Backoff:    func(int) time.Duration { return 10 * time.Millisecond },
		}, func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
			return insertRun(ctx, jc, jc.Job, "ran", "")
		})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	_, err := eventstore.Append(context.Background(), b.db.Pool,
		eventstore.StreamRef{TenantID: "acme", Type: "s", ID: "v2"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: b.noted.Name(), TypeVersion: 2, Payload: []byte(`{"count":1}`)}})
	require.NoError(t, err)

	var archived []jobs.TaskInfo
	eventually(t, "the run to be archived", func() bool {
		archived, err = r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(archived) == 1
	})
	require.Contains(t, archived[0].LastError, "stored at version 2, this code declares version 1")
	require.Equal(t, 2, archived[0].Retried, "retried, not archived at once")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM runs`))
}
