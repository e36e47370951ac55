package prices

import "testing"

// TestUnknownReliabilityIsNullAndUnranked: a price list without a
// reliability gives offers whose reliability is unknown (nil), and such an
// offer is ranked on what is known of it (price, perf per dollar), not as
// an offer of reliability 0.
func TestUnknownReliabilityIsNullAndUnranked(t *testing.T) {
	offers, err := ParsePriceList([]byte("id,gpu_name,num_gpus,dph_total,reliability\n"+
		"unknown,X1,1,1.00,\n"+
		"half,X1,1,1.20,0.5\n"+
		"zero,X1,1,1.00,0\n"), "file")
	if err != nil {
		t.Fatal(err)
	}
	rel := map[string]*float64{}
	for _, o := range offers {
		rel[o.ID] = o.Reliability
	}
	if rel["unknown"] != nil || rel["half"] == nil || *rel["half"] != 0.5 || rel["zero"] == nil || *rel["zero"] != 0 {
		t.Fatalf("reliabilities unknown %v, half %v, zero %v: want nil, 0.5, 0", rel["unknown"], rel["half"], rel["zero"])
	}
	rec := Recommend(offers, "X1")
	if len(rec) != 3 {
		t.Fatalf("%d recommendations", len(rec))
	}
	// unknown: price 1 of 1, scored over price and perf weights: 0.4/0.7;
	// half: (0.4·1/1.2 + 0.3·0.5)/1; zero, known unreliable: 0.4/1.
	want := []struct {
		id    string
		score float64
	}{{"unknown", 0.4 / 0.7}, {"half", 0.4/1.2 + 0.15}, {"zero", 0.4}}
	for i, w := range want {
		if rec[i].ID != w.id || abs(rec[i].Score-w.score) > 1e-9 {
			t.Errorf("rank %d: %s score %v, want %s score %v", i+1, rec[i].ID, rec[i].Score, w.id, w.score)
		}
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}
