package collectoraddr

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"localhost:7433", "127.0.0.1:1", "[::1]:7433", "collector.example.com:443", "dns:///collector:7433", "unix:///run/c.sock"} {
		if err := Check(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for addr, want := range map[string]string{
		"localhost":                  `collector address "localhost" has no port: give HOST:PORT, e.g. localhost:7433`,
		"::1":                        `collector address "::1": want HOST:PORT`,
		"[::1]":                      `has no port: give HOST:PORT, e.g. [::1]:7433`,
		"http://localhost:7433":      `collector address "http://localhost:7433" is a URL: give HOST:PORT without http://, e.g. localhost:7433`,
		"http://localhost":           `without http://, e.g. localhost:7433`,
		"https://c.example.com:443/": `without https://, e.g. c.example.com:443 (gRPC, not HTTP); for TLS add --tls-ca FILE`,
		"localhost:http":             `port "http" is not a number`,
		"localhost:0":                `port "0" is not a number from 1 to 65535`,
		"":                           `collector address is empty`,
	} {
		err := Check(addr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", addr, err, want)
		}
	}
}
