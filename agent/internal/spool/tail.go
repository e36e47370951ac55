package spool

// The in-memory tail: the encoded records this process appended most
// recently, so the uplink sends a fresh batch without opening its segment
// (each open is several system calls, and each wakes the Go runtime's sysmon
// thread: most of what an idle agent costs, docs/benchmarks.md).
//
// It holds only records this process wrote successfully, so each is byte for
// byte what is on disk; others are read from the file, where damage is still
// detected. A record leaves it when acked by every collector, dropped or
// removed with its segment; the oldest go first past its bound.

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// DefaultTailBytes bounds the in-memory tail: 4 MiB, one default segment,
// about 47 minutes of 1,498-byte 1 s batches (DefaultMaxBytes), so a
// collector back within that gets its backlog from memory too. Steady state
// needs one record.
const DefaultTailBytes int64 = 4 << 20

// maxTailRecords bounds the tail's index too: records released out of order
// (a pair where one collector lags) stay in it until they reach its front.
const maxTailRecords = 4096

// ReadFile is what the spool reads segments through; *os.File satisfies it.
type ReadFile interface {
	io.ReaderAt
	io.Closer
}

func openReadFile(name string) (ReadFile, error) { return os.Open(name) }

// remember puts a record just written into the tail.
func (s *Spool) remember(r *record, data []byte) {
	if s.tailMax <= 0 {
		return
	}
	r.data = data
	s.tailBytes += int64(len(data))
	s.tail = append(s.tail, r)
	for len(s.tail) > 0 && (s.tail[0].data == nil || s.tailBytes > s.tailMax || len(s.tail) > maxTailRecords) {
		s.forget(s.tail[0])
		s.tail[0] = nil
		s.tail = s.tail[1:]
	}
}

// forget releases a record's bytes from the tail; it is read from its
// segment from now on, if at all.
func (s *Spool) forget(r *record) {
	if r.data != nil {
		s.tailBytes -= int64(len(r.data))
		r.data = nil
	}
}

// segReader reads one segment's records, from the tail where it holds them,
// else from the file, opened once for the whole loop and only if needed.
type segReader struct {
	s   *Spool
	g   *segment
	f   ReadFile
	err error
}

func (s *Spool) reader(g *segment) *segReader { return &segReader{s: s, g: g} }

func (rd *segReader) read(r *record) (*trainmeterv1.Batch, error) {
	if r.data != nil {
		return decodeRecord(r.data, r)
	}
	if rd.f == nil && rd.err == nil {
		rd.f, rd.err = rd.s.openRead(rd.g.path)
	}
	if rd.err != nil {
		return nil, rd.err
	}
	return readRecord(rd.f, r)
}

func (rd *segReader) close() {
	if rd.f != nil {
		_ = rd.f.Close()
		rd.f = nil
	}
}

func readRecord(f io.ReaderAt, r *record) (*trainmeterv1.Batch, error) {
	buf := make([]byte, r.size)
	if _, err := f.ReadAt(buf, r.off); err != nil {
		return nil, err
	}
	return decodeRecord(buf, r)
}

// decodeRecord checks a record's framing against what the spool knows of it
// (length, CRC, seq) and decodes its batch.
func decodeRecord(buf []byte, r *record) (*trainmeterv1.Batch, error) {
	if int64(len(buf)) != r.size || len(buf) < recHeader ||
		int64(binary.LittleEndian.Uint32(buf[0:4]))+recHeader != r.size ||
		crc32.Checksum(buf[8:], castagnoli) != binary.LittleEndian.Uint32(buf[4:8]) ||
		binary.LittleEndian.Uint64(buf[8:16]) != r.seq {
		return nil, errors.New("record changed on disk (bad length, CRC or seq)")
	}
	b := &trainmeterv1.Batch{}
	if err := proto.Unmarshal(buf[recHeader:], b); err != nil {
		return nil, err
	}
	return b, nil
}

// dropTail releases the whole tail (the spool is closing).
func (s *Spool) dropTail() {
	for _, r := range s.tail {
		s.forget(r)
	}
	s.tail = nil
}
