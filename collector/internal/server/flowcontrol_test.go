package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
)

// frameCounter parses what the server writes to one client connection and
// counts the frames by type.
type frameCounter struct {
	net.Conn
	pw *io.PipeWriter

	mu     sync.Mutex
	counts map[http2.FrameType]int
	done   chan struct{}
}

func countFrames(c net.Conn) *frameCounter {
	pr, pw := io.Pipe()
	fc := &frameCounter{Conn: c, pw: pw, counts: map[http2.FrameType]int{}, done: make(chan struct{})}
	go func() {
		defer close(fc.done)
		fr := http2.NewFramer(nil, pr)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			// Pings the server starts (not its answers to the client's).
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				continue
			}
			fc.mu.Lock()
			fc.counts[f.Header().Type]++
			fc.mu.Unlock()
		}
	}()
	return fc
}

func (fc *frameCounter) Read(b []byte) (int, error) {
	n, err := fc.Conn.Read(b)
	if n > 0 {
		_, _ = fc.pw.Write(b[:n])
	}
	if err != nil {
		fc.pw.CloseWithError(err)
	}
	return n, err
}

func (fc *frameCounter) Close() error {
	err := fc.Conn.Close()
	fc.pw.CloseWithError(errors.New("closed"))
	return err
}

func (fc *frameCounter) count(t http2.FrameType) int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.counts[t]
}

// An agent's stream of small batches costs the collector one ack written per
// batch and no more: with gRPC's dynamic flow-control windows the server also
// sent a bandwidth-probing PING on the data it received, and updated the
// connection's window every 16 KiB as well (docs/benchmarks.md).
func TestIngestStreamGetsNoPingsAndFewWindowUpdates(t *testing.T) {
	srv := start(t, server.Config{})
	var fc *frameCounter
	conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			fc = countFrames(c)
			return fc, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	a := tu.Connect(t, conn, "node-1", "boot-a")
	const batches = 60 // about 60 KiB: the default windows would be replenished 3 times
	for i := 1; i <= batches; i++ {
		b := loadgen.MakeBatch(uint64(i), tu.T0.Add(time.Duration(i)*time.Second), time.Second, "run-1", 8, i == 1)
		a.MustAck(b)
	}
	a.Close()
	conn.Close()
	<-fc.done
	if n := fc.count(http2.FramePing); n != 0 {
		t.Errorf("server sent %d PING frames for %d batches, want 0", n, batches)
	}
	// The stream's own window (64 KiB) is replenished every 16 KiB, about
	// every 15 batches; the connection's (1 MiB) not within this test.
	if n := fc.count(http2.FrameWindowUpdate); n > batches/10 {
		t.Errorf("server sent %d WINDOW_UPDATE frames for %d batches, want at most %d", n, batches, batches/10)
	}
	if n := fc.count(http2.FrameData); n < batches {
		t.Errorf("%d DATA frames for %d acks: the counter sees too little", n, batches)
	}
}
