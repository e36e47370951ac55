package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"

	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/collector/internal/collectorconfig"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/store"
)

func newMigrateCommand() *cobra.Command {
	var from, to, passwordFile, configFile string
	c := &cobra.Command{
		Use:   "migrate --from DIR --to postgres://…",
		Short: "Move a collector's data directory (BadgerDB) into an empty PostgreSQL database",
		Long: `Move a collector's data directory (--data, BadgerDB) into an empty PostgreSQL
database (--to, as serve --store takes it): every run's aggregate, the nodes'
status, the raw records still within their retention, deleted runs' usage,
the keys of the batches applied (an agent resending one gets it deduplicated)
and the collector's records (budgets, alerts, price and advice history), in one
transaction: all of it or nothing. Stop the collector on DIR first. A database
holding any data is refused. The runs' report columns the SQL views read, and
deleted runs' daily usage, are priced at the collector's pricing: give its
--config (serve's defaults without one). Docs: docs/deploy.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return migrate(cmd.Context(), from, to, passwordFile, configFile, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := c.Flags()
	f.StringVar(&from, "from", "", "the collector's data directory (its --data)")
	f.StringVar(&to, "to", "", "the PostgreSQL database, postgres://USER@HOST/DB?sslmode=… (as serve --store takes it)")
	f.StringVar(&passwordFile, "store-password-file", "", "a file holding the database password (one line), which --to then leaves out (as serve's)")
	f.StringVar(&configFile, "config", "", "the collector's collector.yaml (serve's --config): its pricing prices the runs' report columns")
	_ = c.MarkFlagRequired("from")
	_ = c.MarkFlagRequired("to")
	return c
}

// migrate moves the BadgerDB store in from into the PostgreSQL database
// at to, at the pricing of the collector configuration in configFile
// (none: serve's defaults), saying on errw what it copies and on out what
// it moved.
func migrate(ctx context.Context, from, to, passwordFile, configFile string, out, errw io.Writer) error {
	// store.Open would make a store of a missing or empty directory.
	entries, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("migrate: --from %s: %w", from, unwrapPath(err))
	}
	if len(entries) == 0 {
		return fmt.Errorf("migrate: --from %s is empty: not a collector's data directory", from)
	}
	if u, err := url.Parse(to); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("migrate: --to %s: a PostgreSQL URL, postgres://…", pgstore.Redact(to))
	}
	cfg := collectorconfig.Default()
	if configFile != "" {
		if err := collectorconfig.Load(configFile, &cfg); err != nil {
			return fmt.Errorf("migrate: --config: %w", err)
		}
	}
	sc, err := cfg.Check(os.Getenv)
	if err != nil {
		return fmt.Errorf("migrate: --config %s: %w", configFile, err)
	}
	log := slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	src, err := store.Open(from, store.Options{Logger: log})
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("migrate: %s is in use: a collector (trainmeter serve) is running on it; stop it, then migrate (nothing was moved)", from)
	}
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer src.Close()
	dst, err := pgstore.Open(ctx, to, pgstore.Options{Logger: log, PasswordFile: passwordFile})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer dst.Close()
	dst.SetPricer(sc.Pricing())
	fmt.Fprintf(errw, "migrate: copying %s into %s\n", from, pgstore.Redact(to))
	var counts pgstore.Counts
	err = src.Export(func(d storage.Dump) error {
		counts, err = dst.Import(ctx, d, func(c pgstore.Count) { fmt.Fprintf(errw, "migrate: %s\n", c) })
		return err
	})
	if errors.Is(err, pgstore.ErrNotEmpty) {
		return fmt.Errorf("migrate: %s: %w", pgstore.Redact(to), err)
	}
	if err != nil {
		return fmt.Errorf("migrate: nothing was moved: %w", err)
	}
	fmt.Fprintf(out, "moved %s into %s: %s\n", from, pgstore.Redact(to), counts)
	return nil
}
