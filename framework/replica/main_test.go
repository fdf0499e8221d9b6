package replica_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code != 0 {
		os.Exit(code)
	}
	// A query cancelled under way (a hung or lagging server's) leaves pgx
	// closing its connection in the background, and its reader goroutine
	// ends with that close: on a loaded machine later than goleak's own
	// second or two of retries. Ten seconds still finds a connection that
	// is never closed.
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err = goleak.Find(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
