package natsbroker

// AtLeast reports whether server version have is min or newer (tests
// gate server-specific expectations on it).
func AtLeast(have, min string) bool { return atLeast(have, min) }
