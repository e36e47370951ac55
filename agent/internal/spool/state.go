package spool

// The state file (layout in spool.go).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type stateJSON struct {
	Version uint32 `json:"version"` // formatVersion
	BootID  string `json:"boot_id"`
	NextSeq uint64 `json:"next_seq"`
	// SeqReserved: no seq at or above it was handed out. After data was
	// lost at open (a torn tail, a discarded segment) the spool continues
	// here, so a seq the collector may already hold is never reused.
	SeqReserved uint64            `json:"seq_reserved"`
	Losses      []json.RawMessage `json:"losses,omitempty"` // protojson-free: see lossJSON
	SeqLosses   []json.RawMessage `json:"seq_losses,omitempty"`
	Events      [][]byte          `json:"events,omitempty"` // RunEvent protos
	// Collectors names the cursors, in ack-log order (cursor.go); absent
	// when the spool was opened without names: one cursor.
	Collectors []string `json:"collectors,omitempty"`
}

// lossJSON is a DataLoss in the state file, field for field; Collectors is
// spool_collectors (0: all of them).
type lossJSON struct {
	RunID            string     `json:"run_id"`
	Batches          uint64     `json:"batches"`
	Tokens           uint64     `json:"tokens"`
	EnergyJ          float64    `json:"energy_j"`
	GPUSeconds       float64    `json:"gpu_seconds"`
	Reason           string     `json:"reason"`
	Seq              uint64     `json:"seq,omitempty"`
	Collectors       uint32     `json:"collectors,omitempty"`
	WindowStart      *time.Time `json:"window_start,omitempty"`
	HostEnergyJ      float64    `json:"host_energy_j,omitempty"`
	IdleEnergyJ      float64    `json:"idle_energy_j,omitempty"`
	IdleGPUSeconds   float64    `json:"idle_gpu_seconds,omitempty"`
	IdleHostEnergyJ  float64    `json:"idle_host_energy_j,omitempty"`
	FirstWindowStart *time.Time `json:"first_window_start,omitempty"`
}

func decodeLoss(raw json.RawMessage) *trainmeterv1.DataLoss {
	var l lossJSON
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	d := &trainmeterv1.DataLoss{RunId: l.RunID, Batches: l.Batches, Tokens: l.Tokens, EnergyJ: l.EnergyJ,
		GpuSeconds: l.GPUSeconds, Reason: l.Reason, Seq: l.Seq, SpoolCollectors: l.Collectors, HostEnergyJ: l.HostEnergyJ,
		IdleEnergyJ: l.IdleEnergyJ, IdleGpuSeconds: l.IdleGPUSeconds, IdleHostEnergyJ: l.IdleHostEnergyJ}
	d.WindowStart, d.FirstWindowStart = tsOf(l.WindowStart), tsOf(l.FirstWindowStart)
	return d
}

func encodeLoss(l *trainmeterv1.DataLoss) json.RawMessage {
	j := lossJSON{RunID: l.RunId, Batches: l.Batches, Tokens: l.Tokens, EnergyJ: l.EnergyJ,
		GPUSeconds: l.GpuSeconds, Reason: l.Reason, Seq: l.Seq, Collectors: l.SpoolCollectors, HostEnergyJ: l.HostEnergyJ,
		IdleEnergyJ: l.IdleEnergyJ, IdleGPUSeconds: l.IdleGpuSeconds, IdleHostEnergyJ: l.IdleHostEnergyJ}
	j.WindowStart, j.FirstWindowStart = timeOf(l.WindowStart), timeOf(l.FirstWindowStart)
	b, _ := json.Marshal(j)
	return b
}

func tsOf(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func timeOf(ts *timestamppb.Timestamp) *time.Time {
	if ts == nil {
		return nil
	}
	t := ts.AsTime()
	return &t
}

func readState(path string) (*stateJSON, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	body, sum, ok := bytes.Cut(bytes.TrimRight(b, "\n"), []byte("\n"))
	if !ok {
		return nil, errors.New("no checksum line")
	}
	want, err := strconv.ParseUint(string(sum), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("checksum line %q", sum)
	}
	if crc32.Checksum(body, castagnoli) != uint32(want) {
		return nil, errors.New("checksum mismatch")
	}
	st := &stateJSON{}
	if err := json.Unmarshal(body, st); err != nil {
		return nil, err
	}
	if st.Version == formatVersion && st.BootID == "" {
		return nil, errors.New("no boot id")
	}
	return st, nil
}

func removeTemps(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
}

// writeFileAtomic writes temp, fsyncs, renames and fsyncs the directory.
func (s *Spool) writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := s.openFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// writeState persists the state. On a full disk it makes room by dropping
// the oldest segment (the spool is what fills the disk) and tries once more,
// but never the newest segment: it holds the next seq and any loss report
// just written, which is what the state would say.
func (s *Spool) writeState() error {
	err := s.writeStateOnce()
	if err != nil && isNoSpace(err) && !s.inStateWrite && len(s.segs) > 1 {
		s.stats.ENOSPC++
		s.inStateWrite = true
		s.evictOldest(s.dropReason())
		s.inStateWrite = false
		err = s.writeStateOnce()
	}
	return err
}

// saveState is writeState for callers that carry on when it fails.
func (s *Spool) saveState() {
	if err := s.writeState(); err != nil {
		s.log.Error("spool: writing the state file", "err", err)
	}
}

// dropReason names why old batches go: the configured bound, or a disk that
// filled up before it.
func (s *Spool) dropReason() string {
	if s.effMax < s.maxBytes {
		return "disk full"
	}
	return "spool full"
}

func (s *Spool) writeStateOnce() error {
	if s.reserved <= s.nextSeq {
		s.reserved = s.nextSeq + seqReserve
	}
	st := stateJSON{Version: formatVersion, BootID: s.bootID, NextSeq: s.nextSeq, SeqReserved: s.reserved, Collectors: s.names}
	for _, l := range s.sortedLosses() {
		st.Losses = append(st.Losses, encodeLoss(l))
	}
	for _, l := range s.seqLosses {
		st.SeqLosses = append(st.SeqLosses, encodeLoss(l))
	}
	for _, e := range s.events {
		b, err := proto.Marshal(e)
		if err == nil {
			st.Events = append(st.Events, b)
		}
	}
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	out := fmt.Appendf(body, "\n%08x\n", crc32.Checksum(body, castagnoli))
	return s.writeFileAtomic(filepath.Join(s.dir, stateName), out)
}
