package idempotency

// HoldFinishes makes FinishAsync only queue its responses until release is
// called, which stores everything queued (in batches), for tests of the
// batched store.
func HoldFinishes(s *Store) (release func()) { return s.finishes.hold() }
