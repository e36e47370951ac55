package agent

import (
	"log/slog"

	"github.com/trainmeter/trainmeter/agent/internal/uplink"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// securityConfig sets the uplink's TLS credentials and ingest token from
// cfg. Both files are re-read when they change.
func securityConfig(cfg Config, u *uplink.Config, log *slog.Logger) error {
	secure := cfg.TLSOptions().Enabled()
	if secure {
		creds, err := tlsfiles.ClientCredentials(cfg.TLSOptions(), log)
		if err != nil {
			return err
		}
		u.Creds = creds
	}
	if cfg.TokenFile != "" {
		// Validate refused a token over plaintext to another machine.
		tok, err := tlsfiles.TokenFromFile(cfg.TokenFile, !secure && allLoopback(cfg.Collectors()), log)
		if err != nil {
			return err
		}
		u.Token = tok
	}
	return nil
}

// allowedUIDs is the socket's uid allow-list: the configured uids plus root,
// or nil (any uid the socket's permissions let in) when none are configured.
func allowedUIDs(cfg Config) []uint32 {
	if len(cfg.AllowedUIDs) == 0 {
		return nil
	}
	return append([]uint32{0}, cfg.AllowedUIDs...)
}

// allLoopback: every collector is on this machine (a token may then go
// without TLS).
func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		if !tlsfiles.IsLoopback(a) {
			return false
		}
	}
	return true
}
