package testkit

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
)

func TestBufferTakesConcurrentWriters(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fmt.Fprintf(&b, "line %d\n", i)
		}()
	}
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 8 {
		t.Fatalf("%d lines, want 8:\n%s", n, b.String())
	}
}

func TestFreeAddrCanBeBound(t *testing.T) {
	addr := FreeAddr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("FreeAddr %s: %v", addr, err)
	}
	l.Close()
	done := false
	Eventually(t, "a condition that holds", func() bool { done = !done; return !done })
}
