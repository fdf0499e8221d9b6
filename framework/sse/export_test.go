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
