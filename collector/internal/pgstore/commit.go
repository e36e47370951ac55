package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Group commit (docs/storage.md, "PostgreSQL"): concurrent
// ApplyBatchResult calls share one transaction. A caller queues its batch
// and waits out the commit window, if any, that the first batch after the
// last window opened; then, when one of maxGroups slots is free and its
// batch is not yet taken, it leads a group: it takes the waiting batches
// (up to maxGroup) and applies them in one transaction, each inside a
// SAVEPOINT of its own, so a batch that fails or is a duplicate rolls back
// alone and gets its own answer while the others commit. Every caller is
// answered after the shared COMMIT: an ack still means committed. One WAL
// flush, BEGIN and COMMIT serve the group. Without a window, groups form
// from the batches that wait while the slots are busy: a lone batch
// commits at once, and groups grow with the load.
//
// Lock order. Every transaction that takes row locks on nodes and runs
// takes node rows before run rows, each in id order: a group locks all its
// batches' node rows (sorted), then all their run rows (sorted), before it
// applies any batch; each batch then locks only rows its transaction
// already holds (a second FOR UPDATE of a held row does not wait).
// PutHello locks one node row, DeleteRun one run row. Two transactions
// thus never wait for each other in a cycle on these rows; the other rows
// a batch writes (raw rows, rollups, usage, live_runs) are keyed by its
// node or one of its runs, held before they are touched. PostgreSQL's
// deadlock and serialization failures are still retried (the whole group).

// maxGroup bounds the batches in one transaction: a failure repeats less
// work, and locks are held no longer than one group's apply.
const maxGroup = 64

// maxGroups bounds the groups one process applies at once (each holds a
// connection of the pool, which readers share; the pool has at least 4).
const maxGroups = 3

type applyReq struct {
	sender storage.Sender
	b      *trainmeterv1.Batch
	a      storage.Applied
	err    error
	taken  bool // by a group (under Store.gmu)
	done   chan struct{}
}

// CommitStats counts the transactions that committed batches since Open,
// the batches they applied (not duplicates, not failed ones), the
// groups applied again after a deadlock or serialization failure, and the
// groups applied again batch by batch after failing as one (group.go),
// and the groups that read rollup rows again that this process had cached
// (rollcache.go: another transaction had written them since).
type CommitStats struct{ Commits, Batches, Retries, Fallbacks, RollupRereads uint64 }

// CommitStats returns the counts so far.
func (s *Store) CommitStats() CommitStats {
	return CommitStats{Commits: s.commits.Load(), Batches: s.committedBatches.Load(), Retries: s.retries.Load(), Fallbacks: s.fallbacks.Load(),
		RollupRereads: s.rollupRereads.Load()}
}

// ApplyBatchResult implements storage.Ingester.
func (s *Store) ApplyBatchResult(sender storage.Sender, b *trainmeterv1.Batch) (storage.Applied, error) {
	r := &applyReq{sender: sender, b: b, done: make(chan struct{})}
	s.gmu.Lock()
	gate, open := s.gate, false
	if gate == nil && s.window > 0 {
		gate, open = make(chan struct{}), true
		s.gate = gate
	}
	s.queue = append(s.queue, r)
	s.gmu.Unlock()
	if open {
		// The first batch of a window waits it out, the batches after it
		// until it ends: then all compete for the slots.
		time.Sleep(s.window)
		s.gmu.Lock()
		s.gate = nil
		s.gmu.Unlock()
		close(gate)
	} else if gate != nil {
		<-gate
	}
	for {
		select {
		case <-r.done:
			return r.a, r.err
		case s.slots <- struct{}{}:
		}
		s.gmu.Lock()
		taken := r.taken
		s.gmu.Unlock()
		if taken {
			// Its group answers it; the slot is for a batch still waiting.
			<-s.slots
			<-r.done
			return r.a, r.err
		}
		s.lead()
		<-s.slots
	}
}

// lead takes the waiting batches (up to maxGroup) as a group, applies and
// commits it, and answers its callers.
func (s *Store) lead() {
	s.gmu.Lock()
	n := min(len(s.queue), maxGroup)
	group := slices.Clone(s.queue[:n])
	s.queue = slices.Delete(s.queue, 0, n)
	for _, r := range group {
		r.taken = true
	}
	s.gmu.Unlock()
	if len(group) == 0 {
		return
	}
	s.commitGroup(group)
	for _, r := range group {
		if errors.Is(r.err, errDuplicate) {
			r.a, r.err = storage.Applied{Duplicate: true}, nil
		} else if r.err != nil {
			r.a, r.err = storage.Applied{}, fmt.Errorf("pgstore: apply batch %s/%s/%d: %w", r.sender.Node, r.sender.Boot, r.b.GetSeq(), r.err)
		}
		close(r.done)
	}
}

// retryable: PostgreSQL resolved a deadlock or a serialization conflict
// by failing this transaction.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// commitGroup applies group in one transaction, again on a retryable
// failure; a day partition dropped since this process made it is made
// again once (its rows are past the retention; Maintain drops it again).
func (s *Store) commitGroup(group []*applyReq) { s.commitGroupWith(group, true) }

// commitGroupWith is commitGroup, the group applied as one (group.go)
// when asOne, else batch by batch; a failure of the former applies the
// group again by the latter.
func (s *Store) commitGroupWith(group []*applyReq, asOne bool) {
	days := map[int64]bool{}
	for _, r := range group {
		for d := range batchDays(r.b) {
			days[d] = true
		}
	}
	remade := false
	for attempt := 0; ; attempt++ {
		var fresh groupCache
		err := s.ensureDays(days)
		if err == nil {
			err = pgx.BeginTxFunc(context.Background(), s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
				if asOne {
					return s.applyGroupAsOne(tx, group, &fresh)
				}
				return s.applyGroup(tx, group)
			})
		}
		if attempt < maxRetries && retryable(err) {
			s.retries.Add(1)
			continue
		}
		if noPartition(err) && !remade {
			remade = true
			s.days.Clear()
			continue
		}
		if err != nil && asOne {
			// Batch by batch, each with its own outcome.
			asOne = false
			s.fallbacks.Add(1)
			continue
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && len(group) > 1 {
			// A statement failed: halves, down to the batch that fails
			// alone, so that each caller gets its own answer (one batch's
			// rows can fail the group's locking statements). Other errors
			// (the database unreachable) are every batch's.
			h := len(group) / 2
			s.commitGroupWith(group[:h], false)
			s.commitGroupWith(group[h:], false)
			return
		}
		if err != nil {
			for _, r := range group {
				r.err = err
			}
			return
		}
		s.commits.Add(1)
		s.rcache.put(fresh.rolls)
		s.scache.put(fresh.states)
		for _, r := range group {
			if r.err == nil {
				s.committedBatches.Add(1)
			}
		}
		return
	}
}

// applyGroup locks the group's node rows, then its run rows (see Lock
// order above), and applies each batch under a savepoint. An error that
// spoils the whole transaction (retryable, a missing partition, a lost
// connection: the rollback to the savepoint fails) fails the group.
func (s *Store) applyGroup(tx pgx.Tx, group []*applyReq) error {
	ctx := context.Background()
	var nodes, runs []string
	for _, r := range group {
		r.a, r.err = storage.Applied{}, nil
		nodes = append(nodes, r.sender.Node)
		runs = append(runs, fold.BatchRuns(r.b)...)
	}
	nodes, runs = sortedSet(nodes), sortedSet(runs)
	empties, err := emptyNodeStatuses(nodes)
	if err != nil {
		return err
	}
	var q pgx.Batch
	q.Queue(`INSERT INTO nodes (node, status) SELECT * FROM unnest($1::text[], $2::bytea[]) ORDER BY 1 ON CONFLICT DO NOTHING`, nodes, empties)
	q.Queue(`SELECT node FROM nodes WHERE node = ANY($1) ORDER BY node FOR UPDATE`, nodes)
	if len(runs) > 0 {
		q.Queue(`INSERT INTO runs (run_id) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT DO NOTHING`, runs)
		q.Queue(`SELECT run_id FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE`, runs)
	}
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return err
	}
	for _, r := range group {
		err := s.apply(tx, r.sender, r.b, &r.a)
		if err == nil {
			continue
		}
		if retryable(err) || noPartition(err) {
			return err
		}
		if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT batch; RELEASE SAVEPOINT batch`); rerr != nil {
			return errors.Join(err, rerr)
		}
		r.a, r.err = storage.Applied{}, err
	}
	// The rows locked for runs no batch made go again (rows the group
	// made, or made before by a transaction that then failed).
	if len(runs) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM runs WHERE run_id = ANY($1) AND state IS NULL`, runs); err != nil {
			return err
		}
	}
	return nil
}

// sortedSet sorts s and drops repeats: the order rows are locked in.
func sortedSet(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// emptyNodeStatuses are the status rows of nodes not yet in the table.
func emptyNodeStatuses(nodes []string) ([][]byte, error) {
	out := make([][]byte, len(nodes))
	for i, n := range nodes {
		var err error
		if out[i], err = proto.Marshal(&trainmeterv1.NodeStatus{Node: n}); err != nil {
			return nil, err
		}
	}
	return out, nil
}
