package uplink

import (
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// pingCountingListener parses what clients write on the connections it
// accepts and counts the PINGs they start (not their answers).
type pingCountingListener struct {
	net.Listener
	mu    sync.Mutex
	pings int
	wg    sync.WaitGroup
}

func (l *pingCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(pr, preface); err != nil {
			_, _ = io.Copy(io.Discard, pr)
			return
		}
		fr := http2.NewFramer(nil, pr)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				l.mu.Lock()
				l.pings++
				l.mu.Unlock()
			}
		}
	}()
	return &teeConn{Conn: c, w: pw}, nil
}

type teeConn struct {
	net.Conn
	w *io.PipeWriter
}

func (c *teeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		_, _ = c.w.Write(b[:n])
	}
	if err != nil {
		c.w.CloseWithError(err)
	}
	return n, err
}

func (c *teeConn) Close() error {
	c.w.Close()
	return c.Conn.Close()
}

// Each ack costs the agent one frame read: with gRPC's default dynamic
// flow-control windows the uplink answered every ack it received with a
// bandwidth-probing PING, one more write for it and one more read and
// write for the collector (package flowcontrol, docs/benchmarks.md).
func TestUplinkSendsNoPingsAfterAcks(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl := &pingCountingListener{Listener: lis}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, &collector{})
	go func() { _ = srv.Serve(pl) }()

	u, stop := start(t, Config{Address: lis.Addr().String()})
	const batches = 20
	for seq := uint64(1); seq <= batches; seq++ {
		u.Enqueue(&trainmeterv1.Batch{Seq: seq})
		flush(t, u) // one batch in flight at a time, as at one a second
	}
	stop()
	srv.Stop()
	pl.wg.Wait()
	if pl.pings != 0 {
		t.Errorf("the uplink sent %d PINGs for %d acked batches, want 0", pl.pings, batches)
	}
}
