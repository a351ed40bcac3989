package main

import "crypto/sha256"

// keyHash mirrors mysqlstore's index hash: SHA-256(key)[:16].
func keyHash(k []byte) []byte {
	s := sha256.Sum256(k)
	return s[:16]
}
