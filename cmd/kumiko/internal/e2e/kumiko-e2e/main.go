// Command kumiko-e2e is the kumiko binary with the test-only e2e feature
// added to the sample features; the multi-process tests in
// cmd/kumiko/internal/e2e build and run it. E2E_APPLY_DELAY_MS slows the
// e2e:tally projection per event; KUMIKO_INSTANCE_ID names the process in
// the rows its projections write.
package main

import (
	"context"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/cli"
	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/e2e"
	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	delay, _ := strconv.Atoi(os.Getenv("E2E_APPLY_DELAY_MS"))
	opts := e2e.Options{InstanceID: os.Getenv("KUMIKO_INSTANCE_ID"), ApplyDelay: time.Duration(delay) * time.Millisecond}
	register := func(r *framework.Registry, cfg *config.Config) {
		features.RegisterWith(r, cfg)
		e2e.Register(r, opts)
	}
	code := cli.Main(ctx, os.Args[1:], register, features.Routes)
	stop()
	os.Exit(code)
}
