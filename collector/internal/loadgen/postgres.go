package loadgen

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Connect opens one connection to the database at url, which may hold
// the collectors' pool parameters (pool_max_conns…: not sent to the server).
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg.ConnConfig)
}

// EmptyDB drops every table (and, with them, the views and partitions on
// them) in the current schema of the database at url, so that the
// collectors started next migrate a fresh schema: each load point starts
// from empty tables. Extensions and other schemas are left alone.
func EmptyDB(ctx context.Context, url string) error {
	c, err := Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return err
	}
	ids := make([]string, len(names))
	for i, n := range names {
		ids[i] = pgx.Identifier{n}.Sanitize()
	}
	_, err = c.Exec(ctx, "DROP TABLE IF EXISTS "+strings.Join(ids, ", ")+" CASCADE")
	return err
}

// PostmasterPID finds the process id of the PostgreSQL server at url on
// this machine: the parent of a backend serving a connection. It fails when
// the server runs elsewhere (its CPU time cannot be read from here).
func PostmasterPID(ctx context.Context, url string) (int, error) {
	c, err := Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var backend int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, err
	}
	st, err := procStat(backend)
	if err != nil {
		return 0, fmt.Errorf("backend %d is not a process on this machine (%v): the database's CPU time needs it here", backend, err)
	}
	return st.ppid, nil
}
