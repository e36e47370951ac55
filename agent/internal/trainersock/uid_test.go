package trainersock

import (
	"github.com/trainmeter/trainmeter/internal/testkit"
	"os"
	"strconv"
	"testing"
)

func TestUIDAllowList(t *testing.T) {
	me := uint32(os.Getuid())

	// The test process's uid on the list: served.
	rec := newRecorder()
	s := start(t, Config{AllowedUIDs: []uint32{me + 1, me}}, rec)
	c := dial(t, s.cfg.Path)
	c.send(`{"event":"run_end","run_id":"ok"}`)
	testkit.Eventually(t, "the allowed peer's event", func() bool { return rec.numEvents() == 1 })

	// A list without it: one error line, then the connection is closed,
	// and nothing reaches the handler.
	rec2 := newRecorder()
	s2 := start(t, Config{AllowedUIDs: []uint32{me + 1}}, rec2)
	d := dial(t, s2.cfg.Path)
	want := errLine("uid "+strconv.FormatUint(uint64(me), 10)+" is not allowed to report to this agent", 0)
	if got := d.readLine(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	d.expectEOF()
	if n := rec2.numEvents(); n != 0 {
		t.Errorf("%d events from a refused peer reached the handler", n)
	}
	if st := s2.Stats(); st.Rejected[RejectUIDNotAllowed] != 1 || st.ConnsAccepted != 0 {
		t.Errorf("stats = %+v, want one uid rejection and no accepted connection", st)
	}
	if n := rec2.numDisconnected(); n != 0 {
		t.Errorf("%d Disconnected calls for a refused peer", n)
	}

	// No list: the socket's permissions decide.
	rec3 := newRecorder()
	s3 := start(t, Config{}, rec3)
	dial(t, s3.cfg.Path).send(`{"event":"run_end","run_id":"any"}`)
	testkit.Eventually(t, "event with no allow-list", func() bool { return rec3.numEvents() == 1 })
}
