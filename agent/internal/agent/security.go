package agent

import (
	"log/slog"
	"slices"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/uplink"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// securityConfig sets the uplink's TLS credentials and ingest token from
// cfg. Both files are re-read when they change.
func securityConfig(cfg agentconfig.Config, u *uplink.Config, log *slog.Logger) error {
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
		remote := slices.ContainsFunc(cfg.Collectors(), func(a string) bool { return !tlsfiles.IsLoopback(a) })
		tok, err := tlsfiles.TokenFromFile(cfg.TokenFile, !secure && !remote, log)
		if err != nil {
			return err
		}
		u.Token = tok
	}
	return nil
}

// allowedUIDs is the socket's uid allow-list: the configured uids plus root,
// or nil (any uid the socket's permissions let in) when none are configured.
func allowedUIDs(cfg agentconfig.Config) []uint32 {
	if len(cfg.AllowedUIDs) == 0 {
		return nil
	}
	return append([]uint32{0}, cfg.AllowedUIDs...)
}
