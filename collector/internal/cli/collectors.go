package cli

// Several collectors (a pair): --collector A,B or repeated. A command uses
// the first that answers within --connect-timeout, in the order given, and
// says which on stderr with -v.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/trainmeter/trainmeter/pkg/collectoraddr"
)

// callEach runs a command that changes what a collector holds (a budget,
// a deletion) on every --collector address in turn, so that both of a pair
// keep the same budgets and runs; what it prints is shown for the first.
// One that fails does not stop the others; the error names which collectors
// have the change and which do not.
func (cf *clientFlags) callEach(cmd *cobra.Command, what string, fn func(context.Context, *grpc.ClientConn) error) error {
	addrs := cf.collectorAddrs()
	if len(addrs) == 1 {
		return cf.callConn(cmd, fn)
	}
	if err := cf.checkAddrs(); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	defer cmd.SetOut(out)
	var done, failed []string
	var errs []error
	for _, a := range addrs {
		one := *cf
		one.addrs = []string{a}
		if len(done) > 0 {
			cmd.SetOut(io.Discard)
		}
		if err := one.callConn(cmd, fn); err != nil {
			failed = append(failed, a)
			errs = append(errs, err)
			continue
		}
		done = append(done, a)
		if cf.verbose {
			fmt.Fprintf(cmd.ErrOrStderr(), "trainmeter: %s done on collector %s\n", what, a)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	if len(done) == 0 {
		return errors.Join(errs...)
	}
	return &partialError{what: what, done: done, failed: failed, err: errors.Join(errs...)}
}

// partialError: a change reached some collectors of a pair, not all.
type partialError struct {
	what         string
	done, failed []string
	err          error
}

func (e *partialError) Error() string {
	return fmt.Sprintf("%s done on %s but not on %s: %v; run it again with --collector %s once it answers, so that the pair agrees",
		e.what, strings.Join(e.done, ", "), strings.Join(e.failed, ", "), e.err, strings.Join(e.failed, ","))
}

func (e *partialError) Unwrap() error { return e.err }

// defaultConnectTimeout: a collector of a pair that has not connected in
// this long is taken as down. A collector that is up answers a connection in
// milliseconds even across regions; a refused connection fails at once.
const defaultConnectTimeout = 2 * time.Second

// collectorAddrs are the --collector addresses, trimmed.
func (cf *clientFlags) collectorAddrs() []string {
	out := make([]string, 0, len(cf.addrs))
	for _, a := range cf.addrs {
		out = append(out, strings.TrimSpace(a))
	}
	if len(out) == 0 {
		out = append(out, "")
	}
	return out
}

// checkAddrs refuses a malformed address before anything is dialled.
func (cf *clientFlags) checkAddrs() error {
	for _, a := range cf.collectorAddrs() {
		if err := collectoraddr.Check(a); err != nil {
			return fmt.Errorf("%w (--collector or $%s)", err, EnvCollector)
		}
	}
	return nil
}

// dial returns a connection to the first collector that answers. With one
// address nothing is waited for: the request's own deadline and error apply.
func (cf *clientFlags) dial(ctx context.Context, stderr io.Writer) (*grpc.ClientConn, error) {
	addrs := cf.collectorAddrs()
	cf.addr = addrs[0]
	if len(addrs) == 1 {
		conn, err := cf.dialOne(addrs[0])
		if err == nil && cf.verbose {
			fmt.Fprintf(stderr, "trainmeter: collector %s\n", addrs[0])
		}
		return conn, err
	}
	if err := cf.checkAddrs(); err != nil {
		return nil, err
	}
	timeout := cf.connectTimeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	var failed []string
	for _, a := range addrs {
		conn, err := cf.dialOne(a)
		if err != nil {
			return nil, err
		}
		err = waitReady(ctx, conn, timeout)
		if err == nil {
			cf.addr = a
			if cf.verbose {
				fmt.Fprintf(stderr, "trainmeter: collector %s (the first of %s that answered)\n", a, strings.Join(addrs, ", "))
			}
			return conn, nil
		}
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cf.verbose {
			fmt.Fprintf(stderr, "trainmeter: collector %s %v; trying the next\n", a, err)
		}
		failed = append(failed, a+" "+err.Error())
	}
	return nil, fmt.Errorf("no collector answered (is `trainmeter serve` running? set --collector or $%s): %s",
		EnvCollector, strings.Join(failed, "; "))
}

func (cf *clientFlags) dialOne(addr string) (*grpc.ClientConn, error) {
	opts, err := cf.security.dialOptions(addr, cf.getenv)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("collector address %q: %w", addr, err)
	}
	return conn, nil
}

// waitReady connects and waits until the connection is up, it fails, or
// timeout passes.
func waitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return errors.New("refused the connection or failed the handshake")
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("did not answer within %v", timeout)
			}
		}
	}
}
