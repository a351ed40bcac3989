package snowflake

// ManualHeartbeat returns cfg for a generator that renews its worker lease
// only when the test calls Beat (no heartbeat goroutine, no ticker): with a
// manual Clock shared with the store, how slow the machine is changes how
// long a lease test takes, never what it sees.
func ManualHeartbeat(cfg Config) Config {
	cfg.manualBeat = true
	return cfg
}

// Beat runs one lease renewal of g now, as the heartbeat would. It returns
// false once the lease is lost for good.
func Beat(g *Generator) bool { return g.lease.beat() }
