package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// projectionCmd is the `kumiko projection` command group.
func projectionCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "projection",
		Short: "Projection operations (rebuild)",
	}
	cmd.AddCommand(projectionRebuildCmd(register))
	return cmd
}

func projectionRebuildCmd(register func(*framework.Registry, *config.Config)) *cobra.Command {
	var batch int
	var abandon bool
	cmd := &cobra.Command{
		Use:   "rebuild NAME [--batch-size N] [--abandon]",
		Short: "Replay a projection with a table from the start into a fresh table and swap it in",
		Long: `Replay the multi-stream projection NAME (e.g. orders:order-totals) from the
start of the event log into a fresh copy of its table, while the application
keeps writing, then swap the new table in and let the live consumer continue
after the last event the rebuild applied. Side-effect-only projections (no
Table), sagas, inline and per-instance projections are refused.

A rebuild whose process died leaves a shadow schema and a consumer row
NAME#rebuild behind; the next rebuild removes them and starts over, and
--abandon removes them without rebuilding.`,
		Args: oneName("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			// 0 is the flag's unset value, not a batch size: refused
			// when given, as the admin API refuses batchSize 0.
			if cmd.Flags().Changed("batch-size") && (batch < 1 || batch > rebuild.MaxBatchSize) {
				return fmt.Errorf("--batch-size %d is not between 1 and %d", batch, rebuild.MaxBatchSize)
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
			// --abandon also takes a projection no longer declared, or no
			// longer rebuildable: the leftover of its killed rebuild would
			// pin retention forever.
			if _, err := rebuild.Check(reg, name); err != nil && !abandon {
				return err
			}
			out := cmd.OutOrStdout()
			if abandon {
				found, err := rebuild.Abandon(cmd.Context(), pool, reg, name)
				if err != nil {
					return err
				}
				if found {
					fmt.Fprintf(out, "removed the leftover of an interrupted rebuild of %s\n", name)
				} else {
					fmt.Fprintf(out, "no leftover of a rebuild of %s\n", name)
				}
				return nil
			}
			fmt.Fprintf(out, "rebuilding %s from the start of the log\n", name)
			last := time.Now()
			var phase rebuild.Phase
			res, err := rebuild.Rebuild(cmd.Context(), pool, reg, name, &rebuild.Config{
				BatchSize: batch,
				Progress: func(p rebuild.Progress) {
					if p.Phase != phase || time.Since(last) >= time.Second {
						if p.Phase == rebuild.PhaseSwap && phase != rebuild.PhaseSwap {
							fmt.Fprintf(out, "caught up; swapping tables\n")
						}
						fmt.Fprintf(out, "  %d events applied\n", p.Events)
						phase, last = p.Phase, time.Now()
					}
				},
			})
			if err != nil {
				return err
			}
			if res.Leftover {
				fmt.Fprintf(out, "(removed the leftover of an earlier, interrupted rebuild first)\n")
			}
			fmt.Fprintf(out, "rebuilt %s: %d events applied in %s; %s swapped in, the live consumer continues at %s\n",
				name, res.Events, res.Duration.Round(time.Millisecond), res.Table, res.Cursor)
			return nil
		},
	}
	intFlag(cmd.Flags(), &batch, "batch-size", 0, "events per rebuild pass, 1 to 10000 (default: the projection's batch size, else 500)")
	cmd.Flags().BoolVar(&abandon, "abandon", false, "only remove what an interrupted rebuild left behind")
	// --abandon rebuilds nothing, so a batch size beside it is a mistake.
	cmd.MarkFlagsMutuallyExclusive("batch-size", "abandon")
	return cmd
}
