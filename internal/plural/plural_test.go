package plural

import "testing"

func TestN(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{N(1, "evaluation"), "1 evaluation"},
		{N(0, "evaluation"), "0 evaluations"},
		{N(2, "evaluation"), "2 evaluations"},
		{N(uint64(1), "batch"), "1 batch"},
		{N(uint32(3), "batch"), "3 batches"},
		{N(2, "GPU"), "2 GPUs"},
		{N(1, "price alert"), "1 price alert"},
		{N(int64(5), "process"), "5 processes"},
		{N(7, "epoch"), "7 epochs"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
