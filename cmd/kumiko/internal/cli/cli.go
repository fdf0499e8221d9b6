// Package cli holds the kumiko binary's commands (cobra).
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/web"
)

// Main runs the command line args with the application's features (and its
// own HTTP routes, such as pages; nil for none) and returns the process exit
// code. Every command that needs the features calls register with a fresh
// registry and the configuration it loaded, so a feature reads its settings
// from there rather than from the environment.
func Main(ctx context.Context, args []string, register func(*framework.Registry, *config.Config), routes func(*web.Server)) int {
	root := Root(register, routes)
	root.SetArgs(args)
	out := &outputWriter{w: root.OutOrStdout()}
	root.SetOut(out)
	err := root.ExecuteContext(ctx)
	if err == nil && out.err != nil {
		// Output that did not reach stdout (a full disk under `kumiko
		// token > token.txt`) is a failure, not an exit code 0.
		err = fmt.Errorf("write output: %w", out.err)
	}
	if err != nil {
		fmt.Fprintln(root.ErrOrStderr(), "kumiko:", err)
		if ctx.Err() != nil && !errors.Is(err, entrypoint.ErrDrainTimeout) {
			// A signal (Ctrl-C, SIGTERM) ended ctx: the error above is
			// its consequence, "context canceled" somewhere. Not so for
			// `kumiko serve`, whose signal is its ordinary stop: a drain
			// that timed out says above what it cut off.
			fmt.Fprintln(root.ErrOrStderr(), "kumiko: interrupted: the command stopped before it finished (what it had committed stays)")
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			fmt.Fprintln(root.ErrOrStderr(), "kumiko: the database lacks Kumiko's tables: is it migrated? run kumiko migrate")
		}
		if ee, ok := errors.AsType[*exitError](err); ok {
			return ee.code
		}
		return 1
	}
	return 0
}

// outputWriter passes writes to w and keeps the first write error: the
// commands print with fmt.Fprint*, whose errors they do not check.
type outputWriter struct {
	w   io.Writer
	err error
}

// Write writes p to w, recording its error.
func (o *outputWriter) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if err != nil && o.err == nil {
		o.err = err
	}
	return n, err
}

// Root builds the command tree; routes (nil for none) are the application's
// own HTTP routes, mounted by `kumiko serve`.
func Root(register func(*framework.Registry, *config.Config), routes func(*web.Server)) *cobra.Command {
	root := &cobra.Command{
		Use:           "kumiko",
		Short:         "Kumiko: event-sourced application framework",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(register, routes), migrateCmd(), tokenCmd(),
		consumerCmd(register), eventsCmd(register), projectionCmd(register), jobsCmd(register))
	// cobra adds its completion group only when it executes: add it now,
	// so that it refuses an unknown shell like the other groups.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.HasSubCommands() && !c.Runnable() {
			refuseUnknownVerbs(c)
		}
	}
	refuseUnknownTopics(root)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return refuseBlankSelectors(cmd) }
	return root
}

// blankRefusedAnnotation marks a flag whose default, when it is left out,
// widens what a command acts on or reads (the shared row, every state,
// lane or tenant): given explicitly but blank, as an unset variable in a
// script gives it (`--instance "$POD"`), it is refused instead of falling
// back to that default.
const blankRefusedAnnotation = "kumiko-blank-refused"

// refuseBlank marks the flags names of fs (see blankRefusedAnnotation).
func refuseBlank(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		if err := fs.SetAnnotation(name, blankRefusedAnnotation, []string{"true"}); err != nil {
			panic(fmt.Sprintf("cli: %v", err)) // a flag name this package misspelt
		}
	}
}

// refuseBlankSelectors fails when a flag marked by refuseBlank was given
// blank.
func refuseBlankSelectors(cmd *cobra.Command) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if _, marked := f.Annotations[blankRefusedAnnotation]; marked && err == nil && strings.TrimSpace(f.Value.String()) == "" {
			err = fmt.Errorf("--%s is empty; leave it out for its default", f.Name)
		}
	})
	return err
}

// refuseUnknownTopics makes `kumiko help TOPIC` fail on a topic the tree
// does not have (`kumiko help consumr`): cobra's help command says
// "Unknown help topic" and exits 0. Known topics show their help as
// before.
func refuseUnknownTopics(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	for _, h := range root.Commands() {
		if h.Name() != "help" || h.Run == nil {
			continue
		}
		show := h.Run
		h.Run = nil
		h.RunE = func(cmd *cobra.Command, args []string) error {
			found, rest, err := cmd.Root().Find(args)
			if err == nil && len(rest) == 0 {
				show(cmd, args)
				return nil
			}
			msg := fmt.Sprintf("unknown help topic %q", strings.Join(args, " "))
			if found != nil && len(rest) > 0 {
				msg += didYouMean(found, rest[0])
			}
			return errors.New(msg)
		}
	}
}

// didYouMean returns " (did you mean a or b?)" with the subcommands of
// cmd whose names are close to word, or "" when none is.
func didYouMean(cmd *cobra.Command, word string) string {
	s := cmd.SuggestionsFor(word)
	if len(s) == 0 {
		return ""
	}
	return " (did you mean " + strings.Join(s, " or ") + "?)"
}

// refuseUnknownVerbs makes a command group (`kumiko jobs`) fail on a verb
// it does not have. Cobra answers a group without a run function of its
// own with its help and exit code 0 whatever follows it, so a mistyped
// verb in a script (`kumiko jobs retyr ID`) looked like success. Alone, or
// followed by help, the group still shows its help.
func refuseUnknownVerbs(group *cobra.Command) {
	group.Args = cobra.ArbitraryArgs
	group.SuggestionsMinimumDistance = 2 // cobra's default for the root
	group.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 || args[0] == "help" {
			return cmd.Help()
		}
		return fmt.Errorf("unknown command %q for %q%s", args[0], cmd.CommandPath(), didYouMean(cmd, args[0]))
	}
}

// logger returns the JSON logger at level.
func logger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

func serveCmd(register func(*framework.Registry, *config.Config), routes func(*web.Server)) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the process selected by APP_MODE (api, worker, all-in-one)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load()
			if err != nil {
				return fmt.Errorf("configuration:\n%w", err)
			}
			log := logger(cmd.ErrOrStderr(), cfg.LogLevel)
			redis.SetLogger(redisLogger{log: log})
			app, err := entrypoint.New(cmd.Context(), entrypoint.Options{Config: cfg, Register: withConfig(register, cfg), Logger: log, Routes: routes})
			if err != nil {
				return err
			}
			return app.Run(cmd.Context())
		},
	}
}

// withConfig binds register to cfg (nil stays nil).
func withConfig(register func(*framework.Registry, *config.Config), cfg *config.Config) func(*framework.Registry) {
	if register == nil {
		return nil
	}
	return func(r *framework.Registry) { register(r, cfg) }
}

// toolPool opens the primary pool for a maintenance command.
func toolPool(ctx context.Context) (*pgxpool.Pool, *config.Config, error) {
	cfg, err := config.LoadForTool()
	if err != nil {
		return nil, nil, fmt.Errorf("configuration:\n%w", err)
	}
	pc, err := cfg.PoolConfig()
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, err
	}
	return pool, cfg, nil
}

// createDatabaseIfMissing creates DATABASE_URL's database when the server
// answers that it does not exist, so that `make run` works on a fresh
// server. Another process creating it at the same time is no error.
func createDatabaseIfMissing(ctx context.Context, pool *pgxpool.Pool) error {
	err := pool.Ping(ctx)
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return err
	}
	cc := pool.Config().ConnConfig.Copy()
	name := cc.Database
	cc.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	// Concurrent creators: the loser gets duplicate_database, or a unique
	// violation of pg_database's name index when both passed the check.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505" && pgErr.ConstraintName == "pg_database_datname_index") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// ExitPending is the exit code of `kumiko migrate status --check` while a
// migration is pending; 1 stays the code of every error (the database
// unreachable, bad configuration), so a deploy script tells "migrate
// first" from "the check failed".
const ExitPending = 2

// exitError is an error that ends the process with code rather than 1.
type exitError struct {
	code int
	err  error
}

// Error returns the underlying error's message.
func (e *exitError) Error() string { return e.err.Error() }

// Unwrap returns the underlying error.
func (e *exitError) Unwrap() error { return e.err }

// migrationJSON is one migration in `kumiko migrate status --json`, as GET
// /api/admin/migrations answers it.
type migrationJSON struct {
	Version int64  `json:"version"`
	Name    string `json:"name"`
	State   string `json:"state"`
}

// migrateStatusJSON is `kumiko migrate status --json`'s output: GET
// /api/admin/migrations's answer, with the versions the database holds that
// the binary does not know.
type migrateStatusJSON struct {
	Migrations []migrationJSON `json:"migrations"`
	Pending    int             `json:"pending"`
	Unknown    []int64         `json:"unknown"`
}

func migrateCmd() *cobra.Command {
	var asJSON, check bool
	cmd := &cobra.Command{
		Use:   "migrate [up|status [--json] [--check]]",
		Short: "Apply pending migrations (default) or list their status",
		Long: "Apply pending migrations (default) or list their status.\n\n" +
			"status only reads. With --json it prints {migrations: [{version, name, state}], pending, unknown};\n" +
			"with --check it exits " + strconv.Itoa(ExitPending) + " while a migration is pending (1 on errors, 0 when all are applied).",
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{"up", "status"},
		RunE: func(cmd *cobra.Command, args []string) error {
			verb := "up"
			if len(args) == 1 {
				verb = args[0]
			}
			if verb != "up" && verb != "status" {
				return fmt.Errorf("unknown migrate verb %q (want up or status)", verb)
			}
			if verb != "status" && (asJSON || check) {
				// `kumiko migrate --check` would otherwise apply what it
				// was asked to check.
				return errors.New("--json and --check apply to kumiko migrate status only")
			}
			pool, cfg, err := toolPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if verb == "status" {
				return migrateStatus(cmd, pool, asJSON, check)
			}
			if err := createDatabaseIfMissing(cmd.Context(), pool); err != nil {
				return err
			}
			// The log says when it waits for another migrator's lock.
			n, err := migrate.Up(cmd.Context(), pool, nil, logger(cmd.ErrOrStderr(), cfg.LogLevel))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %d migration(s)\n", n)
			warnUnknownMigrations(cmd, pool)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "status: print JSON")
	cmd.Flags().BoolVar(&check, "check", false, "status: exit "+strconv.Itoa(ExitPending)+" while a migration is pending")
	return cmd
}

// migrateStatus is `kumiko migrate status`: it lists the migrations (a
// line each, or JSON), warns on stderr of a newer release's migrations
// and of an event log ahead of the server, and with check fails with
// [ExitPending] while one is pending.
func migrateStatus(cmd *cobra.Command, pool *pgxpool.Pool, asJSON, check bool) error {
	sts, err := migrate.List(cmd.Context(), pool, nil)
	if err != nil {
		return err
	}
	out := migrateStatusJSON{Migrations: make([]migrationJSON, 0, len(sts))}
	for _, s := range sts {
		state := "pending"
		if s.Applied {
			state = "applied"
		} else {
			out.Pending++
		}
		out.Migrations = append(out.Migrations, migrationJSON{Version: s.Version, Name: s.Name, State: state})
	}
	unknown, err := migrate.Unknown(cmd.Context(), pool, nil)
	if err != nil {
		// No failure: what was asked for is listed.
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
	}
	out.Unknown = append([]int64{}, unknown...)
	if asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ") // as consumer list --json
		if err := enc.Encode(out); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	} else {
		for _, m := range out.Migrations {
			fmt.Fprintf(cmd.OutOrStdout(), "%-8s %s\n", m.State, m.Name)
		}
	}
	warnUnknown(cmd, unknown)
	// A dump restored into a new cluster migrates fine but delivers
	// nothing: say so where the operator looks after a restore, without
	// failing the status.
	var ahead *eventstore.CommitKeyAheadError
	if err := eventstore.CheckCommitKeys(cmd.Context(), pool); errors.As(err, &ahead) {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
	}
	if check && out.Pending > 0 {
		return &exitError{code: ExitPending, err: fmt.Errorf("%d migration(s) pending: run kumiko migrate", out.Pending)}
	}
	return nil
}

// warnUnknownMigrations says on stderr which migrations the database holds
// that the binary does not know: a newer release migrated it (a binary
// rolled back), which goose's reports do not show. It is no failure: the
// binary's own migrations are applied, and additive migrations leave the
// older code working. Nor is a failure of the check: what the command was
// asked for is done.
func warnUnknownMigrations(cmd *cobra.Command, pool *pgxpool.Pool) {
	unknown, err := migrate.Unknown(cmd.Context(), pool, nil)
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
		return
	}
	warnUnknown(cmd, unknown)
}

// warnUnknown says on stderr that the database holds the unknown
// versions (see warnUnknownMigrations); nothing when there are none.
func warnUnknown(cmd *cobra.Command, unknown []int64) {
	if len(unknown) == 0 {
		return
	}
	vs := make([]string, len(unknown))
	for i, v := range unknown {
		vs[i] = strconv.FormatInt(v, 10)
	}
	what := "version " + vs[0]
	if len(vs) > 1 {
		what = "versions " + strings.Join(vs, ", ")
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "warning: the database holds migrations this binary does not know (%s): "+
		"a newer release applied them; this binary's own migrations are applied, and it runs on that schema only if they were additive\n", what)
}

func tokenCmd() *cobra.Command {
	var tenant, user, roles string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "token --tenant T --user U [--roles r1,r2] [--ttl 24h]",
		Short: "Print a development JWT signed with JWT_SECRET",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant == "" || user == "" {
				return errors.New("--tenant and --user are required")
			}
			for _, f := range [...]struct{ flag, v string }{{"--tenant", tenant}, {"--user", user}} {
				if strings.TrimSpace(f.v) != f.v {
					// " acme" is another tenant than "acme": a token for it
					// would see none of acme's data.
					return fmt.Errorf("%s %q is blank or starts or ends with white space", f.flag, f.v)
				}
			}
			if ttl <= 0 {
				// auth.Mint reads a non-positive lifetime as its default
				// (an hour): never hand out a live token for an expired one.
				return fmt.Errorf("--ttl must be positive, not %s", ttl)
			}
			ck, err := config.LoadJWTKeys()
			if err != nil {
				return fmt.Errorf("configuration:\n%w", err)
			}
			keys := make([]auth.Key, len(ck))
			for i, k := range ck {
				keys[i] = auth.Key{ID: k.ID, Secret: k.Secret}
			}
			ring, err := auth.NewKeyring(keys)
			if err != nil {
				return err
			}
			var rs []string
			for _, r := range strings.Split(roles, ",") {
				if r = strings.TrimSpace(r); r != "" {
					rs = append(rs, r)
				}
			}
			tok, err := ring.Mint(auth.Principal{UserID: user, TenantID: tenant, Roles: rs}, ttl)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
	cmd.Flags().StringVar(&user, "user", "", "user id (required)")
	cmd.Flags().StringVar(&roles, "roles", "", "comma-separated roles")
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "token lifetime")
	return cmd
}

// oneName accepts exactly one argument, which must not be blank: an unset
// variable in a script (`kumiko consumer status "$NAME"`) gets a clear
// error instead of a lookup of "".
func oneName(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(1)(cmd, args); err != nil {
			return err
		}
		if strings.TrimSpace(args[0]) == "" {
			return fmt.Errorf("%s must not be empty", what)
		}
		return nil
	}
}
