package cli

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestEstimateCommand(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), GPUPricePerHour: 3600, Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	addr := srv.Addr().String()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"estimate", "--tokens", "10"}, "give --model and --tokens"},
		{[]string{"estimate", "--model", "m", "--tokens", "ten"}, "want a whole number of tokens"},
		{[]string{"estimate", "--model", "m", "--tokens", "1.5"}, "want a whole number of tokens"},
		{[]string{"estimate", "--model", "m", "--tokens", "10"}, `model "m": no ended runs`},
		{[]string{"run", "--tokens", "10", "--", "true"}, "--tokens needs --model"},
		{[]string{"run", "--max-cost", "-1", "--", "true"}, "--max-cost -1"},
	} {
		if _, err := run(t, nil, append(tc.args, "--collector", addr)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}

	// One ended run of m: 10 windows of 1 GPU-second and 100 tokens ($1 each).
	a := tu.Connect(t, tu.Dial(t, addr), "n1", "boot")
	for s := range 10 {
		var evs []*trainmeterv1.RunEvent
		if s == 0 {
			evs = append(evs, tu.Start("r", 0, "m"))
		}
		if s == 9 {
			evs = append(evs, tu.End("r", 10))
		}
		a.MustAck(tu.Batch(uint64(s+1), float64(s), []*trainmeterv1.RunWindow{tu.Window("r", float64(s), 100, 10)}, evs...))
	}
	out, err := run(t, nil, "estimate", "--model", "m", "--tokens", "2e3", "--gpus", "2", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"estimate for m: 2000 tokens on 2 x Sim GPU, from 1 past run (r)", "wall time   10s (10s to 10s)",
		"GPU-hours   0.005556", "cost        $20.00 ($20.00 to $20.00)", "GPU price   $3600/GPU-hour, flag (serve --gpu-price-per-hour)"} {
		if !strings.Contains(out, want) {
			t.Errorf("estimate output lacks %q:\n%s", want, out)
		}
	}
}
