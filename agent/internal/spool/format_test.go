package spool

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dirFiles reads every file of dir but the lock, by name.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if e.Name() == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// A spool directory written by another spool format (a newer agent's, say)
// is refused with an error that names the directory, the file, both
// formats and the way out, and is left exactly as it was: its batches are
// neither discarded as corrupt nor overwritten.
func TestOpenRefusesAnotherSpoolFormat(t *testing.T) {
	for name, c := range map[string]struct {
		file string
		edit func(t *testing.T, dir string)
	}{
		"state file": {stateName, func(t *testing.T, dir string) {
			path := filepath.Join(dir, stateName)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			body, _, _ := bytes.Cut(b, []byte("\n"))
			v2 := bytes.Replace(body, []byte(`"version":1,`), []byte(`"version":2,`), 1)
			if bytes.Equal(v2, body) {
				t.Fatalf("no version in the state file: %s", body)
			}
			if err := os.WriteFile(path, fmt.Appendf(v2, "\n%08x\n", crc32.Checksum(v2, castagnoli)), 0o640); err != nil {
				t.Fatal(err)
			}
		}},
		"segment": {"seg-00000000000000000001.tms", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "seg-00000000000000000001.tms")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, append([]byte("TMSPOOL2"), b[len(segMagic):]...), 0o640); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 0, 4<<10)
			mustAppend(t, s, batch(1, "r"))
			mustAppend(t, s, batch(2, "r"))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			c.edit(t, dir)
			before := dirFiles(t, dir)
			for range 2 { // refused alike the second time: not left locked
				_, err := OpenWith(dir, 0, Options{})
				var fe *FormatError
				if !errors.As(err, &fe) {
					t.Fatalf("open: %v, want a *FormatError", err)
				}
				for _, want := range []string{"spool dir " + dir, filepath.Join(dir, c.file), "spool format 2", "this agent reads 1",
					"move it aside (its unsent batches are lost) or run the agent that wrote it"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			}
			if after := dirFiles(t, dir); !maps.Equal(before, after) {
				t.Errorf("the refused spool changed: files %v, were %v", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
			}
		})
	}
}
