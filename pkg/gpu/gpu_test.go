package gpu

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReadEachFailsOnlyWhenNoGPUGaveAValue(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	broken := errors.New("GPU is lost")
	dst := []Sample{{PowerW: 999, PowerOK: true}, {}}
	err := ReadEach("testgpu", now, dst, func(i int, s *Sample) {
		if i == 0 {
			s.Err = broken
			return
		}
		s.PowerW, s.PowerOK = 300, true
	})
	if err != nil {
		t.Fatalf("one card read: %v", err)
	}
	if dst[0].PowerOK || dst[0].PowerW != 0 || dst[0].Index != 0 || !dst[0].ReadAt.Equal(now) || dst[0].Err != broken {
		t.Fatalf("the failed card's sample keeps last tick's values or lacks its error: %+v", dst[0])
	}
	if dst[1].Index != 1 || dst[1].PowerW != 300 {
		t.Fatalf("card 1: %+v", dst[1])
	}

	err = ReadEach("testgpu", now, dst, func(i int, s *Sample) { s.Err = broken })
	if !errors.Is(err, broken) || !strings.HasPrefix(err.Error(), "testgpu: no GPU could be read") {
		t.Fatalf("no card read: %v", err)
	}
}
