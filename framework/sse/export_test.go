package sse

// Writing returns the number of h's clients whose handler is in the middle
// of a write (tests: a client that does not read keeps its handler there).
func Writing(h *Hub) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, set := range h.tenants {
		for s := range set {
			s.wmu.Lock()
			if s.writing {
				n++
			}
			s.wmu.Unlock()
		}
	}
	return n
}

// Pending returns the number of published events h's fan-out has not
// taken yet.
func Pending(h *Hub) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pending)
}

// MaxPending returns how many published events may wait for h's fan-out
// before Publish waits.
func MaxPending(h *Hub) int { return h.maxPending }
