package idem

import (
	"fmt"
	"time"
)

// Limits on what a record may hold. Every store enforces them before I/O.
const (
	MaxKeyLen         = 1024
	MaxFingerprintLen = 64
	MaxResultLen      = 1 << 20
	MaxCauseLen       = 1024
	MaxNamespaceLen   = 64
	MaxLease          = 7 * 24 * time.Hour
	MaxTTL            = 3660 * 24 * time.Hour
	MinDuration       = time.Millisecond
)

// ValidateKey rejects empty keys and keys longer than MaxKeyLen. Any other
// byte string is a valid key.
func ValidateKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// ValidateLease checks a lease duration.
func ValidateLease(d time.Duration) error {
	if d < MinDuration || d > MaxLease {
		return fmt.Errorf("%w: lease %s outside [%s, %s]", ErrInvalidArgument, d, MinDuration, MaxLease)
	}
	return nil
}

// ValidateTTL checks a retention duration.
func ValidateTTL(d time.Duration) error {
	if d < MinDuration || d > MaxTTL {
		return fmt.Errorf("%w: ttl %s outside [%s, %s]", ErrInvalidArgument, d, MinDuration, MaxTTL)
	}
	return nil
}

// ValidateClaim checks a claim request.
func ValidateClaim(req ClaimRequest) error {
	if err := ValidateKey(req.Key); err != nil {
		return err
	}
	if len(req.Fingerprint) > MaxFingerprintLen {
		return fmt.Errorf("%w: fingerprint is %d bytes, the limit is %d", ErrInvalidArgument, len(req.Fingerprint), MaxFingerprintLen)
	}
	if err := ValidateLease(req.Lease); err != nil {
		return err
	}
	return ValidateTTL(req.TTL)
}

// ValidateToken checks a key and a token presented to Complete, Release,
// Fail or Extend. Tokens start at 1.
func ValidateToken(key []byte, token uint64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if token == 0 {
		return fmt.Errorf("%w: token 0 is never issued", ErrInvalidArgument)
	}
	return nil
}

// ValidateResult checks a result handed to Complete.
func ValidateResult(result []byte) error {
	if len(result) > MaxResultLen {
		return fmt.Errorf("%w: result is %d bytes, the limit is %d", ErrInvalidArgument, len(result), MaxResultLen)
	}
	return nil
}

// ValidateCause checks a cause handed to Release or Fail.
func ValidateCause(cause string) error {
	if len(cause) > MaxCauseLen {
		return fmt.Errorf("%w: cause is %d bytes, the limit is %d", ErrInvalidArgument, len(cause), MaxCauseLen)
	}
	return nil
}

// TruncateCause shortens s to at most MaxCauseLen bytes.
func TruncateCause(s string) string {
	if len(s) <= MaxCauseLen {
		return s
	}
	return s[:MaxCauseLen-3] + "..."
}

// ValidateNamespace accepts "" (the default namespace) and names of up to
// MaxNamespaceLen bytes made of ASCII letters, digits, '.', '_' and '-', so a
// namespace can be embedded in a Redis key, a table column or a file bucket
// name without escaping.
func ValidateNamespace(ns string) error {
	if len(ns) > MaxNamespaceLen {
		return fmt.Errorf("%w: namespace is %d bytes, the limit is %d", ErrInvalidArgument, len(ns), MaxNamespaceLen)
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: namespace %q: byte %q not allowed (use letters, digits, '.', '_', '-')", ErrInvalidArgument, ns, c)
		}
	}
	return nil
}
