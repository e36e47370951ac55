package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/collectoraddr"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// clientSecurity is the CLI's TLS and token settings.
type clientSecurity struct {
	tls       tlsfiles.ClientOptions
	tokenFile string
}

func (s *clientSecurity) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.tls.CAFile, "tls-ca", "", "verify the collector's certificate with this PEM CA bundle (implies TLS)")
	f.StringVar(&s.tls.CertFile, "tls-cert", "", "client certificate for mTLS (PEM; implies TLS)")
	f.StringVar(&s.tls.KeyFile, "tls-key", "", "private key of --tls-cert")
	f.StringVar(&s.tls.ServerName, "tls-server-name", "", "name to check in the collector's certificate (default: the host of --collector; implies TLS)")
	f.StringVar(&s.tokenFile, "token-file", "", "file with the query token (read or admin); default $"+EnvToken)
}

// dialOptions returns the transport and per-RPC credentials. A token needs
// TLS unless the collector is on a loopback address.
func (s *clientSecurity) dialOptions(addr string, getenv func(string) string) ([]grpc.DialOption, error) {
	if err := collectoraddr.Check(addr); err != nil {
		return nil, fmt.Errorf("%w (--collector or $%s)", err, EnvCollector)
	}
	secure := s.tls.Enabled()
	creds := insecure.NewCredentials()
	var err error
	if secure {
		if creds, err = tlsfiles.ClientCredentials(s.tls, nil); err != nil {
			return nil, err
		}
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	var tok credentials.PerRPCCredentials
	switch {
	case s.tokenFile != "":
		tok, err = tlsfiles.TokenFromFile(s.tokenFile, !secure && tlsfiles.IsLoopback(addr), nil)
	case getenv != nil && getenv(EnvToken) != "":
		tok, err = tlsfiles.StaticToken(getenv(EnvToken), !secure && tlsfiles.IsLoopback(addr))
	}
	if err != nil {
		return nil, err
	}
	if tok != nil {
		if !secure && !tlsfiles.IsLoopback(addr) {
			host, _, _ := net.SplitHostPort(addr)
			return nil, fmt.Errorf("refusing to send a token in plaintext to %s: set --tls-ca (tokens without TLS only go to a loopback collector)", host)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tok))
	}
	return opts, nil
}

func newDeleteRunCommand(cf *clientFlags) *cobra.Command {
	var force, yes bool
	c := &cobra.Command{
		Use:   "delete-run RUN_ID",
		Short: "Delete a run's figures and raw data from the collector (needs the admin token when the collector has tokens)",
		Long: `Delete a run's figures and raw data from the collector. A run that is still
running is refused: --force ends it at the collector first and drops the data its
agents send for it afterwards (its trainers are not stopped). The GPU time, energy
and cost of the run stay in 'trainmeter usage' as a "(deleted)" row that names no
run: its nodes used them, and the rows add up to the nodes. On a terminal it asks
for confirmation (--yes skips the question).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.callEach(cmd, "delete-run", func(ctx context.Context, conn *grpc.ClientConn) error {
				c := trainmeterv1.NewQueryServiceClient(conn)
				if !yes && isTerminalReader(cmd.InOrStdin()) {
					what := "run " + args[0]
					if r, err := c.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: args[0]}); err == nil {
						rep := r.GetRun()
						what = fmt.Sprintf("run %s (%s, %s, %d tokens)", args[0], report.EndStatus(rep), report.Duration(rep.GetWallS()), rep.GetTokensProcessed())
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "delete %s and its raw data? [y/N] ", what)
					answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
					if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
						return errors.New("not deleted")
					}
					yes = true // asked once, for every collector of a pair
				}
				resp, err := c.DeleteRun(ctx, &trainmeterv1.DeleteRunRequest{RunId: args[0], Force: force})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted run %s (%s)\n", args[0], plural.N(resp.GetRecordsDeleted(), "raw record"))
				return nil
			})
		},
	}
	c.Flags().BoolVar(&force, "force", false, "delete a run that is still running: end it at the collector first, drop its later data")
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation on a terminal")
	return c
}

// isTerminalReader reports whether r is a terminal (stdin of a person).
func isTerminalReader(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && isTTY(f)
}
