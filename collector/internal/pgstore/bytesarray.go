package pgstore

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// bytesArray is a bytea[] parameter, encoded in one pass into a buffer
// grown once to its size. pgx encodes a [][]byte by reflection, element by
// element into a buffer it doubles from 256 bytes for every statement: at
// a group's raw records and aggregates that was a fifth of the
// collector's allocations, and its garbage collection a large part of its
// CPU on PostgreSQL. A nil element is NULL, as pgx has it.
type bytesArray [][]byte

// registerBytesArray makes conn's type map encode bytesArray (pgxpool's
// AfterConnect: each connection has a map of its own).
func registerBytesArray(_ context.Context, conn *pgx.Conn) error {
	m := conn.TypeMap()
	t, ok := m.TypeForOID(pgtype.ByteaArrayOID)
	if !ok {
		return fmt.Errorf("pgstore: pgx has no bytea[] type")
	}
	m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: bytesArrayCodec{t.Codec}})
	return nil
}

// bytesArrayCodec is bytea[]'s codec that also encodes bytesArray.
type bytesArrayCodec struct{ pgtype.Codec }

func (c bytesArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(bytesArray); ok && format == pgtype.BinaryFormatCode {
		return bytesArrayPlan{}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

type bytesArrayPlan struct{}

// Encode writes PostgreSQL's binary array format: dimensions, a has-null
// flag, the element type, each dimension's length and lower bound, then
// each element as its length (-1: NULL) and bytes.
func (bytesArrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	a := value.(bytesArray)
	if a == nil {
		return nil, nil // NULL, as pgx writes a nil slice
	}
	size := 12
	if len(a) > 0 {
		size += 8
	}
	hasNull := int32(0)
	for _, e := range a {
		size += 4 + len(e)
		if e == nil {
			hasNull = 1
		}
	}
	if free := cap(buf) - len(buf); free < size {
		grown := make([]byte, len(buf), len(buf)+size)
		copy(grown, buf)
		buf = grown
	}
	dims := int32(0)
	if len(a) > 0 {
		dims = 1
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(dims))
	buf = binary.BigEndian.AppendUint32(buf, uint32(hasNull))
	buf = binary.BigEndian.AppendUint32(buf, pgtype.ByteaOID)
	if len(a) > 0 {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(a)))
		buf = binary.BigEndian.AppendUint32(buf, 1)
	}
	for _, e := range a {
		if e == nil {
			buf = binary.BigEndian.AppendUint32(buf, 0xFFFFFFFF)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e)))
		buf = append(buf, e...)
	}
	return buf, nil
}
