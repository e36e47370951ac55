package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The raw tables are partitioned by UTC day on their time column
// (0001_init.sql): a partition <table>_pYYYYMMDD holds [day, day+24h).
// A batch's transaction needs the partitions of the days its rows start
// in; ensureDays makes those missing before the transaction begins, in a
// transaction of its own under partLock, so replicas making the same day
// at once wait for each other instead of failing. Maintain makes today's
// and tomorrow's ahead (so that ingest seldom makes one) and drops the
// days past the retention.

// rawTables are the partitioned tables, each with its retention: raw
// records at Options.RawRetention, applied batch keys at the longer of it
// and Options.DedupRetention.
var rawTables = []string{"run_windows", "run_events", "node_windows", "raw_samples", "node_losses", "applied_batches"}

// partLock is the advisory lock key under which partitions are made and
// dropped.
const partLock = 0x74726d7061727473 // "trmparts"

const day = int64(24 * time.Hour)

// dayOf is the start of the UTC day holding t (Unix ns).
func dayOf(t int64) int64 {
	d := t / day * day
	if d > t {
		d -= day
	}
	return d
}

func partName(table string, d int64) string {
	return table + "_p" + time.Unix(0, d).UTC().Format("20060102")
}

// ensureDays makes the partitions of the days in ds that this process
// has not seen made.
func (s *Store) ensureDays(ds map[int64]bool) error {
	var need []int64
	for d := range ds {
		if _, ok := s.days.Load(d); !ok {
			need = append(need, d)
		}
	}
	if len(need) == 0 {
		return nil
	}
	err := s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error { return makeDays(context.Background(), tx, need) })
	if err != nil {
		return err
	}
	for _, d := range need {
		s.days.Store(d, true)
	}
	return nil
}

// makeDays makes the partitions of the days ds (day starts, Unix ns) that
// do not exist, in tx, holding partLock until tx ends.
func makeDays(ctx context.Context, tx pgx.Tx, ds []int64) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(partLock)); err != nil {
		return err
	}
	for _, d := range ds {
		for _, t := range rawTables {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM (%d) TO (%d)`,
				partName(t, d), t, d, d+day)); err != nil {
				return fmt.Errorf("make partition %s: %w", partName(t, d), err)
			}
		}
	}
	return nil
}

// noPartition reports an insert into a day with no partition: one dropped
// since this process made it.
func noPartition(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23514" && strings.Contains(pe.Message, "no partition")
}

// Maintain makes today's and tomorrow's partitions and, with a raw
// retention, rolls up what ingest left to the roll-up (RollUp, waiting for
// the node rows) and drops the day partitions wholly older than it (applied batch
// keys: older than the dedup retention too), moving raw_horizon past the
// raw days dropped in the same transaction. Run aggregates, rollups and
// deleted runs' windows are kept. It is idempotent and safe on several
// replicas at once (partLock); one replica (the leader) calling it every
// few minutes is enough.
func (s *Store) Maintain(ctx context.Context) error {
	now := s.clk.Now().UnixNano()
	today := dayOf(now)
	s.days.Clear()
	if err := s.ensureDays(map[int64]bool{today: true, today + day: true}); err != nil {
		return fmt.Errorf("pgstore: maintain: %w", err)
	}
	if s.rawTTL <= 0 {
		return nil
	}
	// What is dropped is in the rollups first.
	if err := s.RollUp(ctx, time.Unix(0, now).Add(-rollEvery), true); err != nil {
		return fmt.Errorf("pgstore: maintain: %w", err)
	}
	rawCut := dayOf(now - int64(s.rawTTL)) // days before it are wholly older
	dedupCut := min(rawCut, dayOf(now-int64(s.dedupTTL)))
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(partLock)); err != nil {
			return err
		}
		dropped := false
		for _, t := range rawTables {
			cut := rawCut
			if t == "applied_batches" {
				cut = dedupCut
			}
			rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
				WHERE i.inhparent = $1::regclass AND c.relname < $2 ORDER BY 1`, t, partName(t, cut))
			if err != nil {
				return err
			}
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			for _, n := range names {
				if _, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{n}.Sanitize()); err != nil {
					return err
				}
				dropped = dropped || t != "applied_batches"
			}
		}
		if !dropped {
			return nil
		}
		_, err := tx.Exec(ctx, `UPDATE raw_horizon SET from_ns = greatest(from_ns, $1)`, rawCut)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: maintain: %w", err)
	}
	return nil
}

// rawFrom is where the raw tables begin (raw_horizon): what starts before
// it is read from the rollups. Readers lock the raw tables first
// (lockRaw), so no drop moves it under them.
func rawFrom(tx pgx.Tx) (int64, error) {
	var from int64
	err := tx.QueryRow(context.Background(), `SELECT from_ns FROM raw_horizon`).Scan(&from)
	return from, err
}

// lockRaw holds the raw tables (and their partitions) against drops for
// the rest of the transaction.
func lockRaw(tx pgx.Tx) error {
	_, err := tx.Exec(context.Background(), "LOCK TABLE "+strings.Join(rawTables, ", ")+" IN ACCESS SHARE MODE")
	return err
}

// Maintainer calls Store.Maintain every Interval (0: every 10 minutes),
// and once at Start: a lifecycle component.
type Maintainer struct {
	Store    *Store
	Interval time.Duration
	loop     every
}

// Start makes the partitions ahead and drops those past the retention,
// then keeps doing so in the background.
func (m *Maintainer) Start(ctx context.Context) error {
	if err := m.Store.Maintain(ctx); err != nil {
		return err
	}
	m.loop.start(m.Store, cmp.Or(m.Interval, 10*time.Minute), "maintenance", m.Store.Maintain)
	return nil
}

// Shutdown stops the loop.
func (m *Maintainer) Shutdown(ctx context.Context) error { return m.loop.shutdown(ctx) }

// every calls fn every interval of the store's clock, from start until
// shutdown (the Maintainer's and the Roller's loop); a failure is logged
// and the next interval tries again.
type every struct {
	done   chan struct{}
	cancel context.CancelFunc
}

func (e *every) start(s *Store, interval time.Duration, what string, fn func(context.Context) error) {
	var ctx context.Context
	ctx, e.cancel = context.WithCancel(context.Background())
	e.done = make(chan struct{})
	go func() {
		defer close(e.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.clk.After(interval):
			}
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("pgstore: "+what+" failed; retrying next interval", "err", err)
			}
		}
	}()
}

// shutdown stops the loop, waiting for a call under way.
func (e *every) shutdown(ctx context.Context) error {
	if e.cancel == nil {
		return nil
	}
	e.cancel()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
