package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
)

// SelectRuns implements storage.Runs from the runs table's report columns
// (ended, start_ns, end_ns, total_cost_usd, model: the run's report at its
// last write, with the pricing SetPricer set), not the aggregates.
func (s *Store) SelectRuns(f storage.RunFilter) ([]string, error) {
	sql := `SELECT run_id FROM runs WHERE state IS NOT NULL`
	var args []any
	if f.LiveOnly {
		sql += ` AND NOT ended`
	}
	if f.EndedOnly {
		sql += ` AND ended`
	}
	if !f.ActiveSince.IsZero() {
		args = append(args, f.ActiveSince.UnixNano())
		sql += fmt.Sprintf(` AND (NOT ended OR end_ns >= $%d)`, len(args))
	}
	if f.Model != "" {
		args = append(args, f.Model)
		sql += fmt.Sprintf(` AND model = $%d`, len(args))
	}
	switch {
	case f.ByCost:
		sql += ` ORDER BY total_cost_usd DESC NULLS LAST, run_id`
	case f.ByStart:
		sql += ` ORDER BY start_ns DESC NULLS LAST, run_id`
	default:
		sql += ` ORDER BY run_id`
	}
	rows, err := s.pool.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
