package redisstore

import (
	"errors"
	"net"
	"syscall"
)

// isDialError reports a failure to connect: the command was never sent.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
