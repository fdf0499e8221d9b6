package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// jobsCmd is the `kumiko jobs` command group: the declared jobs, and the
// runs in the lanes' queues (list, retry).
func jobsCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List declared jobs, list runs by state, retry archived runs, prune HandledOnce claims",
	}
	cmd.AddCommand(jobsDeclaredCmd(register), jobsListCmd(), jobsRetryCmd(), jobsPruneHandledCmd())
	return cmd
}

// jobsInspector opens an inspector on REDIS_URL; close releases it.
//
// It silences go-redis's own logger for the rest of the process: a tool
// command reports a failure once, as its error, and go-redis's plain-text
// lines on stderr (a "failed to dial" per attempt while Redis is down) would
// only repeat it before the message. `kumiko serve`, which never opens
// this inspector, routes them to its JSON log instead (redisLogger).
func jobsInspector() (in *jobs.Inspector, closeFn func(), err error) {
	logging.Disable()
	cfg, err := config.LoadForTool()
	if err != nil {
		return nil, nil, fmt.Errorf("configuration:\n%w", err)
	}
	ro, err := cfg.RedisOptions()
	if err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(ro)
	return jobs.NewInspector(rdb, ""), func() { _ = rdb.Close() }, nil
}

func jobsDeclaredCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	return &cobra.Command{
		Use:   "declared",
		Short: "List the jobs the application declares, with trigger and lane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The configuration sets schedules (KUMIKO_SAMPLE_CRON):
			// list the ones `kumiko serve` would run. No database is
			// opened, so none needs to be configured.
			cfg, err := config.LoadForRegistry()
			if err != nil {
				return fmt.Errorf("configuration:\n%w", err)
			}
			reg, err := buildRegistry(register, cfg)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "JOB\tTRIGGER\tLANE\tMAX RETRIES\tTIMEOUT")
			for _, j := range jobs.For(reg).Jobs() {
				trig := string(j.Trigger())
				switch j.Trigger() {
				case jobs.TriggerEvent:
					trig += " " + j.Event()
				case jobs.TriggerCron:
					trig += " " + j.Spec()
				}
				o := j.Options()
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", j.Name(), trig, j.RunIn(), o.MaxRetries, o.Timeout)
			}
			return w.Flush()
		},
	}
}

func jobsListCmd() *cobra.Command {
	var state, lane, tenant string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List job runs in one state (default: archived, the runs that exhausted their retries)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// jobs.ListOptions reads a zero limit as its default; here the
			// default is the flag's, and 0 is a mistake.
			if limit < 1 || limit > 1000 {
				return fmt.Errorf("--limit %d is not between 1 and 1000", limit)
			}
			in, closeFn, err := jobsInspector()
			if err != nil {
				return err
			}
			defer closeFn()
			items, err := in.List(cmd.Context(), &jobs.ListOptions{
				State: jobs.State(state), Lane: framework.RunIn(lane), TenantID: tenant, Limit: limit,
			})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(items)
			}
			if len(items) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "no %s job runs\n", cmp.Or(state, string(jobs.StateArchived)))
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tLANE\tSTATE\tTENANT\tRETRIED\tLAST FAILED\tLAST ERROR")
			for _, t := range items {
				failed := "-"
				if !t.LastFailedAt.IsZero() {
					failed = t.LastFailedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", t.ID, t.Lane, t.State, t.TenantID, t.Retried, t.MaxRetry, failed, jobsOneLine(t.LastError, 80))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", string(jobs.StateArchived), "archived, pending, active, scheduled, retry or completed")
	cmd.Flags().StringVar(&lane, "lane", "", "api or worker (default: both)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's runs (default: all)")
	refuseBlank(cmd.Flags(), "state", "lane", "tenant")
	intFlag(cmd.Flags(), &limit, "limit", 50, "most runs listed (1..1000)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func jobsRetryCmd() *cobra.Command {
	var lane string
	cmd := &cobra.Command{
		Use:   "retry ID",
		Short: "Run an archived job run (or one waiting for its retry, or scheduled) again now (ID from `kumiko jobs list`)",
		Args:  oneName("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, closeFn, err := jobsInspector()
			if err != nil {
				return err
			}
			defer closeFn()
			t, err := in.Retry(cmd.Context(), framework.RunIn(lane), args[0])
			if errors.Is(err, jobs.ErrTaskNotFound) {
				return fmt.Errorf("no job run %q (list them with `kumiko jobs list`)", args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "retrying %s (%s, was %s) in the %s lane\n", t.ID, t.Job, t.State, t.Lane)
			return nil
		},
	}
	cmd.Flags().StringVar(&lane, "lane", "", "api or worker (default: search both)")
	refuseBlank(cmd.Flags(), "lane")
	return cmd
}

func jobsPruneHandledCmd() *cobra.Command {
	var days int
	cmd := &cobra.Command{
		Use:   "prune-handled --older-than-days N",
		Short: "Delete HandledOnce claims (the handled table) older than N days",
		Long: `Delete the HandledOnce claims of every tenant made more than N days ago.
Nothing else removes them: the handled table grows by one row per claim.

A pruned key can be claimed again: an effect it guarded repeats if its job
is delivered once more after the prune. asynq keeps archived runs, which an
operator may retry, for up to 90 days: prune with 90 days or more.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than-days") {
				return errors.New("--older-than-days is required")
			}
			pool, _, err := toolPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := jobs.PruneHandled(cmd.Context(), pool, days)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d HandledOnce claim(s) older than %s\n", n, dayCount(days))
			return nil
		},
	}
	intFlag(cmd.Flags(), &days, "older-than-days", 0, fmt.Sprintf("delete claims made more than N days ago (required, 1 to %d)", jobs.MaxHandledAgeDays))
	return cmd
}

// jobsOneLine flattens s, escapes its control characters (see
// [printable]) and cuts it to n runes.
func jobsOneLine(s string, n int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
