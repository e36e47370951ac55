// Package testkit holds the helpers the tests of both daemons share: a
// poll for a condition (Eventually), a free loopback address, a buffer
// safe for concurrent writers (logs), and the goroutines goleak ignores.
// Only tests import it.
package testkit

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// EventuallyTimeout bounds Eventually: long enough for a loaded CI
// machine; a passing test never waits for it.
const EventuallyTimeout = 20 * time.Second

// Eventually polls cond until it holds, failing t after EventuallyTimeout
// with what was awaited. It is for outcomes only another process or
// goroutine decides (a file written, a POST received); what the test drives
// itself (a clock, a channel) it waits on directly.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(EventuallyTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// FreeAddr returns a loopback HOST:PORT that was free a moment ago (for a
// process the test starts, which must bind it itself).
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Buffer is a bytes.Buffer for concurrent writers (a logger's handler)
// and a reader (the test).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// GoleakOptions are the goroutines that outlive a test by design: glog's
// flush daemon and badger's allocator pool (started once per process).
func GoleakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreTopFunction("github.com/dgraph-io/ristretto/v2/z.(*AllocatorPool).freeupAllocators"),
	}
}
