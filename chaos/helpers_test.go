package chaos_test

import "strconv"

func parseUint(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }
