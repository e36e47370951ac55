package server

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/trainmeter/trainmeter/collector/internal/auth"
	"github.com/trainmeter/trainmeter/collector/internal/console"
)

// DefaultUIListen is the web console's default address (loopback, next to
// DefaultListen).
const DefaultUIListen = console.DefaultListen

func (c Config) validateUI() error {
	if c.UIListen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.UIListen); err != nil {
		return fmt.Errorf("ui listen address %q: %v", c.UIListen, err)
	}
	if _, port, _ := net.SplitHostPort(c.UIListen); c.UIListen == c.Listen && port != "0" {
		return fmt.Errorf("ui listen address %q is the query listen address; give the console its own port", c.UIListen)
	}
	return nil
}

// newConsole builds the web console on the collector's own services, with
// the query API's TLS files and token checker; nil when it is off.
func (s *Server) newConsole(a *auth.Auth, services console.Services) (*console.Console, error) {
	if s.cfg.UIListen == "" {
		return nil, nil
	}
	return console.New(console.Config{Listen: s.cfg.UIListen, TLS: s.cfg.TLSOptions(), Auth: a, Services: services, Clock: s.cfg.Clock}, s.log)
}

// startConsole starts ui. The default address taken (a second collector on
// the machine, parallel tests) leaves the collector without a console and
// says so; an address asked for that cannot be bound is an error.
func (s *Server) startConsole(ctx context.Context, ui *console.Console) (*console.Console, error) {
	if ui == nil {
		return nil, nil
	}
	err := ui.Start(ctx)
	if err == nil {
		return ui, nil
	}
	var op *net.OpError
	if s.cfg.UIListenDefault && errors.As(err, &op) {
		s.log.Warn("web console off: its default address is taken; set --ui-listen HOST:PORT (or \"\" to silence this)", "addr", s.cfg.UIListen, "err", err)
		return nil, nil
	}
	return nil, err
}

// ConsoleAddr is the web console's address, nil when it is off.
func (s *Server) ConsoleAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ui == nil {
		return nil
	}
	return s.ui.Addr()
}
