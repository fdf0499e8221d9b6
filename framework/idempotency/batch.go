package idempotency

import "sync"

// batcher hands queued items to run in batches, from one goroutine at a
// time: items queued while a batch is under way form the next batch, so
// that under load one Redis script call serves many requests and with no
// load an item waits for nobody.
type batcher[T any] struct {
	// take returns how many of the queued items (at least one) the next
	// batch holds.
	take func(queue []T) int
	// run handles a batch; it must answer every item.
	run func(batch []T)

	mu      sync.Mutex
	queue   []T
	running bool
}

// tryAdd queues item, starting the goroutine that runs batches if none
// runs, unless limit items are queued already; it reports whether it
// queued item.
func (b *batcher[T]) tryAdd(item T, limit int) bool {
	b.mu.Lock()
	if len(b.queue) >= limit {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, item)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		go b.loop()
	}
	return true
}

// hold makes tryAdd only queue until the returned release (tests).
func (b *batcher[T]) hold() (release func()) {
	b.mu.Lock()
	b.running = true
	b.mu.Unlock()
	return func() { go b.loop() }
}

// loop runs batches until the queue is empty.
func (b *batcher[T]) loop() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.queue = nil
			b.running = false
			b.mu.Unlock()
			return
		}
		n := min(max(b.take(b.queue), 1), len(b.queue))
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.run(batch)
	}
}
