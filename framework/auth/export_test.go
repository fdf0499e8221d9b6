package auth

import "time"

// SetClock replaces the keyring's clock (token checks and its memory of
// verified tokens) for tests.
func SetClock(k *Keyring, now func() time.Time) { k.now = now }
