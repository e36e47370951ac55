package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// DeleteRun implements storage.Store: in one transaction, holding the
// run's row, the aggregate goes, the windows become the deleted run's and
// the events go.
func (s *Store) DeleteRun(id string) (int, error) { return s.deleteRun(id, false) }

// DeleteLiveRun implements storage.Store: DeleteRun, and a tombstone
// (fold.DeletedNS) in the same transaction.
func (s *Store) DeleteLiveRun(id string) (int, error) { return s.deleteRun(id, true) }

func (s *Store) deleteRun(id string, live bool) (records int, err error) {
	err = s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error {
		ctx := context.Background()
		if err := lockRunNodes(tx, id); err != nil {
			return err
		}
		v, err := lockRuns(tx, []string{id}, true)
		if err != nil {
			return err
		}
		st := v.state[id]
		d, err := fold.NewDeletion(st)
		if err != nil {
			return err
		}
		if live {
			d.At = s.clk.Now().UnixNano()
			if err := putRecord(tx, fold.DeletedNS, id, d.Tombstone()); err != nil {
				return err
			}
		}
		if err := lockRaw(tx); err != nil {
			return err
		}
		from, err := rawFrom(tx)
		if err != nil {
			return err
		}
		// The raw windows from the horizon on and the minute rollups
		// before it become the deleted run's (rollups as seq -1).
		rows, err := tx.Query(ctx, `SELECT node, start_ns, seq, i, w FROM run_windows WHERE run_id = $1 AND start_ns >= $2
			UNION ALL SELECT node, start_ns, -1, row_number() OVER (ORDER BY node, start_ns, lock)::int, w FROM run_rollups WHERE run_id = $1 AND start_ns < $2`, id, from)
		if err != nil {
			return err
		}
		var q pgx.Batch
		var node string
		var start, seq int64
		var i int32
		var val []byte
		if _, err := pgx.ForEachRow(rows, []any{&node, &start, &seq, &i, &val}, func() error {
			w := &trainmeterv1.RunWindow{}
			if err := proto.Unmarshal(val, w); err != nil {
				return err
			}
			dv, err := fold.DeletedRecord(w, d)
			q.Queue(`INSERT INTO deleted_windows (node, start_ns, seq, i, deletion, d) VALUES ($1, $2, $3, $4, $5, $6)`,
				node, start, seq, i, int64(d.ID), dv)
			return err
		}); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM run_windows WHERE run_id = $1`, id)
		if err != nil {
			return err
		}
		records = int(tag.RowsAffected())
		q.Queue(`DELETE FROM run_rollups WHERE run_id = $1`, id)
		queueRunDeleted(&q, id, d)
		q.Queue(`DELETE FROM runs WHERE run_id = $1`, id)
		q.Queue(`DELETE FROM live_runs WHERE run_id = $1`, id)
		if err := tx.SendBatch(ctx, &q).Close(); err != nil {
			return err
		}
		tag, err = tx.Exec(ctx, `DELETE FROM run_events WHERE run_id = $1`, id)
		if err != nil {
			return err
		}
		records += int(tag.RowsAffected())
		if st == nil && records == 0 {
			return storage.ErrNotFound
		}
		return nil
	})
	return records, err
}

// lockRunNodes locks the rows of the nodes that hold the run's raw windows
// or rollups, in node order and before the run's row, as ingest locks
// them: the roll-up (rollbehind.go) holds a node's row while it reads and
// adds the node's records, so it never sees them half moved or repriced.
// A node that sends the run's first windows meanwhile waits for the run's
// row, and its windows are stored after this transaction.
func lockRunNodes(tx pgx.Tx, id string) error {
	_, err := tx.Exec(context.Background(), `SELECT node FROM nodes WHERE node IN (SELECT node FROM run_windows WHERE run_id = $1
		UNION SELECT node FROM run_rollups WHERE run_id = $1) ORDER BY node FOR UPDATE`, id)
	return err
}

// errNothing rolls back a reprice that found no window to reprice.
var errNothing = errors.New("nothing to reprice")

// Reprice implements storage.Store, in one transaction holding the run's
// row.
func (s *Store) Reprice(id string, since time.Time, usdPerHour float64, reason string, report func(*aggregate.State) *trainmeterv1.RunReport) (before, after *trainmeterv1.RunReport, ch aggregate.Repricing, err error) {
	err = s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error {
		ctx := context.Background()
		ch = aggregate.Repricing{At: s.clk.Now().UnixNano(), USDPerGPUHour: usdPerHour, Reason: reason, Whole: since.IsZero()}
		if err := lockRunNodes(tx, id); err != nil {
			return err
		}
		runs, err := s.runs(tx, `SELECT run_id, state FROM runs WHERE run_id = $1 AND state IS NOT NULL FOR UPDATE`, id)
		if err != nil {
			return err
		}
		if len(runs) == 0 {
			return storage.ErrNotFound
		}
		st := runs[0]
		if err := lockRaw(tx); err != nil {
			return err
		}
		from, err := rawFrom(tx)
		if err != nil {
			return err
		}
		// The raw windows from the horizon on, and the minute rollups
		// before it (whole minutes: a rollup is repriced when it starts
		// at or after since); the run's rollups and daily usage are made
		// again from both, but for the raw windows not rolled up yet
		// (rollbehind.go), which the roll-up adds as repriced here. The
		// run's row, held, keeps the roll-up off its windows meanwhile.
		rows, err := tx.Query(ctx, `SELECT w.node, w.start_ns, w.seq, w.i, w.w, w.start_ns < COALESCE(n.rolled_ns, -9223372036854775808)
			FROM run_windows w LEFT JOIN nodes n ON n.node = w.node WHERE w.run_id = $1 AND w.start_ns >= $2
			UNION ALL SELECT node, start_ns, -1, 0, w, true FROM run_rollups WHERE run_id = $1 AND start_ns < $2
			ORDER BY 1, 2, 3, 4`, id, from)
		if err != nil {
			return err
		}
		var q pgx.Batch
		usage := newRunRollup(id)
		var node string
		var start, seq int64
		var i int32
		var val []byte
		var rolled bool
		type rollKey struct {
			node string
			runRollKey
		}
		roll := map[rollKey]*trainmeterv1.RunWindow{}
		if _, err := pgx.ForEachRow(rows, []any{&node, &start, &seq, &i, &val, &rolled}, func() error {
			w := &trainmeterv1.RunWindow{}
			if err := proto.Unmarshal(val, w); err != nil {
				return err
			}
			repriced := fold.RepriceWindow(w, since, usdPerHour, &ch)
			if rolled {
				k := rollKey{node, runRollKeyOf(w)}
				roll[k] = addRunWindow(roll[k], w)
				usage.window(node, w)
			}
			if !repriced || seq < 0 {
				return nil
			}
			nv, err := proto.Marshal(w)
			q.Queue(`UPDATE run_windows SET w = $6 WHERE run_id = $1 AND node = $2 AND start_ns = $3 AND seq = $4 AND i = $5`,
				id, node, start, seq, i, nv)
			return err
		}); err != nil {
			return err
		}
		q.Queue(`DELETE FROM run_rollups WHERE run_id = $1`, id)
		for k, w := range roll {
			v, err := proto.Marshal(w)
			if err != nil {
				return err
			}
			q.Queue(`INSERT INTO run_rollups (node, run_id, start_ns, lock, w) VALUES ($1, $2, $3, $4, $5)`, k.node, id, k.start, []byte(k.lock), v)
		}
		if !ch.Whole && ch.GPUSeconds == 0 {
			return errNothing
		}
		before = report(st)
		st.Reprice(before, ch)
		after = report(st)
		if err := queueRun(&q, st, after); err != nil {
			return err
		}
		usage.queue(&q)
		return tx.SendBatch(ctx, &q).Close()
	})
	if errors.Is(err, errNothing) {
		return nil, nil, ch, nil
	}
	if err != nil {
		return nil, nil, ch, err
	}
	return before, after, ch, nil
}

// PutRecord implements storage.Records (as do the methods below).
func (s *Store) PutRecord(ns, k string, v []byte) error {
	return putRecord(s.pool, ns, k, v)
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func putRecord(q execer, ns, k string, v []byte) error {
	_, err := q.Exec(context.Background(), `INSERT INTO records (ns, k, v) VALUES ($1, $2, $3) ON CONFLICT (ns, k) DO UPDATE SET v = EXCLUDED.v`, ns, []byte(k), v)
	return err
}

func (s *Store) PutRecords(ns string, kv map[string][]byte) error {
	return s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error {
		for k, v := range kv {
			if err := putRecord(tx, ns, k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// PutRecordIfAbsent: the primary key picks the one winner.
func (s *Store) PutRecordIfAbsent(ns, k string, v []byte) (bool, error) {
	tag, err := s.pool.Exec(context.Background(), `INSERT INTO records (ns, k, v) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, ns, []byte(k), v)
	return err == nil && tag.RowsAffected() == 1, err
}

func (s *Store) GetRecord(ns, k string) ([]byte, error) {
	var v []byte
	err := s.pool.QueryRow(context.Background(), `SELECT v FROM records WHERE ns = $1 AND k = $2`, ns, []byte(k)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, storage.ErrNotFound
	}
	return v, err
}

func (s *Store) DeleteRecord(ns, k string) error {
	_, err := s.pool.Exec(context.Background(), `DELETE FROM records WHERE ns = $1 AND k = $2`, ns, []byte(k))
	return err
}

func (s *Store) ScanRecords(ns, keyPrefix string, fn func(k string, v []byte) (bool, error)) error {
	rows, err := s.pool.Query(context.Background(), `SELECT k, v FROM records WHERE ns = $1 AND k >= $2 AND substr(k, 1, length($2)) = $2 ORDER BY k`, ns, []byte(keyPrefix))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&k, &v); err != nil {
			return err
		}
		more, err := fn(string(k), v)
		if err != nil || !more {
			return err
		}
	}
	return rows.Err()
}
