package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// TestServer: a fresh database answers.
func TestServer(t *testing.T) {
	c, err := pgx.Connect(context.Background(), DB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(context.Background(), "SELECT 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("SELECT 1: %d %v", n, err)
	}
}
