package idempotency

import (
	"sync"
	"time"
)

// batcher hands queued items to run in batches. An item queued waits up to
// delay for a caller to take it along with work of its own ([batcher.takeBatch]:
// a claim carries the responses queued before it in its pipeline, so that
// under load storing them costs no round trip of its own); after delay
// whatever is still queued is run from one goroutine, in batches, and the
// items queued while a batch is under way form the next one.
type batcher[T any] struct {
	// take returns how many of the queued items (at least one) the next
	// batch holds.
	take func(queue []T) int
	// run handles a batch; it must answer every item.
	run func(batch []T)
	// delay is how long the first item of a queue waits before the queue
	// is run by the batcher itself.
	delay time.Duration

	mu    sync.Mutex
	queue []T
	// armed: a timer or a loop will run what is queued.
	armed bool
	// held: only queue, until hold's release (tests).
	held bool
}

// tryAdd queues item, arming the timer that runs the queue unless one is
// armed, unless limit items are queued already; it reports whether it
// queued item.
func (b *batcher[T]) tryAdd(item T, limit int) bool {
	b.mu.Lock()
	if len(b.queue) >= limit {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, item)
	arm := !b.armed
	b.armed = true
	b.mu.Unlock()
	if arm {
		time.AfterFunc(b.delay, b.loop)
	}
	return true
}

// takeBatch removes the next batch from the queue and returns it, for the
// caller to run; nil when nothing is queued (or the batcher is held).
func (b *batcher[T]) takeBatch() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held {
		return nil
	}
	return b.next()
}

// next removes the next batch from the queue (nil when it is empty); b.mu
// is held.
func (b *batcher[T]) next() []T {
	if len(b.queue) == 0 {
		return nil
	}
	n := min(max(b.take(b.queue), 1), len(b.queue))
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}

// hold makes tryAdd only queue, and takeBatch take nothing, until the
// returned release, which runs what is queued (tests).
func (b *batcher[T]) hold() (release func()) {
	b.mu.Lock()
	b.held, b.armed = true, true
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.held = false
		b.mu.Unlock()
		go b.loop()
	}
}

// loop runs batches until the queue is empty.
func (b *batcher[T]) loop() {
	for {
		b.mu.Lock()
		if b.held {
			b.mu.Unlock()
			return // release runs the loop
		}
		batch := b.next()
		if batch == nil {
			b.armed = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.run(batch)
	}
}
