package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

func noop[T any](context.Context, *jobs.Context, T) error { return nil }

func TestRegistrationProblemsFailBuild(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	placed := framework.DefineEvent[noted](f, "placed", nil)
	other := framework.DefineEvent[noted](framework.NewRegistry().Feature("elsewhere"), "happened", nil)

	jobs.OnEvent(f, "both-lanes", placed, &jobs.Options{RunIn: framework.RunInBoth}, noop[framework.Event[noted]])
	jobs.OnEvent(f, "no-event", framework.EventType[noted]{}, nil, noop[framework.Event[noted]])
	jobs.OnEvent(f, "foreign-event", other, nil, noop[framework.Event[noted]])
	jobs.Cron(f, "bad-cron", "61 * * * *", nil, noop[jobs.Tick])
	jobs.Cron(f, "too-often", "@every 100ms", nil, noop[jobs.Tick])
	jobs.Cron(f, "never", "0 0 30 2 *", nil, noop[jobs.Tick])
	jobs.Manual[noted](f, "twice", nil, noop[noted])
	jobs.Manual[noted](f, "twice", nil, noop[noted])
	jobs.Manual[noted](f, "Not_Kebab", nil, noop[noted])
	jobs.Manual[noted](f, "nil-handler", nil, nil)
	jobs.Manual[noted](f, "short-unique", &jobs.Options{Unique: 10 * time.Millisecond}, noop[noted])
	jobs.Manual[noted](f, "odd-priority", &jobs.Options{Priority: "urgent"}, noop[noted])
	jobs.Manual[noted](f, "odd-lane", &jobs.Options{RunIn: "edge"}, noop[noted])

	err := reg.Build()
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		"job shop:job:both-lanes: runIn both is not allowed: a job runs in exactly one lane, choose api or worker",
		"job shop:job:no-event is triggered by an undeclared event",
		"job shop:job:foreign-event is triggered by elsewhere:event:happened, which this registry never declared",
		`job shop:job:bad-cron: cron spec "61 * * * *"`,
		"@every 100ms is shorter than one second",
		`job shop:job:never: cron spec "0 0 30 2 *": never fires: no such date`,
		"job shop:job:twice registered twice",
		`job name "Not_Kebab" of feature "shop" is not kebab-case`,
		"job shop:job:nil-handler has a nil handler",
		"job shop:job:short-unique: unique window 10ms is shorter than one second",
		`job shop:job:odd-priority: priority "urgent" is not low, default or high`,
		`job shop:job:odd-lane: runIn "edge" is not api or worker`,
	} {
		require.Contains(t, msg, want)
	}
}

func TestRegistrationDefaultsAndListing(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	placed := framework.DefineEvent[noted](f, "placed", nil)
	jobs.OnEvent(f, "on-placed", placed, nil, noop[framework.Event[noted]])
	jobs.Cron(f, "nightly", "CRON_TZ=Europe/Berlin 0 3 * * *", nil, noop[jobs.Tick])
	m := jobs.Manual[noted](f, "export", &jobs.Options{RunIn: framework.RunInAPI, MaxRetries: -1, Priority: jobs.PriorityHigh}, noop[noted])
	require.NoError(t, reg.Build())

	set := jobs.For(reg)
	require.Equal(t, 3, set.Len())
	require.Equal(t, "shop:job:export", m.Name())
	j := set.Job("shop:job:on-placed")
	require.NotNil(t, j)
	require.Equal(t, jobs.TriggerEvent, j.Trigger())
	require.Equal(t, "shop:event:placed", j.Event())
	o := j.Options()
	require.Equal(t, framework.RunInWorker, o.RunIn)
	require.Equal(t, 10, o.MaxRetries)
	require.Equal(t, 30*time.Minute, o.Timeout)
	require.Equal(t, jobs.PriorityDefault, o.Priority)
	require.Equal(t, 0, set.Job("shop:job:export").Options().MaxRetries)
	require.Equal(t, jobs.TriggerCron, set.Job("shop:job:nightly").Trigger())
	// The trigger consumer reads the trigger events and the dispatch event.
	require.Equal(t, []string{"jobs:event:dispatched", "shop:event:placed"}, set.TriggerTypes())
	require.Len(t, set.InLane(framework.RunInAPI), 1)
	require.Len(t, set.InLane(framework.RunInWorker), 2)

	// A registry without jobs declares nothing.
	empty := framework.NewRegistry()
	require.Equal(t, 0, jobs.For(empty).Len())
	require.False(t, empty.HasEvent("jobs:event:dispatched"))
}

func TestValidateTopology(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	jobs.Manual[noted](f, "warm-cache", &jobs.Options{RunIn: framework.RunInAPI}, noop[noted])
	jobs.Manual[noted](f, "token-cleanup", &jobs.Options{RunIn: framework.RunInAPI}, noop[noted])
	jobs.Manual[noted](f, "render", nil, noop[noted])
	require.NoError(t, reg.Build())
	set := jobs.For(reg)

	err := jobs.Validate(set, jobs.Topology{RedisConfigured: false})
	require.ErrorContains(t, err, "3 job(s) are declared (shop:job:render, shop:job:token-cleanup, shop:job:warm-cache) but no Redis is configured")

	err = jobs.Validate(set, jobs.Topology{RedisConfigured: true, APIProcess: true})
	require.ErrorContains(t, err, "shop:job:token-cleanup, shop:job:warm-cache run in the api lane (RunIn api) but this api process does not consume it")
	require.NotContains(t, err.Error(), "shop:job:render")

	require.NoError(t, jobs.Validate(set, jobs.Topology{RedisConfigured: true, APIProcess: true, RunLocalJobs: true}))
	require.NoError(t, jobs.Validate(set, jobs.Topology{RedisConfigured: true}))
	require.NoError(t, jobs.Validate(jobs.For(framework.NewRegistry()), jobs.Topology{}))
}

func TestRegistrationAfterBuildPanics(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	jobs.Manual[noted](f, "first", nil, noop[noted])
	require.NoError(t, reg.Build())
	require.PanicsWithValue(t, "kumiko: registration after Registry.Build", func() {
		jobs.Manual[noted](f, "late", nil, noop[noted])
	})
}

// TestValidateCronSpec: ValidateCronSpec accepts what Cron accepts and
// reports what Cron would report as a registration problem. A spec of a
// date no month has (February 30) was accepted: the boot went on, and
// every worker's scheduler logged once that it never fires and stopped.
func TestValidateCronSpec(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"0 2 * * *", "*/1 * * * *", "@daily", "@every 2s", "CRON_TZ=Europe/Berlin 30 2 * * *"} {
		require.NoError(t, jobs.ValidateCronSpec(spec), spec)
	}
	for spec, want := range map[string]string{
		"61 * * * *":                         "end of range (61) above maximum (59)",
		"@every 100ms":                       "@every 100ms is shorter than one second",
		"@every soon":                        "bad @every duration",
		"CRON_TZ=Mars/Base 0 2 * * *":        `bad time zone "Mars/Base"`,
		"":                                   "empty spec string",
		"0 0 30 2 *":                         "never fires: no such date",
		"CRON_TZ=Europe/Berlin 0 3 31 4,6 *": "never fires: no such date",
	} {
		err := jobs.ValidateCronSpec(spec)
		require.Error(t, err, spec)
		require.Contains(t, err.Error(), want, spec)
	}
}
