// Command kumiko is the Kumiko binary: `kumiko serve` runs the API, worker
// or all-in-one process (APP_MODE); the other commands are operations tools.
// Run `kumiko --help` for the list.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/cli"
	"github.com/kumiko-go/kumiko/features"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		// The first signal starts the drain; the default handling is back
		// for the next one, so a second Ctrl-C (or SIGTERM) ends the
		// process at once.
		<-ctx.Done()
		stop()
	}()
	code := cli.Main(ctx, os.Args[1:], features.RegisterWith, features.Routes)
	stop()
	os.Exit(code)
}
