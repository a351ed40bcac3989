package redisstore

// RecordKey is the Redis key of key's record in s (tests only: they damage
// records on purpose).
func (s *Store) RecordKey(key []byte) string {
	rk, _ := s.keysOf(key)
	return rk
}
