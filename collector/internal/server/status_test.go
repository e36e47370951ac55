package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestStatusEndpoints(t *testing.T) {
	srv := start(t, server.Config{StatusListen: "127.0.0.1:0"})
	base := "http://" + srv.StatusAddr().String()
	a := tu.Connect(t, tu.Dial(t, srv.Addr().String()), "n1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 5, 1)}, tu.Start("r", 0, "m")))
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 5, 1)})) // duplicate
	a.MustAck(tu.Batch(4, 3, nil))                                                // gap: 2, 3
	a.MustReject(tu.Invalid(5)["NaN energy"])

	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("healthz %d %q", resp.StatusCode, body)
	}
	resp, err = http.Get(base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	in := st.Ingest
	if !st.Healthy || in.Applied != 2 || in.Duplicate != 1 || in.Rejected != 1 || in.SeqGaps != 1 || in.SeqMissing != 2 ||
		in.SeqGapsPerNode["n1"] != 1 || in.ConnectedAgents != 1 || in.StoreWrites != 3 || in.StoreWriteP99Ms <= 0 {
		t.Errorf("status %+v", st)
	}
	if s := server.New(server.Config{}, quiet()).Status(); s.Healthy || s.Problems[0] != "not started" {
		t.Errorf("status before start: %+v", s)
	}
}
