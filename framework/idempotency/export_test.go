package idempotency

import "time"

// HoldFinishes makes FinishAsync only queue its responses until release is
// called, which stores everything queued (in batches), for tests of the
// batched store.
func HoldFinishes(s *Store) (release func()) { return s.finishes.hold() }

// SetRideDelay sets how long FinishAsync's responses wait for a claim to
// carry them before the store sends them itself. Call it before use.
func SetRideDelay(s *Store, d time.Duration) { s.finishes.delay = d }
