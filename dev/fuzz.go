package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"
)

// fuzzTarget is one Fuzz function of a package.
type fuzzTarget struct {
	pkg  string // import path
	dir  string // package directory
	name string // FuzzXxx
}

// fuzzResult is what one fuzzing run reported.
type fuzzResult struct {
	target  fuzzTarget
	execs   string // as go test printed it, e.g. "594822"
	rate    string // execs per second over the run
	newIn   string // new interesting inputs found in this run
	failed  bool
	input   string // the failing input's file, if one was written
	rerun   string // the command that re-runs the failing input
	logFile string
}

var (
	fuzzFuncRe  = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	fuzzStatsRe = regexp.MustCompile(`execs: (\d+) \(\d+/sec\), new interesting: (\d+)`)
	fuzzInputRe = regexp.MustCompile(`Failing input written to (\S+)`)
	fuzzRerunRe = regexp.MustCompile(`(?m)^\s*(go test -run=\S+)`)
)

// fuzz runs every fuzz target of the module (or of the packages given), one
// after another, each for --time, prints a summary table and fails when a
// target found a failing input, saying where Go wrote it. Fuzzing needs no
// services: the fuzz targets are pure. Seed corpora (testdata/fuzz) run in
// every `go test`, hence in `dev test`, without this command.
func fuzz(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("fuzz", flag.ContinueOnError)
	per := fs.Duration("time", 20*time.Second, "how long to fuzz each target")
	match := fs.String("run", "", "only targets whose name matches this regular expression")
	parallel := fs.Int("parallel", 1, "fuzzing workers per target (the default leaves the other cores alone)")
	minimize := fs.Duration("minimize", 10*time.Second, "how long to minimize a new or failing input")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: go run ./dev fuzz [--time 20s] [--run regexp] [--parallel 1] [packages...]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *per <= 0 || *parallel < 1 || *minimize < 0 {
		return errors.New("fuzz needs a positive --time and --parallel, and a --minimize of 0 or more")
	}
	var only *regexp.Regexp
	if *match != "" {
		re, err := regexp.Compile(*match)
		if err != nil {
			return fmt.Errorf("--run: %w", err)
		}
		only = re
	}
	pkgs := fs.Args()
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	targets, err := findFuzzTargets(ctx, root, pkgs)
	if err != nil {
		return err
	}
	if only != nil {
		kept := targets[:0]
		for _, t := range targets {
			if only.MatchString(t.name) {
				kept = append(kept, t)
			}
		}
		targets = kept
	}
	if len(targets) == 0 {
		return errors.New("no fuzz targets found")
	}
	logDir := filepath.Join(state, "fuzz")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	log.Info("fuzzing", "targets", len(targets), "each", per.String(), "logs", logDir)
	var results []fuzzResult
	for _, t := range targets {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "fuzzing %s.%s for %s\n", t.pkg, t.name, *per)
		res, err := runFuzzTarget(ctx, root, logDir, t, *per, *minimize, *parallel)
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	return fuzzSummary(os.Stdout, root, results, ctx.Err())
}

// findFuzzTargets lists the Fuzz functions of the packages' test files.
// Reading the files is enough (no test binary has to be built for it).
func findFuzzTargets(ctx context.Context, root string, pkgs []string) ([]fuzzTarget, error) {
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var targets []fuzzTarget
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "\t", 3)
		if len(parts) != 3 {
			continue
		}
		for _, file := range strings.Fields(parts[2]) {
			src, err := os.ReadFile(filepath.Join(parts[1], file))
			if err != nil {
				return nil, err
			}
			for _, m := range fuzzFuncRe.FindAllSubmatch(src, -1) {
				targets = append(targets, fuzzTarget{pkg: parts[0], dir: parts[1], name: string(m[1])})
			}
		}
	}
	return targets, nil
}

// runFuzzTarget fuzzes one target, its output going to a log file (and to
// the result's figures); a non-zero exit of go test is a failure.
func runFuzzTarget(ctx context.Context, root, logDir string, t fuzzTarget, per, minimize time.Duration, parallel int) (fuzzResult, error) {
	res := fuzzResult{target: t, logFile: filepath.Join(logDir, t.name+".log")}
	logf, err := os.Create(res.logFile)
	if err != nil {
		return res, err
	}
	defer logf.Close()
	var out bytes.Buffer
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-fuzz", "^"+t.name+"$",
		"-fuzztime", per.String(), "-fuzzminimizetime", minimize.String(),
		"-parallel", fmt.Sprint(parallel), t.pkg)
	cmd.Dir = root
	cmd.Stdout = io.MultiWriter(logf, &out)
	cmd.Stderr = cmd.Stdout
	runErr := cmd.Run()
	elapsed := time.Since(start)
	text := out.String()
	res.execs, res.newIn = "-", "-"
	if m := fuzzStatsRe.FindAllStringSubmatch(text, -1); len(m) > 0 {
		last := m[len(m)-1]
		res.execs, res.newIn = last[1], last[2]
		var n float64
		if _, err := fmt.Sscan(last[1], &n); err == nil && elapsed > 0 {
			res.rate = fmt.Sprintf("%.0f", n/per.Seconds())
		}
	}
	if runErr != nil {
		var exit *exec.ExitError
		if !errors.As(runErr, &exit) && ctx.Err() == nil {
			return res, fmt.Errorf("go test %s: %w", t.name, runErr)
		}
		res.failed = ctx.Err() == nil
	}
	if m := fuzzInputRe.FindStringSubmatch(text); m != nil {
		res.input = filepath.Join(t.dir, m[1])
	}
	if m := fuzzRerunRe.FindStringSubmatch(text); m != nil {
		res.rerun = m[1] + " " + t.pkg
	}
	return res, nil
}

// fuzzSummary prints the table and, for each failure, where its input is
// and how to re-run it; it returns an error when a target failed.
func fuzzSummary(w io.Writer, root string, results []fuzzResult, interrupted error) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tPACKAGE\tEXECS\tEXECS/S\tNEW CORPUS\tRESULT")
	failed := 0
	for _, r := range results {
		result := "ok"
		if r.failed {
			result = "FAIL"
			failed++
		}
		rate := r.rate
		if rate == "" {
			rate = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.target.name, r.target.pkg, r.execs, rate, r.newIn, result)
	}
	tw.Flush()
	for _, r := range results {
		if !r.failed {
			continue
		}
		fmt.Fprintf(w, "\n%s failed (log: %s)\n", r.target.name, r.logFile)
		if r.input != "" {
			rel, err := filepath.Rel(root, r.input)
			if err != nil {
				rel = r.input
			}
			fmt.Fprintf(w, "  failing input written to %s\n", rel)
			fmt.Fprintf(w, "  it now runs in every go test; commit it with the fix as a regression\n")
		}
		if r.rerun != "" {
			fmt.Fprintf(w, "  re-run: %s\n", r.rerun)
		}
	}
	if interrupted != nil {
		return errors.New("interrupted")
	}
	if failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}
