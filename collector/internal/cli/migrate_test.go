package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/store"
)

// migrate refuses what it cannot move, before touching any database: a
// missing or empty directory (opening one would make a store of it), a
// URL that is not PostgreSQL's, a directory a collector holds open.
func TestMigrateRefuses(t *testing.T) {
	held := t.TempDir()
	st, err := store.Open(held, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pg := "postgres://u@127.0.0.1:1/db"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", filepath.Join(t.TempDir(), "nope"), "--to", pg}, "no such file or directory"},
		{[]string{"--from", t.TempDir(), "--to", pg}, "is empty: not a collector's data directory"},
		{[]string{"--from", held, "--to", "mysql://u@h/db"}, "a PostgreSQL URL"},
		{[]string{"--from", held, "--to", pg}, held + " is in use: a collector (trainmeter serve) is running on it; stop it"},
		{[]string{"--to", pg}, `required flag(s) "from" not set`},
	} {
		out, err := run(t, nil, append([]string{"migrate"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("migrate %v: %v (%s), want an error with %q", c.args, err, out, c.want)
		}
	}
}
