package mysqlstore

import (
	"time"

	"github.com/idem-dev/idem/keytime"
)

// KeyTimeFunc returns the time a key carries; see package keytime.
type KeyTimeFunc = keytime.Func

// Key time readers for the time-ordered and time-partitioned layouts.
var (
	UUIDv7KeyTime = keytime.UUIDv7
	ULIDKeyTime   = keytime.ULID
)

// SnowflakeKeyTime reads Snowflake IDs with the given epoch.
func SnowflakeKeyTime(epoch time.Time) KeyTimeFunc { return keytime.Snowflake(epoch) }
