// Package cli implements the trainmeter command: `serve` runs the
// collector; `migrate` moves its data directory into PostgreSQL; `run`
// wraps a training command and shows its cost live; every other command (runs, report, summary, model, export, nodes, usage,
// delete-run, recommend, budget, alerts, forecast, prices, estimate,
// compare) is a client of a collector over gRPC; only serve and migrate
// open a database. docs/cli.md describes each.
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/collectorconfig"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/collector/internal/rpcerr"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/collector/internal/when"
	"github.com/trainmeter/trainmeter/internal/buildinfo"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// EnvCollector names the environment variable with the default collector address.
const EnvCollector = "TRAINMETER_COLLECTOR"

// EnvToken names the environment variable with the query token (read or
// admin), used when --token-file is not given.
const EnvToken = "TRAINMETER_TOKEN"

// Main runs the command with the process's arguments and returns the exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := NewRootCommand(os.Getenv)
	cmd.SetArgs(os.Args[1:])
	if err := cmd.ExecuteContext(ctx); err != nil {
		var exit *ExitError // `trainmeter run`: the command's own exit code
		if errors.As(err, &exit) {
			return exit.Code
		}
		fmt.Fprintln(os.Stderr, "trainmeter:", err)
		return 1
	}
	return 0
}

// NewRootCommand builds the trainmeter command tree. getenv supplies
// environment variables (os.Getenv in main; a map in tests).
func NewRootCommand(getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "trainmeter",
		Short:         "Measure what training a model costs: energy, tokens, time and money per run",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Version(),
	}
	root.AddCommand(newServeCommand(getenv), newMigrateCommand())
	cf := &clientFlags{getenv: getenv}
	defaultAddr := cmp.Or(getenv(EnvCollector), server.DefaultListen)
	for _, c := range []*cobra.Command{newRunsCommand(cf), newReportCommand(cf), newSummaryCommand(cf), newModelCommand(cf), newExportCommand(cf), newNodesCommand(cf), newUsageCommand(cf), newDeleteRunCommand(cf), newRepriceCommand(cf), newRunCommand(cf),
		newRecommendCommand(cf), newBudgetCommand(cf), newAlertsCommand(cf), newForecastCommand(cf), newPricesCommand(cf),
		newEstimateCommand(cf), newCompareCommand(cf)} {
		// Persistent, so that `export csv` inherits them.
		c.PersistentFlags().StringSliceVar(&cf.addrs, "collector", strings.Split(defaultAddr, ","),
			"collector address HOST:PORT; several (repeat, or A,B: a pair) are tried in order and the first that answers is used (default from $"+EnvCollector+")")
		c.PersistentFlags().DurationVar(&cf.connectTimeout, "connect-timeout", defaultConnectTimeout, "with several --collector addresses: how long to wait for one to answer before trying the next")
		c.PersistentFlags().BoolVarP(&cf.verbose, "verbose", "v", false, "say on stderr which collector answered")
		c.PersistentFlags().DurationVar(&cf.timeout, "timeout", 10*time.Second, "deadline for the request")
		cf.security.addFlags(c.PersistentFlags())
		root.AddCommand(c)
	}
	return root
}

func newServeCommand(getenv func(string) string) *cobra.Command {
	cfg := collectorconfig.Default()
	var configFile string
	var check bool
	var otelFlags *otelexport.Flags
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the collector (--config collector.yaml; flags given override the file)",
		Long: `Run the collector. Its configuration is collector.yaml (--config; every key in
docs/config.md); a flag given on the command line overrides the file's key.
--check validates the file and the flags, reads the files they name, prints OK
and exits 0, or lists every problem and exits 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ferr := collectorconfig.Resolve(cmd.Flags(), configFile, &cfg)
			if err := otelFlags.Apply(); err != nil {
				ferr = errors.Join(ferr, err)
			}
			sc, err := cfg.Check(getenv)
			if err = errors.Join(ferr, err); err != nil {
				return err
			}
			sc.UIListenDefault = sc.UIListenDefault && !cmd.Flags().Changed("ui-listen")
			if check {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: OK\n", cmp.Or(configFile, "flags"))
				return nil
			}
			var lvl slog.Level
			_ = lvl.UnmarshalText([]byte(cfg.Server.LogLevel)) // checked above
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			if err := applyMemoryLimit(cfg.Server.MemoryLimitMiB, getenv, log); err != nil {
				return err
			}
			srv := server.New(sc, log)
			if err := srv.Start(cmd.Context()); err != nil {
				return err
			}
			<-cmd.Context().Done()
			log.Info("shutting down")
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
			defer cancel()
			return srv.Shutdown(ctx)
		},
	}
	f := c.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file (docs/config.md); flags given on the command line override it")
	f.BoolVar(&check, "check", false, "validate the config file and flags, print OK and exit (1 and every problem when invalid)")
	otelFlags = collectorconfig.BindFlags(f, &cfg)
	return c
}

// applyMemoryLimit sets the Go runtime's soft memory limit: the collector
// collects garbage more often as its heap nears it, and exceeds it when its
// live data needs more (it is not a cap that fails allocations). GOMEMLIMIT,
// when set, wins: it is the runtime's own knob.
func applyMemoryLimit(mib int64, getenv func(string) string, log *slog.Logger) error {
	if mib < 0 {
		return fmt.Errorf("--memory-limit-mib must be >= 0 (0: no limit), got %d", mib)
	}
	if getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", getenv("GOMEMLIMIT"))
		return nil
	}
	if mib > 0 {
		debug.SetMemoryLimit(mib << 20)
	}
	return nil
}

type clientFlags struct {
	// addrs are the --collector addresses; addr is the one in use (the
	// first that answered), named in errors.
	addrs          []string
	addr           string
	connectTimeout time.Duration
	verbose        bool
	timeout        time.Duration
	security       clientSecurity
	getenv         func(string) string
}

// call dials the collector and runs fn with a query client under the timeout.
func (cf *clientFlags) call(cmd *cobra.Command, fn func(context.Context, trainmeterv1.QueryServiceClient) error) error {
	return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
		return fn(ctx, trainmeterv1.NewQueryServiceClient(conn))
	})
}

// callConn is call for commands that use more than the QueryService.
func (cf *clientFlags) callConn(cmd *cobra.Command, fn func(context.Context, *grpc.ClientConn) error) error {
	ctx := cmd.Context() // cobra's Execute sets one
	conn, err := cf.dial(ctx, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer conn.Close()
	if cf.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cf.timeout)
		defer cancel()
	}
	return cf.explain(fn(ctx, conn))
}

func (cf *clientFlags) explain(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		return errors.New(st.Message())
	case codes.Unavailable:
		if rpcerr.FromUpstream(st) { // the collector answered: a service behind it failed
			return fmt.Errorf("collector at %s: %s (retry later)", cf.addr, st.Message())
		}
		return fmt.Errorf("cannot reach the collector at %s (is `trainmeter serve` running? set --collector or $%s): %s", cf.addr, EnvCollector, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("the collector at %s did not answer within %v", cf.addr, cf.timeout)
	case codes.Unauthenticated:
		return fmt.Errorf("the collector at %s refused the request: %s (give a token with --token-file or $%s)", cf.addr, st.Message(), EnvToken)
	case codes.PermissionDenied:
		return fmt.Errorf("the collector at %s refused the request: %s", cf.addr, st.Message())
	case codes.InvalidArgument, codes.FailedPrecondition, codes.AlreadyExists:
		// The collector's message says what is wrong and what to do; the
		// code's name adds nothing for a user.
		return fmt.Errorf("collector at %s: %s", cf.addr, st.Message())
	}
	return fmt.Errorf("collector at %s: %s: %s", cf.addr, st.Code(), st.Message())
}

func newRunsCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	var f runFilter
	var since string
	var labels []string
	c := &cobra.Command{
		Use:   "runs",
		Short: "List runs, oldest first (--json: every figure of every run; filters: --model, --status, --since, --label)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if f.since, err = parseWhen("since", since, time.Now()); err != nil {
				return err
			}
			if f.labels, err = parseLabels("--label", labels); err != nil {
				return err
			}
			if f.status != "" && !validStatusFilter(f.status) {
				return fmt.Errorf("--status %q: want running, ended, failed, or an end status (ok, error, exit, exit N, signal, signal NAME, stopped, stopped: CAUSE, lost)", f.status)
			}
			return cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
				all, err := allRuns(ctx, c)
				runs := f.apply(all)
				return show(cmd.OutOrStdout(), asJSON, &trainmeterv1.ListRunsResponse{Runs: runs}, err, func(w io.Writer) error {
					if len(runs) == 0 {
						if len(all) == 0 {
							fmt.Fprintln(w, "no runs yet")
						} else {
							fmt.Fprintf(w, "no runs match the filters (%s stored)\n", plural.N(len(all), "run"))
						}
						return nil
					}
					return report.WriteTable(w, runs)
				})
			})
		},
	}
	fl := c.Flags()
	fl.BoolVar(&asJSON, "json", false, "print the runs as JSON ({\"runs\": [...]}, each as report --json)")
	fl.StringVar(&f.model, "model", "", "only runs of this model")
	fl.StringVar(&f.status, "status", "", "only runs with this status: running, ended, failed (error, exit N, signal, lost), or an end status (ok, exit 3, signal, stopped, lost, ...)")
	fl.StringVar(&since, "since", "", "only runs started at or after this: a duration back from now (24h, 90m, 7d) or a time (2025-03-01, 2025-03-01T12:00:00Z)")
	fl.StringArrayVar(&labels, "label", nil, "only runs with this label KEY=VALUE (repeatable: all must match)")
	return c
}

// statusWords are the --status values that are not a whole end status:
// the run's state, failed runs, or a family of end statuses.
var statusWords = map[string]bool{"running": true, "ended": true, "failed": true, "ok": true, "error": true,
	"lost": true, "exit": true, "signal": true, "stopped": true}

func validStatusFilter(s string) bool {
	return statusWords[s] || strings.HasPrefix(s, "exit ") || strings.HasPrefix(s, "signal ") || strings.HasPrefix(s, "stopped: ")
}

// statusMatches is whether r has the status --status asks for: "exit"
// matches every exit N, "signal" every signal, "stopped" every stop.
func statusMatches(r *trainmeterv1.RunReport, want string) bool {
	switch want {
	case "running", "ended":
		return report.Status(r) == want
	case "failed":
		return cost.Failed(r)
	case "exit", "signal":
		return r.GetEnded() && strings.HasPrefix(r.GetEndStatus(), want+" ")
	case "stopped":
		return r.GetEnded() && (r.GetEndStatus() == want || strings.HasPrefix(r.GetEndStatus(), want+":"))
	}
	return r.GetEnded() && strings.EqualFold(report.EndStatus(r), want)
}

// runFilter is `trainmeter runs`' filters; the zero value keeps every run.
// The collector's ListRuns has no filters: the CLI filters what it gets.
type runFilter struct {
	model, status string
	since         time.Time
	labels        map[string]string
}

func (f runFilter) apply(runs []*trainmeterv1.RunReport) []*trainmeterv1.RunReport {
	var out []*trainmeterv1.RunReport
runs:
	for _, r := range runs {
		if f.model != "" && r.GetMetadata().GetModel() != f.model {
			continue
		}
		if f.status != "" && !statusMatches(r, f.status) {
			continue
		}
		if !f.since.IsZero() && (r.GetStart() == nil || r.GetStart().AsTime().Before(f.since)) {
			continue
		}
		for k, v := range f.labels {
			if got, ok := r.GetLabels()[k]; !ok || got != v {
				continue runs
			}
		}
		out = append(out, r)
	}
	return out
}

// parseWhen reads a time flag (--since, --until) in when's forms.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	t, err := when.Parse(s, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: %w", flag, s, err)
	}
	return t, nil
}

// parseLabels reads repeated KEY=VALUE flags.
func parseLabels(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE, e.g. %s team=nlp", flag, kv, flag)
		}
		if prev, dup := out[k]; dup && prev != v {
			return nil, fmt.Errorf("%s %s given twice (%q and %q): give each key once", flag, k, prev, v)
		}
		out[k] = v
	}
	return out, nil
}

func newReportCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "report RUN_ID",
		Short: "Show one run's report (--json: the whole report, cost and compute figures included)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewQueryServiceClient(conn).GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: args[0]})
				return show(cmd.OutOrStdout(), asJSON, resp.GetRun(), err, func(w io.Writer) error {
					if err := report.WriteReport(w, resp.GetRun()); err != nil {
						return err
					}
					return writeDataloaderSection(ctx, w, conn, args[0])
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the whole report as JSON")
	return c
}

func newExportCommand(cf *clientFlags) *cobra.Command {
	export := &cobra.Command{
		Use:   "export FORMAT",
		Short: "Export runs (formats: " + strings.Join(exportFormats, ", ") + ")",
		// Without RunE cobra prints the help and exits 0 for `export json`:
		// a script would take that for an export.
		Args: cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("export needs a format: trainmeter export %s (formats: %s)", exportFormats[0], strings.Join(exportFormats, ", "))
			}
			return fmt.Errorf("unknown export format %q: trainmeter export knows %s (trainmeter export csv --out runs.csv); for JSON use trainmeter runs --json or trainmeter report RUN --json",
				args[0], strings.Join(exportFormats, ", "))
		},
	}
	var out string
	var runs []string
	csvCmd := &cobra.Command{
		Use:   "csv",
		Short: "Export runs as CSV, one row per run (stdout unless --out)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out != "" && out != "-" {
				// Before the query: a typo in the path is found at once.
				if err := checkOutPath(out); err != nil {
					return err
				}
			}
			var reports []*trainmeterv1.RunReport
			err := cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
				stream, err := c.ExportRuns(ctx, &trainmeterv1.ExportRunsRequest{RunIds: runs})
				if err != nil {
					return err
				}
				for {
					m, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						return nil
					}
					if err != nil {
						return err
					}
					reports = append(reports, m.GetRun())
				}
			})
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				return report.WriteCSV(cmd.OutOrStdout(), reports)
			}
			return writeFileAtomic(out, func(w io.Writer) error { return report.WriteCSV(w, reports) })
		},
	}
	csvCmd.Flags().StringVarP(&out, "out", "o", "", "write to FILE instead of stdout")
	csvCmd.Flags().StringArrayVar(&runs, "run", nil, "export only this run (repeatable)")
	export.AddCommand(csvCmd)
	return export
}

// exportFormats are the formats `trainmeter export` writes.
var exportFormats = []string{"csv"}

// checkOutPath says in the user's terms (the path given, never the
// temporary file) why --out cannot be written.
func checkOutPath(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("--out %s is a directory: give a file name, e.g. --out %s", path, filepath.Join(path, "runs.csv"))
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("--out %s: directory %s does not exist (create it first: mkdir -p %s)", path, dir, dir)
	case err != nil:
		return fmt.Errorf("--out %s: %v", path, unwrapPath(err))
	case !fi.IsDir():
		return fmt.Errorf("--out %s: %s is not a directory", path, dir)
	}
	return nil
}

// unwrapPath drops the path from an *fs.PathError, which may name a
// temporary file the user never gave.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// writeFileAtomic writes path via a temporary file and rename, so a failed
// export never leaves half a CSV behind. Errors name path, not the
// temporary file.
func writeFileAtomic(path string, fn func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err == nil {
		defer os.Remove(f.Name()) // once renamed, there is nothing left to remove
		err = fn(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, unwrapPath(err))
	}
	return nil
}

func newNodesCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "nodes",
		Short: "List agent nodes (--json: with every GPU)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
				nodes, err := allNodes(ctx, c)
				sort.Slice(nodes, func(i, j int) bool { return nodes[i].GetNode() < nodes[j].GetNode() })
				return show(cmd.OutOrStdout(), asJSON, &trainmeterv1.ListNodesResponse{Nodes: nodes}, err, func(w io.Writer) error {
					if len(nodes) == 0 {
						fmt.Fprintln(w, "no nodes yet")
						return nil
					}
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NODE\tSTATUS\tGPUS\tLAST SEEN\tLAST SEQ\tBOOT\tHOST ENERGY (RAPL)")
					for _, n := range nodes {
						st := "disconnected"
						if n.GetConnected() {
							st = "connected"
						}
						gs := n.GetGpus()
						gpus := fmt.Sprint(len(gs))
						if len(gs) > 0 && gs[0].GetName() != "" {
							gpus += " x " + gs[0].GetName()
						}
						if v := nodeVendors(n.GetGpus()); v != "" {
							gpus += " (" + v + ")"
						}
						// Last: the agent's words can be long ("permission denied: ...").
						hostEnergy := cmp.Or(n.GetHostEnergyStatus(), "-")
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.GetNode(), st, gpus, report.Stamp(n.GetLastSeen()), n.GetLastSeq(), n.GetBootId(), hostEnergy)
					}
					return tw.Flush()
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// nodeVendors names the vendors of a node's GPUs ("amd", "amd+nvidia"),
// empty when the agent's backend names none (simulated GPUs).
func nodeVendors(gpus []*trainmeterv1.GpuInfo) string {
	var vs []string
	for _, g := range gpus {
		if v := g.GetVendor(); v != "" {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return strings.Join(slices.Compact(vs), "+")
}
