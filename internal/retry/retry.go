// Package retry repeats an operation with capped exponential backoff until
// it succeeds: what a process does at start for the steps that need a
// database that may not answer yet.
package retry

import (
	"context"
	"time"
)

// First is the wait after the first failure; it doubles after each further
// failure up to Max.
const (
	First = 100 * time.Millisecond
	Max   = 5 * time.Second
)

// Until calls op until it returns nil (true) or ctx ends (false). After
// each failure it calls failed with the error and the wait before the next
// attempt; failed returning false gives up (false).
func Until(ctx context.Context, op func(context.Context) error, failed func(err error, retryIn time.Duration) bool) bool {
	wait := First
	for {
		err := op(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil || !failed(err, wait) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(wait*2, Max)
	}
}
