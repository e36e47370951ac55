package main

import (
	"context"
	"fmt"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
)

// pgPoint is how load points run on PostgreSQL: replicas collectors on the
// database at url, whose server's postmaster is this process id.
type pgPoint struct {
	url                  string
	replicas, statements int
	postmaster           int
}

// resetStatements empties pg_stat_statements (creating the extension if
// missing), so that what printStatements shows is the load point's.
func (p *pgPoint) resetStatements(ctx context.Context) error {
	c, err := loadgen.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return fmt.Errorf("pg_stat_statements (the server must preload it): %w", err)
	}
	_, err = c.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// printStatements prints the statements of most execution time since
// resetStatements, with their calls per applied batch.
func (p *pgPoint) printStatements(ctx context.Context) error {
	c, err := loadgen.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var batches, calls int64
	var total float64
	if err := c.QueryRow(ctx, "SELECT count(*) FROM applied_batches").Scan(&batches); err != nil {
		return err
	}
	const mine = "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
	if err := c.QueryRow(ctx, "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0) "+mine).Scan(&calls, &total); err != nil {
		return err
	}
	fmt.Printf("pg_stat_statements: %d batches applied, %.1f statements per batch, %.0f ms executing (%.2f ms per batch)\n",
		batches, float64(calls)/float64(max(batches, 1)), total, total/float64(max(batches, 1)))
	rows, err := c.Query(ctx, `SELECT calls, total_exec_time, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 110) `+mine+
		` ORDER BY total_exec_time DESC LIMIT $1`, p.statements)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n, r int64
		var ms float64
		var q string
		if err := rows.Scan(&n, &ms, &r, &q); err != nil {
			return err
		}
		fmt.Printf("  %5.1f%% %8.0f ms %6.2f calls/batch %8d rows  %s\n", 100*ms/max(total, 1e-9), ms, float64(n)/float64(max(batches, 1)), r, q)
	}
	return rows.Err()
}
