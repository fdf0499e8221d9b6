// Command kumiko-bench is the `make bench` harness: every benchmark runs its
// named baseline in the same run on the same machine and prints the ratio
// next to the target the issue names.
//
// Add a benchmark by registering it from an init function in a new file of
// this package:
//
//	func init() { register(Bench{Name: "append", Run: benchAppend}) }
//
// Flags: -run REGEX selects benchmarks by name; -quick shrinks the sizes for
// a smoke run; -cpuprofile FILE writes a CPU profile of the run, and
// -memprofile FILE a profile of its allocations.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Bench is one benchmark with its baseline.
type Bench struct {
	// Name selects the benchmark with -run.
	Name string
	// Run measures and returns one or more results.
	Run func(ctx context.Context, env *Env) ([]Result, error)
}

// Result is one measured figure.
type Result struct {
	// Name of the figure, e.g. "append 1 event + 1 row, 16 goroutines".
	Name string
	// Value is the measured figure (Unit).
	Value float64
	// Unit of Value, e.g. "tx/s", "ms".
	Unit string
	// Baseline names what Value is compared with ("" for absolute figures).
	Baseline string
	// BaselineValue is the baseline's figure in the same unit.
	BaselineValue float64
	// Target is the goal as the issue states it, e.g. ">= 0.90" (ratio) or
	// "<= 25 ms" (absolute).
	Target string
	// Pass reports whether the target is met.
	Pass bool
}

// Env carries the harness options to the benchmarks.
type Env struct {
	// Quick asks for small sizes (smoke run).
	Quick bool
}

var benches []Bench

func register(b Bench) { benches = append(benches, b) }

// ratioResult is a throughput figure set against its baseline, passing
// when the ratio reaches minRatio (target ">= minRatio").
func ratioResult(name, unit string, value float64, baseline string, baselineValue, minRatio float64) Result {
	r := Result{Name: name, Value: value, Unit: unit, Baseline: baseline, BaselineValue: baselineValue,
		Target: fmt.Sprintf(">= %.2f", minRatio)}
	r.Pass = r.Ratio() >= minRatio
	return r
}

// referenceResult is a figure reported beside a baseline, with no target.
func referenceResult(name, unit string, value float64, baseline string, baselineValue float64) Result {
	return Result{Name: name, Value: value, Unit: unit, Baseline: baseline, BaselineValue: baselineValue,
		Target: "reported", Pass: true}
}

// Ratio returns value / baseline.
func (r Result) Ratio() float64 {
	if r.BaselineValue == 0 {
		return 0
	}
	return r.Value / r.BaselineValue
}

func main() {
	run := flag.String("run", ".", "regular expression selecting benchmarks by name")
	quick := flag.Bool("quick", false, "small sizes, for a smoke run")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprofile := flag.String("memprofile", "", "write a profile of the whole run's allocations to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kumiko-bench:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "kumiko-bench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	re, err := regexp.Compile(*run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kumiko-bench:", err)
		os.Exit(2)
	}
	sort.SliceStable(benches, func(i, j int) bool { return benches[i].Name < benches[j].Name })
	env := &Env{Quick: *quick}
	var all []Result
	failed := false
	for _, b := range benches {
		if !re.MatchString(b.Name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "== %s\n", b.Name)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		res, err := b.Run(ctx, env)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "   error: %v\n", err)
			failed = true
			continue
		}
		fmt.Fprintf(os.Stderr, "   done in %s\n", time.Since(start).Round(time.Millisecond))
		all = append(all, res...)
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "figure\tvalue\tbaseline\tratio\ttarget\tresult")
	for _, r := range all {
		base, ratio := "-", "-"
		if r.Baseline != "" {
			base = fmt.Sprintf("%s: %.1f %s", r.Baseline, r.BaselineValue, r.Unit)
			ratio = fmt.Sprintf("%.2f", r.Ratio())
		}
		verdict := "PASS"
		if !r.Pass {
			verdict = "MISS"
		}
		fmt.Fprintf(w, "%s\t%.1f %s\t%s\t%s\t%s\t%s\n", r.Name, r.Value, r.Unit, base, ratio, strings.TrimSpace(r.Target), verdict)
	}
	_ = w.Flush()
	if *memprofile != "" {
		if err := writeAllocs(*memprofile); err != nil {
			fmt.Fprintln(os.Stderr, "kumiko-bench:", err)
			failed = true
		}
	}
	if failed {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// writeAllocs writes the allocation profile of the run so far to path
// (go tool pprof -sample_index=alloc_space reads it).
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// median returns the median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// quantile returns the q-quantile (0..1) of ds by nearest rank (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
