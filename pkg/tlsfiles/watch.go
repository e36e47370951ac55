// Package tlsfiles loads TLS certificates, CA bundles and other secrets
// (token files) from files and reloads them when the files change, without a
// restart. A reload is checked lazily: every Get (on each TLS handshake, on
// each authenticated RPC) stats the files and re-reads them only when one's
// modification time, size or inode changed. A file that cannot be read or
// parsed after a change (say a certificate already replaced but its key not
// yet) keeps the last good value in use; the next Get tries again.
//
// The package is pure Go (no cgo, no NVML): the collector and the agent both
// use it.
package tlsfiles

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// stamp is what tells a file's change: modification time (ns), size and
// inode, or the error of its stat.
type stamp struct {
	mod   int64
	size  int64
	inode uint64
	err   string
}

func stat(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{err: err.Error()}
	}
	st := stamp{mod: fi.ModTime().UnixNano(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.inode = uint64(sys.Ino)
	}
	return st
}

// Watched is a value loaded from files and reloaded when they change. It is
// safe for concurrent use.
type Watched[T any] struct {
	what  string
	paths []string
	load  func() (T, error)
	log   *slog.Logger

	mu     sync.Mutex
	stamps []stamp
	val    T
	failed bool // the last reload attempt failed (logged once per change)
}

// Watch loads a value with load, which reads paths, and returns a Watched
// that reloads it when any of paths changes. The first load must succeed.
// what names the value in log lines (never its content). A nil log discards its logs.
func Watch[T any](what string, paths []string, load func() (T, error), log *slog.Logger) (*Watched[T], error) {
	if len(paths) == 0 {
		return nil, errors.New("tlsfiles: no files to watch")
	}
	w := &Watched[T]{what: what, paths: paths, load: load, log: cmp.Or(log, slog.New(slog.DiscardHandler))}
	w.stamps = w.stat()
	v, err := load()
	if err != nil {
		return nil, err
	}
	w.val = v
	return w, nil
}

func (w *Watched[T]) stat() []stamp {
	out := make([]stamp, len(w.paths))
	for i, p := range w.paths {
		out[i] = stat(p)
	}
	return out
}

// Get returns the current value, reloading it first if a file changed since
// the last load. A failed reload keeps the previous value.
func (w *Watched[T]) Get() T {
	now := w.stat()
	w.mu.Lock()
	defer w.mu.Unlock()
	if slices.Equal(now, w.stamps) {
		return w.val
	}
	v, err := w.load()
	if err != nil {
		if !w.failed {
			w.log.Warn("reloading "+w.what+" failed; keeping the previous one", "files", w.paths, "err", err)
		}
		w.failed = true
		// Remember the stamps so that an unchanged broken file is not
		// re-read (and re-logged) on every call; the next change retries.
		w.stamps = now
		return w.val
	}
	w.val, w.stamps, w.failed = v, now, false
	w.log.Info("reloaded "+w.what, "files", w.paths)
	return w.val
}

// ReadSecretFile reads a secret (a token) from path: the file's content with
// surrounding whitespace removed. An empty file is an error. The error never
// contains the content.
func ReadSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.Trim(string(b), " \t\n\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}
