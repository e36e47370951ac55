package e2e

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The real agent says its loss records name their batch's window
// (Hello.loss_window_start), so the real collector keeps each batch's
// deduplication in its GPU/host record: after a few batches the data
// directory holds their r/ records and no b/ dedup mark (one each before).
func TestAgentBatchesAreStoredWithoutASeparateDedupMark(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	c, collector := collectorAt(t, testkit.FreeAddr(t), data)
	c.startAgent("fold-node", "sim:2")
	c.eventually("5 batches acked", func() bool {
		resp, err := c.q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
		return err == nil && len(resp.Nodes) == 1 && resp.Nodes[0].LastSeq >= 5
	})
	stopDaemon(c, collector)
	var db *badger.DB
	var err error
	c.eventually("the collector's data directory free", func() bool {
		db, err = badger.Open(badger.DefaultOptions(data).WithReadOnly(true).WithLogger(nil))
		return err == nil
	})
	defer db.Close()
	count := map[string]int{}
	if err := db.View(func(txn *badger.Txn) error {
		for _, p := range []string{"b/", "r/"} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(p)})
			for it.Rewind(); it.Valid(); it.Next() {
				count[p]++
			}
			it.Close()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if count["r/"] < 5 || count["b/"] != 0 {
		t.Errorf("keys: %d r/ (GPU/host records), %d b/ (dedup marks); want ≥ 5 and 0", count["r/"], count["b/"])
	}
}
