package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/internal/pgtest"
)

// TestBytesArrayAsPgxWritesIt: PostgreSQL reads a bytesArray as the
// bytea[] pgx writes of the same [][]byte: elements, empty ones, NULLs,
// an empty array and a NULL one.
func TestBytesArrayAsPgxWritesIt(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := registerBytesArray(ctx, conn); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 70_000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for _, a := range [][][]byte{
		{[]byte("a"), {}, nil, []byte{0, 1, 255}, big},
		{[]byte("only")},
		{},
		nil,
	} {
		// The text form is what PostgreSQL makes of it; cardinality and
		// the NULL test say what the text form cannot.
		const q = `SELECT $1::bytea[]::text, cardinality($1::bytea[]), $1::bytea[] IS NULL, array_position($1::bytea[], NULL)`
		type row struct {
			Text    *string
			N       *int
			Null    bool
			NullPos *int
		}
		var got, want row
		if err := conn.QueryRow(ctx, q, bytesArray(a)).Scan(&got.Text, &got.N, &got.Null, &got.NullPos); err != nil {
			t.Fatalf("%d elements: %v", len(a), err)
		}
		if err := conn.QueryRow(ctx, q, a).Scan(&want.Text, &want.N, &want.Null, &want.NullPos); err != nil {
			t.Fatal(err)
		}
		if g, w := fmt.Sprint(show(got.Text), show(got.N), got.Null, show(got.NullPos)), fmt.Sprint(show(want.Text), show(want.N), want.Null, show(want.NullPos)); g != w {
			t.Errorf("%d elements: PostgreSQL read %s, from pgx's encoding %s", len(a), g, w)
		}
		var back [][]byte
		if err := conn.QueryRow(ctx, `SELECT $1::bytea[]`, bytesArray(a)).Scan(&back); err != nil {
			t.Fatal(err)
		}
		if len(back) != len(a) {
			t.Fatalf("%d elements read back as %d", len(a), len(back))
		}
		for i := range a {
			if !bytes.Equal(a[i], back[i]) || (a[i] == nil) != (back[i] == nil) {
				t.Errorf("element %d of %d read back as %q, sent %q", i, len(a), back[i], a[i])
			}
		}
	}
}

func show[T any](p *T) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}
