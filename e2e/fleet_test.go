package e2e

// A fleet on PostgreSQL (docs/deploy.md, "On PostgreSQL"): collector
// replicas on one database, agents in `--collector-mode any`, a multi-node
// run through faults (a replica killed, the leader killed, the database
// restarted); afterwards the run is whole, every replica answers the same,
// and a replica with nothing but the database's URL answers the same too.

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/pgtest"
)

// fleetAgent is one node of a fleet run: its trainer (rank), agent and the
// agent's GET /status address.
type fleetAgent struct {
	tr     *trainer
	p      *proc
	status string
}

// startFleetRun starts an agent per node (one GPU each, a replay trace at a
// constant 300 W: the truth checkExact compares with) listing every replica
// in mode any, and starts run on every node, rank by rank, with the extra
// run_start fields startExtra (",…" or "").
func startFleetRun(t *testing.T, reps []*replica, nodes []string, run, startExtra string) []fleetAgent {
	t.Helper()
	var agents []fleetAgent
	for _, node := range nodes {
		sock, p, status := anyAgent(t, reps, node, "replay:"+writeTrace(t, 1, 300, 300, 120))
		agents = append(agents, fleetAgent{tr: dialTrainer(t, sock), p: p, status: status})
	}
	for i, a := range agents {
		a.tr.send(`{"event":"run_start","run_id":%q,"model":"m","gpus":[0],"warmup_s":1,"rank":%d%s}`, run, i, startExtra)
	}
	return agents
}

// fleetSteps sends n steps, 100 ms apart, on every rank (rank i's steps
// have 500+i tokens), and returns the tokens sent.
func fleetSteps(agents []fleetAgent, run string, from, n int) int {
	sent := 0
	for s := from; s < from+n; s++ {
		time.Sleep(100 * time.Millisecond)
		for i, a := range agents {
			a.tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d}`, run, s, 500+i)
			sent += 500 + i
		}
	}
	for _, a := range agents {
		a.tr.sync()
	}
	return sent
}

// endFleetRun ends run on every rank and stops the agents (SIGINT: each
// sends what its spool holds first), so that nothing more reaches the
// database and every query's answer is final.
func endFleetRun(agents []fleetAgent, run string) {
	for _, a := range agents {
		a.tr.send(`{"event":"run_end","run_id":%q}`, run)
		a.tr.sync()
	}
	for _, a := range agents {
		a.p.stop(os.Interrupt)
	}
}

// sameAnswers checks that every replica given answers `report RUN --json`,
// `runs --json` and `usage --json` (by node, over a fixed period) exactly
// as the first does.
func sameAnswers(t *testing.T, run string, since time.Time, reps ...*replica) {
	t.Helper()
	until := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	queries := [][]string{{"report", run, "--json"}, {"runs", "--json"},
		{"usage", "--json", "--by", "node", "--since", since.UTC().Format(time.RFC3339), "--until", until}}
	for _, q := range queries {
		want := reps[0].cli(q...)
		for _, r := range reps[1:] {
			if got := r.cli(q...); got != want {
				t.Errorf("%v differs between replicas:\n--- %s\n%s\n--- %s\n%s", q, r.addr, got, reps[0].addr, want)
			}
		}
	}
}

// checkFreshReplica starts a replica on url with no --data, in an empty
// working directory, checks it answers as reps[0] does, and that it wrote
// nothing to its directory (no state outside the database).
func checkFreshReplica(t *testing.T, url, run string, since time.Time, reps []*replica, args ...string) {
	t.Helper()
	fresh, dir := startFreshReplica(t, url, args...)
	sameAnswers(t, run, since, append([]*replica{reps[0], fresh}, reps[1:]...)...)
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("the fresh replica's working directory holds %v (%v), want nothing", ents, err)
	}
}

// Three replicas on one database, three agents in mode any (node names
// picked so that each starts on a different replica), one run on the three
// nodes with a budget it exceeds, a webhook receiver that refuses every
// alert's first POST. A replica an agent streams to (not the leader) is
// killed mid-run (SIGKILL) and started again; then the leader is killed
// (SIGKILL) and another takes over. Afterwards: the run is complete with
// every token and the energy of the replay traces; every replica (the
// killed leader started again, and a fresh one with no local state)
// answers the same report, runs and usage; each budget threshold alert
// has one id, listed once by `alerts --json` on every replica, and reached
// the receiver accepted once under its Idempotency-Key: again only when
// the dead leader had just sent it (at least once, as docs/deploy.md says).
func TestFleetReplicaThenLeaderKilledMidRun(t *testing.T) {
	t.Parallel()
	since := time.Now().Add(-time.Minute)
	hook := newHookReceiver(t)
	url := pgtest.ServerDB(t)
	// 3 GPUs at $144/GPU-hour cost $0.12/s: the $1.50 budget is crossed
	// at 50 % after about 6 s, near the first kill, and at 100 % after
	// 12.5 s, well after the leader's (about 8 s).
	args := []string{"--gpu-price-per-hour", "144", "--webhook", hook.srv.URL + "/alerts", "--budget-eval-interval", "1s"}
	reps := []*replica{startReplica(t, url, args...), startReplica(t, url, args...), startReplica(t, url, args...)}
	leader := waitLeader(t, reps)
	if out := reps[1].cli("budget", "set", "fleet-budget", "1.50"); out == "" {
		t.Fatal("budget set printed nothing")
	}
	// fnv32a("fleet-e", "fleet-c", "fleet-a") % 3 = 0, 1, 2.
	agents := startFleetRun(t, reps, []string{"fleet-e", "fleet-c", "fleet-a"}, "fleet-run", `,"budget_scope":"fleet-budget"`)
	sent := fleetSteps(agents, "fleet-run", 1, 40)

	var victim *replica
	for _, a := range agents {
		for _, r := range reps {
			if r != leader && inUse(a.status) == r.addr {
				victim = r
			}
		}
	}
	if victim == nil {
		t.Fatalf("no agent streams to a replica other than the leader %s", leader.addr)
	}
	victim.p.stop(syscall.SIGKILL)
	sent += fleetSteps(agents, "fleet-run", 41, 30)
	reps[0].eventually("every agent on a live replica", func() bool {
		for _, a := range agents {
			if u := inUse(a.status); u == victim.addr || u == "" || uplinkStatus(a.status)["connected"] != true {
				return false
			}
		}
		return true
	})
	victim.start()

	leader.p.stop(syscall.SIGKILL)
	leaderKilled := time.Now()
	sent += fleetSteps(agents, "fleet-run", 71, 80)
	next := waitLeader(t, reps)
	endFleetRun(agents, "fleet-run")

	next.waitEnded("fleet-run")
	row := next.csvRow("fleet-run")
	checkExact(t, row, sent, 3, 300)
	if row["nodes"] != "3" {
		t.Errorf("nodes %q, want 3", row["nodes"])
	}
	var live []*replica
	for _, r := range reps {
		if r.alive() {
			live = append(live, r)
		}
	}

	// Every actual threshold is crossed; wait for its alert at the
	// receiver, then for every sender to be idle (a second POST would be
	// queued or in flight until then).
	actual := []string{"0.5/actual", "0.75/actual", "0.9/actual", "1/actual"}
	next.eventually("the actual alerts at the receiver", func() bool {
		got, _ := hook.budgetAlerts("fleet-budget")
		for _, k := range actual {
			if got[k] == 0 {
				return false
			}
		}
		return true
	})
	next.eventually("webhook senders idle", func() bool {
		for _, r := range live {
			if collectorAlerts(t, r.status).WebhooksBusy != 0 {
				return false
			}
		}
		return true
	})
	// The killed leader back: it follows, and sends nothing again.
	leader.start()
	live = append(live, leader)
	time.Sleep(3 * time.Second) // more than the senders' 2 s look for pending alerts
	checkAlertsOnce(t, hook, "fleet-budget", actual, leaderKilled, live)

	sameAnswers(t, "fleet-run", since, live...)
	checkFreshReplica(t, url, "fleet-run", since, live, args...)
}

// checkAlertsOnce checks the budget alerts of scope: the actual ones of
// want among them; one alert id per threshold (actual or projected); each
// accepted by the receiver once under an Idempotency-Key that is its id,
// or twice where the leader killed at leaderKilled had sent it and the
// next sent it again; and `alerts --json` on every replica listing each
// once, the same list on each.
func checkAlertsOnce(t *testing.T, hook *hookReceiver, scope string, want []string, leaderKilled time.Time, reps []*replica) {
	t.Helper()
	hook.mu.Lock()
	defer hook.mu.Unlock()
	for _, k := range hook.badKeys {
		t.Errorf("webhook POST with %s", k)
	}
	ids := map[string][]string{} // "threshold/actual|projected" → alert ids
	var delivered []string
	for id, bodies := range hook.accepted {
		a := bodies[0]
		if a["kind"] != "budget" || a["scope"] != scope {
			continue
		}
		kind := "actual"
		if a["projected"] == true {
			kind = "projected"
		}
		k := fmt.Sprintf("%v/%s", a["threshold"], kind)
		ids[k] = append(ids[k], id)
		delivered = append(delivered, id)
		at := hook.acceptedAt[id]
		switch {
		case len(at) == 1:
		case len(at) == 2 && at[0].Before(leaderKilled) && at[1].After(leaderKilled):
			t.Logf("alert %s (%s) sent again by the next leader after the leader's kill", id, k)
		default:
			t.Errorf("alert %s (%s) accepted %d times at %v (leader killed at %v), want once", id, k, len(at), at, leaderKilled)
		}
	}
	for k, v := range ids {
		if len(v) != 1 {
			t.Errorf("threshold %s reached the receiver under %d ids %v, want one", k, len(v), v)
		}
	}
	for _, k := range want {
		if len(ids[k]) == 0 {
			t.Errorf("no %s alert reached the receiver (got %v)", k, ids)
		}
	}
	if ids := ids[want[len(want)-1]]; len(ids) > 0 && !hook.acceptedAt[ids[0]][0].After(leaderKilled) {
		t.Errorf("alert %s reached the receiver before the leader was killed: the next leader delivered nothing", want[len(want)-1])
	}
	slices.Sort(delivered)
	var first []string
	for i, r := range reps {
		var listed struct {
			Alerts []struct {
				ID, Kind, Scope string
				Threshold       float64
				Projected       bool
			}
		}
		out := r.cli("alerts", "--kind", "budget", "--json")
		if err := json.Unmarshal([]byte(out), &listed); err != nil {
			t.Fatalf("alerts --json: %v\n%s", err, out)
		}
		var got []string
		seen := map[string]bool{}
		for _, a := range listed.Alerts {
			if a.Scope != scope {
				continue
			}
			k := fmt.Sprintf("%v/%v", a.Threshold, a.Projected)
			if seen[k] {
				t.Errorf("replica %s lists threshold %s twice:\n%s", r.addr, k, out)
			}
			seen[k] = true
			got = append(got, a.ID)
		}
		slices.Sort(got)
		if !slices.Equal(got, delivered) {
			t.Errorf("replica %s lists alerts %v, the receiver accepted %v", r.addr, got, delivered)
		}
		if i == 0 {
			first = got
		} else if !slices.Equal(got, first) {
			t.Errorf("replica %s lists %v, %s lists %v", r.addr, got, reps[0].addr, first)
		}
	}
}

// PostgreSQL restarted mid-run (pg_ctl -m fast, down for 4 s, started again
// on the same data and socket) under two replicas and three agents in mode
// any: while it is down nothing is acked and the agents keep the run's
// batches in their spools; afterwards the run is complete with every token
// and the replay traces' energy, and both replicas and a fresh one answer
// the same.
func TestFleetPostgresRestartedMidRun(t *testing.T) {
	t.Parallel()
	since := time.Now().Add(-time.Minute)
	srv, url := pgtest.OwnServer(t)
	reps := []*replica{startReplica(t, url), startReplica(t, url)}
	agents := startFleetRun(t, reps, []string{"pgr-a", "pgr-b", "pgr-c"}, "pg-restart", "")
	sent := fleetSteps(agents, "pg-restart", 1, 20)
	acked := func() (n float64) {
		for _, a := range agents {
			v, _ := uplinkStatus(a.status)["batches_acked"].(float64)
			n += v
		}
		return n
	}
	if err := srv.Restart(func() {
		sent += fleetSteps(agents, "pg-restart", 21, 5) // what was committed before the stop acked
		before := acked()
		sent += fleetSteps(agents, "pg-restart", 26, 35)
		pending := 0.0
		for _, a := range agents {
			v, _ := uplinkStatus(a.status)["batches_pending"].(float64)
			pending += v
		}
		if after := acked(); after != before || pending < 3 {
			t.Errorf("while the database was down: %v batches acked (want none), %v pending in the spools (want each agent's)", after-before, pending)
		}
	}); err != nil {
		t.Fatal(err)
	}
	sent += fleetSteps(agents, "pg-restart", 61, 20)
	endFleetRun(agents, "pg-restart")
	reps[0].waitEnded("pg-restart")
	row := reps[0].csvRow("pg-restart")
	checkExact(t, row, sent, 3, 300)
	if row["nodes"] != "3" {
		t.Errorf("nodes %q, want 3", row["nodes"])
	}
	sameAnswers(t, "pg-restart", since, reps...)
	checkFreshReplica(t, url, "pg-restart", since, reps)
}
