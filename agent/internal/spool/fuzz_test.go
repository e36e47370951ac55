package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenSegmentTail cuts the newest segment of a spool holding five
// batches by cut bytes, appends arbitrary tail bytes (a torn write, garbage
// from a crash, a forged record), and opens it. Opening must never fail, and
// what is kept must be a CRC-valid, seq-ordered prefix of the bytes on disk
// that holds every original record the cut did not touch. The one refusal:
// a cut through the magic whose tail names another spool format.
func FuzzOpenSegmentTail(f *testing.F) {
	template := f.TempDir()
	lg, _ := testLogger(nil)
	s, err := OpenWith(template, 0, Options{Logger: lg})
	if err != nil {
		f.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		if err := s.Append(batch(i, "r")); err != nil {
			f.Fatal(err)
		}
	}
	// Records end where the next begins; keep the ends to know which
	// originals a cut leaves whole.
	var recEnds []int64
	for _, r := range s.segs[len(s.segs)-1].recs {
		recEnds = append(recEnds, r.off+r.size)
	}
	s.abandon()
	entries, err := os.ReadDir(template)
	if err != nil {
		f.Fatal(err)
	}
	files := map[string][]byte{}
	segName := ""
	for _, e := range entries {
		if e.Name() == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(template, e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		files[e.Name()] = b
		if filepath.Ext(e.Name()) == segSuffix {
			segName = e.Name()
		}
	}
	seg := files[segName]

	f.Add(uint16(0), []byte{})
	f.Add(uint16(7), []byte{})
	f.Add(uint16(0), []byte{1, 2, 3})
	f.Add(uint16(0), bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 100))
	f.Add(uint16(0), []byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	// The last record again: a valid CRC but a seq that is not after the previous.
	f.Add(uint16(0), seg[recEnds[3]:recEnds[4]])
	f.Add(uint16(len(seg)), []byte("TMSPOOL1"))
	f.Add(uint16(len(seg)), []byte("TMSPOOL2 a newer agent's segment"))
	// A whole, CRC-valid record for seq 6: kept, like any record that checks.
	forged := batch(6, "r")
	forged.Seq = 6
	rec, err := encodeRecord(forged)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint16(0), rec)
	f.Add(uint16(0), append(rec, 0xff))

	f.Fuzz(func(t *testing.T, cut uint16, tail []byte) {
		dir := t.TempDir()
		mangled := append(append([]byte{}, seg[:len(seg)-min(int(cut), len(seg))]...), tail...)
		for name, b := range files {
			if name == segName {
				b = mangled
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
				t.Fatal(err)
			}
		}
		lg, _ := testLogger(t)
		s, err := OpenWith(dir, 0, Options{Logger: lg})
		if v := segVersion(mangled); v != 0 && v != formatVersion {
			// The cut reached the magic and the tail names another format:
			// that is refused, not repaired, and the bytes stay as they were.
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Have != v {
				t.Fatalf("a segment naming spool format %d opened with err %v, want a FormatError", v, err)
			}
			if on, rerr := os.ReadFile(filepath.Join(dir, segName)); rerr != nil || !bytes.Equal(on, mangled) {
				t.Fatalf("a refused segment was changed on disk (%v)", rerr)
			}
			return
		}
		if err != nil {
			t.Fatalf("open failed on a mangled tail: %v", err)
		}
		defer s.Close()

		kept, err := os.ReadFile(filepath.Join(dir, segName))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err == nil {
			if !bytes.HasPrefix(mangled, kept) {
				t.Fatalf("kept %d bytes that are not a prefix of the %d on disk", len(kept), len(mangled))
			}
			_, hdr, ok := parseSegHeader(kept)
			if !ok {
				t.Fatalf("kept a segment whose header does not parse")
			}
			// Walked here independently of scanRecords: whole records, each
			// CRC32C over seq and payload matching, seqs increasing.
			var prev uint64
			for off := hdr; off < len(kept); {
				rest := kept[off:]
				if len(rest) < recHeader {
					t.Fatalf("kept a short record header at %d", off)
				}
				n := int(binary.LittleEndian.Uint32(rest[0:4]))
				if len(rest) < recHeader+n {
					t.Fatalf("kept a short record at %d", off)
				}
				if crc32.Checksum(rest[8:recHeader+n], crc32.MakeTable(crc32.Castagnoli)) != binary.LittleEndian.Uint32(rest[4:8]) {
					t.Fatalf("kept a record with a bad CRC at %d", off)
				}
				seq := binary.LittleEndian.Uint64(rest[8:16])
				if seq <= prev {
					t.Fatalf("kept seq %d after %d", seq, prev)
				}
				prev = seq
				off += recHeader + n
			}
		}
		got, err := s.Cursor(0).ReadAfter(0, math.MaxInt)
		if err != nil {
			t.Fatalf("reading back what was kept: %v", err)
		}
		if st := s.Stats(); st.Dropped != 0 {
			t.Fatalf("%d kept records did not read back", st.Dropped)
		}
		whole := 0
		for _, end := range recEnds {
			if end <= int64(len(seg)-min(int(cut), len(seg))) {
				whole++
			}
		}
		if len(got) < whole {
			t.Fatalf("kept %d records, but the cut left %d originals whole", len(got), whole)
		}
		for i := range whole {
			if got[i].Seq != uint64(i+1) || got[i].RunWindows[0].Tokens != uint64(i+1) {
				t.Fatalf("original record %d came back as seq %d", i+1, got[i].Seq)
			}
		}
		for i := 1; i < len(got); i++ {
			if got[i].Seq <= got[i-1].Seq {
				t.Fatalf("kept seqs out of order: %v", seqs(got))
			}
		}
		b := batch(99, "r")
		if err := s.Append(b); err != nil {
			t.Fatalf("append after open: %v", err)
		}
		if len(got) > 0 && b.Seq <= got[len(got)-1].Seq {
			t.Fatalf("next seq %d reuses a kept one (%v)", b.Seq, seqs(got))
		}
	})
}
