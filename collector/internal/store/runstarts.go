package store

import (
	"bytes"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// maxCachedStarts bounds the decoded run starts kept (a few hundred bytes
// each); past it the cache starts over.
const maxCachedStarts = 1 << 17

// startCache keeps each run's decoded run_start with the bytes it was
// decoded from. Usage reads the run start of every run of its period on
// each call, and a run start rarely changes after its run began: a run
// whose stored bytes are those of the cached start gets it without
// decoding again. The bytes are the key, so a changed start (a resumed
// run, an id reused after a delete) is decoded afresh; no write has to
// invalidate anything.
type startCache struct {
	mu sync.Mutex
	m  map[string]cachedStart
}

type cachedStart struct {
	raw []byte
	st  *trainmeterv1.RunStart
}

// runStart is runStartOf(v) for run id, from the cache when v's run_start
// is what was decoded before. The start returned may be shared with other
// callers: it must not be changed.
func (c *startCache) runStart(id string, v []byte) (*trainmeterv1.RunStart, error) {
	raw, one := onlyRunStart(v)
	if !one {
		return runStartOf(v)
	}
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.st, nil
	}
	st := &trainmeterv1.RunStart{}
	if err := proto.Unmarshal(raw, st); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedStarts {
		c.m = map[string]cachedStart{}
	}
	c.m[id] = cachedStart{raw: bytes.Clone(raw), st: st}
	c.mu.Unlock()
	return st, nil
}

// onlyRunStart is the bytes of an encoded Aggregate's run_start when it
// holds exactly one occurrence of it (one false otherwise: none, several
// to merge, or bytes that do not parse, which runStartOf reports).
func onlyRunStart(v []byte) (raw []byte, one bool) {
	n := 0
	for len(v) > 0 {
		num, typ, l := protowire.ConsumeTag(v)
		if l < 0 {
			return nil, false
		}
		v = v[l:]
		if num == aggRunStart && typ == protowire.BytesType {
			b, l := protowire.ConsumeBytes(v)
			if l < 0 {
				return nil, false
			}
			raw, n, v = b, n+1, v[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(num, typ, v)
		if l < 0 {
			return nil, false
		}
		v = v[l:]
	}
	return raw, n == 1
}
