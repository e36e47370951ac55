package agent

// The ledger's checkpoint, written every second, as two slot files kept
// open and overwritten in place in turn: one pwrite per checkpoint (each
// system call wakes the Go runtime's sysmon thread). The slot last written
// is never the one overwritten next, so a write torn by a kill -9 costs one
// checkpoint: the other slot still holds the one before, which restore
// takes. docs/reliability.md describes the layout.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
)

// stateSlotNames are the two slot files in the spool directory.
var stateSlotNames = [2]string{"ledger-state.0", "ledger-state.1"}

const (
	stateSlotMagic   = "TMLEDGST"
	stateSlotVersion = 1
	// maxStateSlotVersion bounds the version field: beyond it the field is
	// damage (the CRC of another format's header cannot be checked).
	maxStateSlotVersion = 255
	// stateSlotHeader: magic [8], version u32, seq u64, payload length u32,
	// CRC32C u32 over the header's first 24 bytes and the payload; all
	// little-endian.
	stateSlotHeader = 28
	// maxStatePayload bounds what restore reads from a slot: a length field
	// beyond it is corruption, not a snapshot.
	maxStatePayload = 256 << 20
)

var stateCastagnoli = crc32.MakeTable(crc32.Castagnoli)

// stateSlotFile is what the slots are read and written through (*os.File;
// tests count the calls).
type stateSlotFile interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
}

func openStateSlotFile(name string) (stateSlotFile, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
}

// stateSlots writes checkpoints into two slot files in turn.
type stateSlots struct {
	dir   string
	open  func(name string) (stateSlotFile, error)
	files [2]stateSlotFile
	// next is the slot the next checkpoint overwrites; seq the sequence
	// number of the last one written or restored.
	next int
	seq  uint64
	buf  []byte
}

func newStateSlots(dir string, open func(string) (stateSlotFile, error)) *stateSlots {
	if open == nil {
		open = openStateSlotFile
	}
	return &stateSlots{dir: dir, open: open}
}

func (ss *stateSlots) path(i int) string { return filepath.Join(ss.dir, stateSlotNames[i]) }

// file returns slot i's handle, opening it the first time (and again after
// a failed open).
func (ss *stateSlots) file(i int) (stateSlotFile, error) {
	if ss.files[i] == nil {
		f, err := ss.open(ss.path(i))
		if err != nil {
			return nil, err
		}
		ss.files[i] = f
	}
	return ss.files[i], nil
}

// slotProblem says why a slot holds no usable checkpoint.
type slotProblem struct {
	slot int
	err  error
}

// load reads both slots and returns the payload of the newest valid one,
// which slot it came from (-1: none), and what was wrong with the others
// (a slot never written, a new file, is no problem).
// The next write goes to the slot that does not hold the payload returned.
// A slot of another format version refuses the whole state (err, a
// *spool.FormatError): the agent that wrote it may still resume from it.
func (ss *stateSlots) load() (payload []byte, from int, problems []slotProblem, err error) {
	from = -1
	for i := range ss.files {
		f, err := ss.file(i)
		if err != nil {
			problems = append(problems, slotProblem{slot: i, err: err})
			continue
		}
		p, seq, err := readStateSlot(f, ss.path(i))
		if fe := (*spool.FormatError)(nil); errors.As(err, &fe) {
			return nil, -1, nil, err
		}
		if err != nil {
			if !errors.Is(err, errSlotEmpty) {
				problems = append(problems, slotProblem{slot: i, err: err})
			}
			continue
		}
		if from < 0 || seq > ss.seq {
			payload, from, ss.seq = p, i, seq
		}
	}
	ss.next = 0
	if from == 0 {
		ss.next = 1
	}
	return payload, from, problems, nil
}

var errSlotEmpty = errors.New("empty")

// readStateSlot reads the slot file f (named path); a slot of another
// format version is a *spool.FormatError.
func readStateSlot(f io.ReaderAt, path string) (payload []byte, seq uint64, err error) {
	hdr := make([]byte, stateSlotHeader)
	n, err := f.ReadAt(hdr, 0)
	if n == 0 && (err == nil || errors.Is(err, io.EOF)) {
		return nil, 0, errSlotEmpty
	}
	if n < stateSlotHeader {
		if err == nil || errors.Is(err, io.EOF) {
			err = fmt.Errorf("torn: %d bytes, shorter than the %d-byte header", n, stateSlotHeader)
		}
		return nil, 0, err
	}
	if string(hdr[:8]) != stateSlotMagic {
		return nil, 0, errors.New("not a ledger state slot (bad magic)")
	}
	switch v := binary.LittleEndian.Uint32(hdr[8:12]); {
	case v > maxStateSlotVersion:
		return nil, 0, fmt.Errorf("format version field %d is damage, not a version", v)
	case v != stateSlotVersion:
		return nil, 0, &spool.FormatError{What: "ledger state " + path, Format: "ledger state",
			Have: v, Want: stateSlotVersion, Lost: "the open runs it holds are not resumed"}
	}
	seq = binary.LittleEndian.Uint64(hdr[12:20])
	size := binary.LittleEndian.Uint32(hdr[20:24])
	if size > maxStatePayload {
		return nil, 0, fmt.Errorf("payload length %d is beyond any snapshot", size)
	}
	payload = make([]byte, size)
	if n, err := f.ReadAt(payload, stateSlotHeader); n < int(size) {
		if err == nil || errors.Is(err, io.EOF) {
			err = fmt.Errorf("torn: %d of %d payload bytes", n, size)
		}
		return nil, 0, err
	}
	crc := crc32.Update(crc32.Checksum(hdr[:24], stateCastagnoli), stateCastagnoli, payload)
	if crc != binary.LittleEndian.Uint32(hdr[24:28]) {
		return nil, 0, errors.New("torn or corrupt: CRC mismatch")
	}
	return payload, seq, nil
}

// write overwrites the older slot with payload: one WriteAt. Bytes beyond
// the new payload (from a longer earlier one) are left: the header's length
// bounds what is read, so no truncate is needed.
func (ss *stateSlots) write(payload []byte) error {
	if len(payload) > maxStatePayload {
		return fmt.Errorf("ledger state of %d bytes is too large to save", len(payload))
	}
	i := ss.next
	f, err := ss.file(i)
	if err != nil {
		return err
	}
	seq := ss.seq + 1
	b := append(ss.buf[:0], stateSlotMagic...)
	b = binary.LittleEndian.AppendUint32(b, stateSlotVersion)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	crc := crc32.Update(crc32.Checksum(b, stateCastagnoli), stateCastagnoli, payload)
	b = binary.LittleEndian.AppendUint32(b, crc)
	b = append(b, payload...)
	ss.buf = b
	if _, err := f.WriteAt(b, 0); err != nil {
		// The slot may now be torn; the other still holds the last
		// checkpoint, so the next attempt overwrites this one again.
		return err
	}
	ss.seq, ss.next = seq, 1-i
	return nil
}

func (ss *stateSlots) close() error {
	if ss == nil {
		return nil
	}
	var errs []error
	for i, f := range ss.files {
		if f != nil {
			errs = append(errs, f.Close())
			ss.files[i] = nil
		}
	}
	return errors.Join(errs...)
}
