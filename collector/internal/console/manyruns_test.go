package console_test

import (
	"cmp"
	"fmt"
	"html"
	"regexp"
	"slices"
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var (
	rowRun   = regexp.MustCompile(`<tr data-run="([^"]+)"`)
	nextLink = regexp.MustCompile(`<a href="([^"]+)" rel="next">`)
)

// TestRunsPagesShowEveryRunOnce: the Runs page pages 1,200 runs (every
// 7th live, starts with ties) 100 a page, live runs first, each newest
// first, ties by run id; following its next links shows every run exactly
// once, with and without filters (status is selected by the store, model
// needs every report: both page alike), and the table body its script
// fetches for a page is that page's.
func TestRunsPagesShowEveryRunOnce(t *testing.T) {
	c := startCollector(t, nil)
	conn := tu.Dial(t, c.srv.Addr().String())
	const n, perBatch, perNode = 1200, 50, 100
	type run struct {
		id    string
		start float64
		live  bool
	}
	var runs []run
	for node := 0; node < n/perNode; node++ {
		a := tu.Connect(t, conn, fmt.Sprintf("node-%02d", node), "boot")
		for b := 0; b < perNode/perBatch; b++ {
			var windows []*trainmeterv1.RunWindow
			var events []*trainmeterv1.RunEvent
			for i := 0; i < perBatch; i++ {
				k := node*perNode + b*perBatch + i
				r := run{id: fmt.Sprintf("run-%04d", (k*37)%n), start: -float64((k * 13) % 50), live: k%7 == 0}
				runs = append(runs, r)
				windows = append(windows, tu.Window(r.id, 0, 10, 5))
				events = append(events, tu.Start(r.id, r.start, "m"))
				if !r.live {
					events = append(events, tu.End(r.id, 1))
				}
			}
			a.MustAck(tu.Batch(uint64(b+1), 0, windows, events...))
		}
		a.Close()
	}
	slices.SortFunc(runs, func(a, b run) int {
		if a.live != b.live {
			if a.live {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.start, a.start), cmp.Compare(a.id, b.id))
	})
	var all, live, ended []string
	for _, r := range runs {
		all = append(all, r.id)
		if r.live {
			live = append(live, r.id)
		} else {
			ended = append(ended, r.id)
		}
	}
	_, first := get(t, nil, c.base+"/runs")
	if want := fmt.Sprintf("runs 1–100 of %d (%d live) · page 1 of 12", n, len(live)); !strings.Contains(first, want) {
		t.Errorf("the Runs page does not say %q", want)
	}
	for _, c2 := range []struct {
		query string
		want  []string
	}{
		{"", all},
		{"?status=live", live},
		{"?status=ended", ended},
		{"?model=m", all},
		{"?model=m&status=ended", ended},
	} {
		var got []string
		pages := 0
		for u := "/runs" + c2.query; u != ""; pages++ {
			_, body := get(t, nil, c.base+u)
			ids := rowIDs(body)
			got = append(got, ids...)
			if pages > 0 {
				// The rows the page's script fetches are the page's.
				_, rows := get(t, nil, c.base+"/runs/rows?"+strings.SplitN(u, "?", 2)[1])
				if r := rowIDs(rows); !slices.Equal(r, ids) {
					t.Errorf("%s: its rows are %d runs from %v, the page %d from %v", u, len(r), r[:min(1, len(r))], len(ids), ids[:min(1, len(ids))])
				}
			}
			u = ""
			if m := nextLink.FindStringSubmatch(body); m != nil {
				u = html.UnescapeString(m[1])
			}
			if pages > 20 {
				t.Fatalf("runs%s: more than 20 pages", c2.query)
			}
		}
		if !slices.Equal(got, c2.want) {
			t.Errorf("runs%s: %d pages show %d runs, want each of %d once in order (first difference at %d)",
				c2.query, pages, len(got), len(c2.want), firstDiff(got, c2.want))
		}
		if want := (len(c2.want) + 99) / 100; pages != want {
			t.Errorf("runs%s: %d pages, want %d", c2.query, pages, want)
		}
	}
}

func rowIDs(body string) []string {
	var ids []string
	for _, m := range rowRun.FindAllStringSubmatch(body, -1) {
		ids = append(ids, html.UnescapeString(m[1]))
	}
	return ids
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
