//go:build !linux

package clock

import "time"

func newThreadPacer(time.Duration) Pacer { return nil }
