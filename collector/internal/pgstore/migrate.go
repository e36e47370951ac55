package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The schema is the numbered files of migrations/ (NNNN_name.sql), each
// applied once, in order, in a transaction of its own; schema_version
// holds those applied. One process applies them: the others wait on the
// advisory lock, then find nothing left to do.

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the advisory lock key the migrating process holds.
const migrationLock = 0x74726d6d69677261 // "trmmigra"

type migration struct {
	version int
	sql     string
}

func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []migration
	for i, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil || v != i+1 {
			return nil, fmt.Errorf("pgstore: migration %s is not number %d", base, i+1)
		}
		b, err := migrationFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{v, string(b)})
	}
	return out, nil
}

// migrate brings the database's schema to the newest this binary knows,
// and refuses a database whose schema is newer.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrationLock)); err != nil {
		return fmt.Errorf("pgstore: take the migration lock: %w", err)
	}
	// The lock goes with the session if the unlock fails.
	defer func() { _, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(migrationLock)) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("pgstore: schema_version: %w", err)
	}
	var have int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_version").Scan(&have); err != nil {
		return fmt.Errorf("pgstore: read the schema version: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("pgstore: the database has schema version %d, newer than this trainmeter knows (%d): run a trainmeter at least as new as the one that upgraded it", have, len(ms))
	}
	for _, m := range ms[have:] {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("pgstore: migration %d: %w", m.version, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version) VALUES ($1)", m.version); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("pgstore: migration %d: %w", m.version, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("pgstore: migration %d: %w", m.version, err)
		}
	}
	return nil
}
