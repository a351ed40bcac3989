package idem

// BeatsInFlight counts g's held claims whose heartbeat extend has been sent
// and its answer not yet recorded (tests wait for none before moving a
// manual clock on, so that every claim falls due in the same tick).
func BeatsInFlight(g *Guard) int {
	if g.beats == nil {
		return 0
	}
	n := 0
	for i := range g.beats.shards {
		sh := &g.beats.shards[i]
		sh.mu.Lock()
		for h := sh.head; h != nil; h = h.next {
			if h.beating {
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}
