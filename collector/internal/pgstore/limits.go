package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/fold"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Per-node limits (fold.Limits) live in the database, so that every
// collector on it holds a node to the same bounds: the runs live on a
// node are the rows of live_runs, its new-run bucket two columns of its
// nodes row. A batch reads and changes them in its transaction, holding
// the node's row, so one node's batches, whichever collectors apply them,
// decide one after another. A run's liveness on a node changes only by
// that node's records, so live_runs follows the aggregates' LiveOn; it is
// kept whether or not limits are set, and holds once they are.

// lockNode locks node's row, making it first when there is none (an
// agent's batch before its hello), and returns its status, bucket and
// rolled_ns (rolledOf).
func lockNode(tx pgx.Tx, node string) (*trainmeterv1.NodeStatus, fold.Bucket, int64, error) {
	ctx := context.Background()
	ns := &trainmeterv1.NodeStatus{Node: node}
	var val []byte
	var tokens *float64
	var at, rolled *int64
	sel := func() error {
		return tx.QueryRow(ctx, `SELECT status, new_runs_tokens, new_runs_at, rolled_ns FROM nodes WHERE node = $1 FOR UPDATE`, node).Scan(&val, &tokens, &at, &rolled)
	}
	err := sel()
	if errors.Is(err, pgx.ErrNoRows) {
		empty, merr := proto.Marshal(ns)
		if merr != nil {
			return nil, fold.Bucket{}, 0, merr
		}
		if _, err := tx.Exec(ctx, `INSERT INTO nodes (node, status) VALUES ($1, $2) ON CONFLICT DO NOTHING`, node, empty); err != nil {
			return nil, fold.Bucket{}, 0, err
		}
		err = sel()
	}
	if err != nil {
		return nil, fold.Bucket{}, 0, err
	}
	if err := proto.Unmarshal(val, ns); err != nil {
		return nil, fold.Bucket{}, 0, err
	}
	var b fold.Bucket
	if tokens != nil && at != nil {
		b = fold.Bucket{Tokens: *tokens, At: time.Unix(0, *at)}
	}
	return ns, b, rolledOf(rolled), nil
}

// nodeLive is the fold.LiveBase of a batch's transaction: its node's
// committed live runs among the batch's (from the locked aggregates, before
// the batch folds), how many it has in all, and its bucket.
type nodeLive struct {
	node   string
	live   map[string]bool
	count  int
	bucket fold.Bucket
}

func (n *nodeLive) IsLive(node, run string) bool { return node == n.node && n.live[run] }
func (n *nodeLive) LiveRuns(string) int          { return n.count }
func (n *nodeLive) Bucket(string) fold.Bucket    { return n.bucket }

// newLive is the batch's fold.Live: node's runs live among v's, and
// (when the live runs are bounded and the batch starts a run) how many
// live runs node has.
func (s *Store) newLive(tx pgx.Tx, v *runView, node string, bucket fold.Bucket, b *trainmeterv1.Batch) (*fold.Live, error) {
	base := &nodeLive{node: node, live: map[string]bool{}, bucket: bucket}
	for r, st := range v.state {
		if st.LiveOn(node) {
			base.live[r] = true
		}
	}
	if s.limits.MaxLiveRunsPerNode > 0 && startsRun(b) {
		if err := tx.QueryRow(context.Background(), `SELECT count(*) FROM live_runs WHERE node = $1`, node).Scan(&base.count); err != nil {
			return nil, err
		}
	}
	return fold.NewLive(base, s.limits, v.now), nil
}

func startsRun(b *trainmeterv1.Batch) bool {
	for _, e := range b.GetRunEvents() {
		if e.GetRunStart() != nil {
			return true
		}
	}
	return false
}

// queueLive queues the writes of what the batch changed: live_runs rows
// and the bucket.
func queueLive(q *pgx.Batch, l *fold.Live) {
	for k, live := range l.Changed {
		if live {
			q.Queue(`INSERT INTO live_runs (node, run_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, k.Node, k.Run)
		} else {
			q.Queue(`DELETE FROM live_runs WHERE node = $1 AND run_id = $2`, k.Node, k.Run)
		}
	}
	for node, b := range l.Buckets() {
		var tokens *float64
		var at *int64
		if b != (fold.Bucket{}) {
			ns := b.At.UnixNano()
			tokens, at = &b.Tokens, &ns
		}
		q.Queue(`UPDATE nodes SET new_runs_tokens = $2, new_runs_at = $3 WHERE node = $1`, node, tokens, at)
	}
}
