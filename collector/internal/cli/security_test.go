package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCLITokenNeedsTLSUnlessLoopback(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tok, []byte("cli-secret-abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		name, addr string
		sec        clientSecurity
		env        map[string]string
		wantErr    string
	}{
		{"file token to loopback", "127.0.0.1:7433", clientSecurity{tokenFile: tok}, nil, ""},
		{"env token to loopback", "localhost:7433", clientSecurity{}, map[string]string{EnvToken: "x"}, ""},
		{"file token to a remote plaintext collector", "10.0.0.5:7433", clientSecurity{tokenFile: tok}, nil, "refusing to send a token in plaintext"},
		{"env token to a remote plaintext collector", "collector:7433", clientSecurity{}, map[string]string{EnvToken: "x"}, "refusing to send a token in plaintext"},
		{"missing token file", "127.0.0.1:7433", clientSecurity{tokenFile: tok + ".nope"}, nil, "no such file"},
		{"no token, remote, plaintext", "collector:7433", clientSecurity{}, nil, ""},
	} {
		_, err := c.sec.dialOptions(c.addr, env(c.env))
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: err %v, want %q", c.name, err, c.wantErr)
		case err != nil && strings.Contains(err.Error(), "cli-secret-abc"):
			t.Errorf("%s: error shows the token", c.name)
		}
	}
}
