package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// consumerCmd is the `kumiko consumer` command group: the ops verbs of
// package dispatcher on the state rows in DATABASE_URL. The registry is not
// needed: the rows are the truth, including rows of consumers that a newer
// build no longer registers.
func consumerCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	_ = register
	cmd := &cobra.Command{
		Use:   "consumer",
		Short: "Inspect and operate event consumers (list, status, restart, skip, disable, enable, rewind, remove-instance, prune-dead-letters)",
		Long: `Inspect and operate the dispatcher's event consumers in DATABASE_URL.

States: idle (delivering), processing (a pass runs now), dead (the same event
failed MaxAttempts times; paused until restart, skip or rewind, or an
automatic revival after 5 minutes, at most 3 times in a row), disabled
(parked by an operator until enable). Every verb takes the consumer's lock, so
it waits for a running pass and never races one. --instance selects a
per-instance consumer's row (default: the shared row __shared__).`,
	}
	cmd.AddCommand(consumerListCmd(), consumerStatusCmd(),
		consumerVerbCmd("restart", "Retry a dead consumer's failing event (dead only; the cursor stays)",
			func(ctx context.Context, pool *pgxpool.Pool, name, instance string) (string, error) {
				if err := dispatcher.Restart(ctx, pool, name, instance); err != nil {
					return "", err
				}
				return "restarted consumer " + consumerLabel(name, instance) + ": the next pass retries its failing event", nil
			}),
		consumerVerbCmd("skip", "Move a consumer past its failing (poison) event, recording it as a dead letter",
			func(ctx context.Context, pool *pgxpool.Pool, name, instance string) (string, error) {
				dl, err := dispatcher.Skip(ctx, pool, name, instance)
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("skipped event %d (%s, tenant %s) of consumer %s; dead letter %d",
					dl.Position, dl.EventType, dl.TenantID, consumerLabel(name, instance), dl.ID), nil
			}),
		consumerVerbCmd("disable", "Park a consumer: no pass delivers to it until enable",
			func(ctx context.Context, pool *pgxpool.Pool, name, instance string) (string, error) {
				if err := dispatcher.Disable(ctx, pool, name, instance); err != nil {
					return "", err
				}
				return "disabled consumer " + consumerLabel(name, instance), nil
			}),
		consumerVerbCmd("enable", "Resume a disabled consumer at its cursor (disabled only)",
			func(ctx context.Context, pool *pgxpool.Pool, name, instance string) (string, error) {
				if err := dispatcher.Enable(ctx, pool, name, instance); err != nil {
					return "", err
				}
				return "enabled consumer " + consumerLabel(name, instance), nil
			}),
		consumerRewindCmd(), consumerRemoveInstanceCmd(), consumerPruneDeadLettersCmd())
	return cmd
}

// consumerLabel names a state row in messages, like the dispatcher does.
func consumerLabel(name, instance string) string {
	if instance == "" || instance == dispatcher.SharedInstance {
		return name
	}
	return name + " (instance " + instance + ")"
}

// withConsumerPool runs fn with a pool on DATABASE_URL.
func withConsumerPool(ctx context.Context, fn func(pool *pgxpool.Pool) error) error {
	pool, _, err := toolPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(pool)
}

func consumerListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List every consumer state row with status, lag and cursor",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rows, err := dispatcher.List(cmd.Context(), pool)
				if err != nil {
					return err
				}
				if asJSON {
					if rows == nil {
						rows = []dispatcher.ConsumerStatus{}
					}
					return writeConsumerJSON(cmd.OutOrStdout(), rows)
				}
				if len(rows) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no consumers registered")
					return nil
				}
				return writeConsumerTable(cmd.OutOrStdout(), rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}

func consumerStatusCmd() *cobra.Command {
	var asJSON bool
	var instance string
	cmd := &cobra.Command{
		Use:   "status NAME [--instance ID] [--json]",
		Short: "Show one consumer's state, failure and newest dead letters",
		Args:  oneName("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				st, err := dispatcher.Status(cmd.Context(), pool, args[0], instance)
				if err != nil {
					return err
				}
				if asJSON {
					return writeConsumerJSON(cmd.OutOrStdout(), st)
				}
				return writeConsumerStatus(cmd.OutOrStdout(), st)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&instance, "instance", "", "instance id of a per-instance consumer (default: the shared row)")
	refuseBlank(cmd.Flags(), "instance")
	return cmd
}

// consumerVerbCmd is `kumiko consumer <verb> NAME [--instance ID]`.
func consumerVerbCmd(verb, short string, run func(ctx context.Context, pool *pgxpool.Pool, name, instance string) (string, error)) *cobra.Command {
	var instance string
	cmd := &cobra.Command{
		Use:   verb + " NAME [--instance ID]",
		Short: short,
		Args:  oneName("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				msg, err := run(cmd.Context(), pool, args[0], instance)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), msg)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&instance, "instance", "", "instance id of a per-instance consumer (default: the shared row)")
	refuseBlank(cmd.Flags(), "instance")
	return cmd
}

func consumerRewindCmd() *cobra.Command {
	var instance, toTime string
	var toPosition int64
	cmd := &cobra.Command{
		Use:   "rewind NAME [--instance ID] (--to-position N | --to-time T)",
		Short: "Deliver events again from a position or a time on",
		Long: `Set the consumer's cursor back so that it delivers events again.

--to-position N replays from the event with position N on (0: the whole log).
--to-time T (RFC 3339) replays every event created at or after T.
Rewind only moves back; a dead consumer turns idle, a disabled one stays
disabled. Consumers must be idempotent: replayed events are applied again.`,
		Args: oneName("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var to dispatcher.RewindTo
			if cmd.Flags().Changed("to-time") {
				t, err := time.Parse(time.RFC3339Nano, toTime)
				if err != nil {
					return fmt.Errorf("--to-time %q is not an RFC 3339 time (e.g. 2026-05-01T12:00:00Z)", toTime)
				}
				to.Time = t
			} else {
				if toPosition < 0 {
					return fmt.Errorf("--to-position %d is negative", toPosition)
				}
				to.Position = toPosition
			}
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				res, err := dispatcher.Rewind(cmd.Context(), pool, args[0], instance, to)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "rewound consumer %s from cursor %s to %s\n", consumerLabel(args[0], instance), res.From, res.To)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&instance, "instance", "", "instance id of a per-instance consumer (default: the shared row)")
	refuseBlank(cmd.Flags(), "instance")
	intFlag(cmd.Flags(), &toPosition, "to-position", 0, "replay from the event with this position on (0: the start of the log)")
	cmd.Flags().StringVar(&toTime, "to-time", "", "replay the events created at or after this RFC 3339 time")
	cmd.MarkFlagsMutuallyExclusive("to-position", "to-time")
	cmd.MarkFlagsOneRequired("to-position", "to-time")
	return cmd
}

func consumerRemoveInstanceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove-instance ID",
		Short: "Remove a decommissioned instance's per-instance consumer rows now",
		Long: `Remove the per-instance consumer rows of a process that is gone for good
(scale-down), so they neither pin event retention nor show false lag.
Dispatchers remove rows silent for 10 minutes by themselves; this does it at
once. It refuses an instance whose rows had a heartbeat in the last minute.`,
		Args: oneName("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				n, err := dispatcher.RemoveInstance(cmd.Context(), pool, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %d consumer row(s) of instance %s\n", n, args[0])
				return nil
			})
		},
	}
}

func consumerPruneDeadLettersCmd() *cobra.Command {
	var days int
	cmd := &cobra.Command{
		Use:   "prune-dead-letters --older-than-days N",
		Short: "Delete dead letters (of every consumer) recorded more than N days ago",
		Long: `Delete the dead letters of every consumer and instance recorded more than N
days ago. Nothing else removes them, also not those of consumers or
instances that are gone. The events stay in the log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than-days") {
				return errors.New("--older-than-days is required")
			}
			return withConsumerPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				n, err := retention.PruneDeadLetters(cmd.Context(), pool, days)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %d dead letter(s) older than %s\n", n, dayCount(days))
				return nil
			})
		},
	}
	intFlag(cmd.Flags(), &days, "older-than-days", 0, fmt.Sprintf("delete dead letters recorded more than N days ago (required, 1 to %d)", retention.MaxOlderThanDays))
	return cmd
}

func writeConsumerJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeConsumerTable prints one line per state row.
func writeConsumerTable(w io.Writer, rows []dispatcher.ConsumerStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tINSTANCE\tSTATUS\tLAG\tCURSOR\tATTEMPTS\tPROCESSED\tHEARTBEAT\tLAST ERROR")
	for _, s := range rows {
		lastErr := consumerOneLine(s.LastError, 60)
		if s.FailedPosition != nil {
			lastErr = fmt.Sprintf("#%d: %s", *s.FailedPosition, lastErr)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s ago\t%s\n", s.Name, s.InstanceID, s.Status, consumerLag(s),
			s.Cursor, s.Attempts, s.EventsProcessed, consumerAge(s.HeartbeatAge), lastErr)
	}
	return tw.Flush()
}

// consumerLag renders a row's lag, "100000+" when counting stopped at the
// cap.
func consumerLag(s dispatcher.ConsumerStatus) string {
	if s.LagCapped {
		return fmt.Sprintf("%d+", s.Lag)
	}
	return fmt.Sprint(s.Lag)
}

// writeConsumerStatus prints one row as key: value lines and its dead
// letters as a table.
func writeConsumerStatus(w io.Writer, s dispatcher.ConsumerStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	status := string(s.Status)
	if s.DeadSince != nil {
		status += " since " + s.DeadSince.UTC().Format(time.RFC3339)
	}
	types := "all"
	if s.EventTypes != nil {
		types = strings.Join(s.EventTypes, ", ")
	}
	lines := [][2]string{
		{"name", s.Name},
		{"instance", s.InstanceID},
		{"status", status},
		{"event types", types},
		{"cursor", fmt.Sprintf("%s (position %d)", s.Cursor, s.Cursor.Position)},
		{"lag", consumerLag(s)},
		{"attempts", fmt.Sprint(s.Attempts)},
	}
	if s.FailedPosition != nil {
		lines = append(lines, [2]string{"failed position", fmt.Sprint(*s.FailedPosition)})
	}
	if s.LastError != "" {
		lines = append(lines, [2]string{"last error", consumerOneLine(s.LastError, 500)})
	}
	if s.NextAttemptAt != nil {
		lines = append(lines, [2]string{"next attempt", s.NextAttemptAt.UTC().Format(time.RFC3339Nano)})
	}
	lines = append(lines,
		[2]string{"revivals", fmt.Sprint(s.Revivals)},
		[2]string{"events processed", fmt.Sprint(s.EventsProcessed)},
		[2]string{"heartbeat", consumerAge(s.HeartbeatAge) + " ago"},
	)
	for _, l := range lines {
		fmt.Fprintf(tw, "%s:\t%s\n", l[0], l[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.DeadLetters) == 0 {
		_, err := fmt.Fprintln(w, "dead letters: none")
		return err
	}
	fmt.Fprintln(w, "dead letters (newest first):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tPOSITION\tTYPE\tTENANT\tAT\tERROR")
	for _, d := range s.DeadLetters {
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.Position, d.EventType, d.TenantID,
			d.CreatedAt.UTC().Format(time.RFC3339), consumerOneLine(d.Error, 80))
	}
	return tw.Flush()
}

// consumerOneLine flattens s to one line of at most n runes, with its
// control characters escaped (see [printable]).
func consumerOneLine(s string, n int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// consumerAge renders a duration coarsely: 3s, 4m, 2h, 5d.
func consumerAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// printable escapes the control characters left in s (ESC, BEL, NUL, DEL,
// the C1 range such as CSI) as \xNN. An error text is data: a
// handler's or a remote service's message may quote an event's payload,
// and written raw to the operator's terminal its escape sequences would
// clear the screen, move the cursor over other rows (hiding a dead
// consumer), retitle the window or set the clipboard.
func printable(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) { // C0, DEL and C1: all below U+0100
			fmt.Fprintf(&b, "\\x%02x", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}
