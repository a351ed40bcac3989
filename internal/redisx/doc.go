// Package redisx is the go-redis plumbing shared by idem's Redis modules
// (redisstore, streamsbroker); it holds no code itself. Its packages:
//
//   - script: Lua scripts (and single commands) sent at most once per
//     call, whatever the client's MaxRetries;
//   - rediserr: go-redis errors mapped onto idem's sentinels
//     (ErrUnavailable, ErrUnknownOutcome, ErrCapacity, ErrClosed);
//   - redistest: real redis-server processes for tests (a single node on
//     a free port, a Redis Cluster, a proxy that loses replies).
//
// It is a module of its own under internal/, so idem's modules share one
// copy while nothing outside github.com/idem-dev/idem can import it.
package redisx
