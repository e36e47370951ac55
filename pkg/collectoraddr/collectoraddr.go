// Package collectoraddr checks a collector address as users type it
// (--collector, $TRAINMETER_COLLECTOR, the agent's collector:), so that a
// URL or a host without a port is refused with the fix, not a dial error
// about port 443 or "too many colons".
package collectoraddr

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultPort is the port `trainmeter serve` listens on by default.
const DefaultPort = "7433"

// grpcSchemes are gRPC target schemes that name no HTTP URL; an address
// with one is passed to gRPC as it is.
var grpcSchemes = []string{"dns:", "unix:", "unix-abstract:", "passthrough:"}

// Check returns nil for HOST:PORT (or a gRPC target such as dns:///HOST:PORT
// or unix:///PATH), else an error that says what to type instead.
func Check(addr string) error {
	if addr == "" {
		return fmt.Errorf("collector address is empty: give HOST:PORT, e.g. localhost:%s", DefaultPort)
	}
	for _, s := range grpcSchemes {
		if strings.HasPrefix(addr, s) {
			return nil
		}
	}
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		hostport := strings.TrimSuffix(rest, "/")
		if _, _, err := net.SplitHostPort(hostport); err != nil {
			hostport = net.JoinHostPort(hostport, DefaultPort)
		}
		tls := ""
		if strings.EqualFold(scheme, "https") || strings.EqualFold(scheme, "grpcs") {
			tls = "; for TLS add --tls-ca FILE (agent: tls_ca)"
		}
		return fmt.Errorf("collector address %q is a URL: give HOST:PORT without %s://, e.g. %s (gRPC, not HTTP)%s", addr, scheme, hostport, tls)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return fmt.Errorf("collector address %q has no port: give HOST:PORT, e.g. %s (trainmeter serve listens on port %s unless --listen says otherwise)",
				addr, net.JoinHostPort(strings.Trim(addr, "[]"), DefaultPort), DefaultPort)
		}
		return fmt.Errorf("collector address %q: want HOST:PORT, e.g. localhost:%s: %v", addr, DefaultPort, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("collector address %q: port %q is not a number from 1 to 65535 (trainmeter serve listens on port %s by default)", addr, port, DefaultPort)
	}
	_ = host // empty is fine: gRPC dials the local host, as net.Dial does
	return nil
}
