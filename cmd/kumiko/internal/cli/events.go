package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// eventsCmd is the `kumiko events` command group.
func eventsCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Event log operations (prune)",
	}
	cmd.AddCommand(eventsPruneCmd(register))
	return cmd
}

// buildRegistry registers the application's features with cfg and builds
// the registry, failing with every registration problem.
func buildRegistry(register func(*framework.Registry, *config.Config), cfg *config.Config) (*framework.Registry, error) {
	reg := framework.NewRegistry()
	if register != nil {
		register(reg, cfg)
	}
	if err := reg.Build(); err != nil {
		return nil, fmt.Errorf("registry:\n%w", err)
	}
	return reg, nil
}

func eventsPruneCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	var days int
	var types string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "prune --older-than-days N [--types a,b] [--dry-run]",
		Short: "Delete old events of pub/sub types (or of the named types), refusing while a consumer has not passed them",
		Long: `Delete events created more than N days ago, of the named types or, by default,
of every pub/sub type (declared with EventOptions{PubSub: true}). Aggregate
events are deleted only when named with --types.

The prune refuses, and deletes nothing, while any consumer that is not
disabled has not passed the events it would delete; move such a consumer on
with 'kumiko consumer skip' or 'kumiko consumer disable'. A shared consumer
this binary declares that no process has registered yet (a new release's,
before its first worker started) counts as sitting at the start of the log:
run the prune with the newest release's binary. --dry-run counts
what would be deleted and runs the same check.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than-days") {
				return errors.New("--older-than-days is required")
			}
			var names []string
			for _, t := range strings.Split(types, ",") {
				if t = strings.TrimSpace(t); t != "" {
					names = append(names, t)
				}
			}
			if cmd.Flags().Changed("types") && len(names) == 0 {
				// An unset variable in a script (--types "$TYPES") must not
				// widen the prune to every pub/sub type.
				return errors.New("--types names no event type; leave it out to prune every pub/sub type")
			}
			pool, cfg, err := toolPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			reg, err := buildRegistry(register, cfg)
			if err != nil {
				return err
			}
			res, err := retention.Prune(cmd.Context(), pool, reg, &retention.Options{OlderThanDays: days, Types: names, DryRun: dryRun})
			out := cmd.OutOrStdout()
			if res != nil {
				if len(res.Types) == 0 {
					fmt.Fprintln(out, "no pub/sub event types are declared: nothing to prune (name types with --types)")
					return nil
				}
				verb := "deleted"
				if res.DryRun {
					verb = "would delete"
				}
				fmt.Fprintf(out, "events created before %s (older than %s):\n", res.Cutoff.UTC().Format(time.RFC3339), dayCount(days))
				for _, t := range res.Types {
					fmt.Fprintf(out, "  %-40s %d\n", t, res.Counts[t])
				}
				fmt.Fprintf(out, "%s %d event(s)", verb, res.Total)
				if res.DryRun {
					fmt.Fprint(out, " (dry run: nothing deleted)")
				}
				fmt.Fprintln(out)
			}
			return err
		},
	}
	intFlag(cmd.Flags(), &days, "older-than-days", 0, "delete events created more than N days ago (required, 1 to 1000000)")
	cmd.Flags().StringVar(&types, "types", "", "comma-separated qualified event types (default: every pub/sub type)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be deleted; delete nothing")
	return cmd
}
