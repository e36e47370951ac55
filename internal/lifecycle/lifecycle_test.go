package lifecycle

import (
	"context"
	"errors"
	"testing"
)

func TestWait(t *testing.T) {
	done := make(chan struct{})
	close(done)
	if err := Wait(context.Background(), done, "x"); err != nil {
		t.Fatalf("closed done: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Wait(ctx, make(chan struct{}), "the sender"); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v, want context.Canceled", err)
	}
}
