package mysqlstore

// SetDerivedMin makes s send claim statements of at least n rows as INSERT
// ... SELECT from a derived table (n = 1: every claim), so tests cover both
// row sources.
func SetDerivedMin(s *Store, n int) { s.derivedMin = n }
