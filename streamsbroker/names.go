package streamsbroker

import (
	"fmt"
	"strings"

	"github.com/idem-dev/idem"
)

// slotPrefix returns a prefix for keys that must live in stream's hash slot
// on a Redis Cluster (its dedup keys, its dead-letter stream), so a script
// can touch them together: stream itself when its name has a hash tag (a
// non-empty {...}: every suffix keeps it), else {stream}, whose tag is the
// whole name and so hashes like the name. A name with braces but no usable
// tag cannot be given a slot-mate and is refused.
func slotPrefix(stream string) (string, error) {
	if stream == "" {
		return "", fmt.Errorf("%w: streamsbroker: empty stream name", idem.ErrInvalidArgument)
	}
	if i := strings.IndexByte(stream, '{'); i >= 0 {
		if j := strings.IndexByte(stream[i+1:], '}'); j > 0 {
			return stream, nil
		}
		return "", fmt.Errorf("%w: streamsbroker: stream name %q has a '{' without a non-empty hash tag after it", idem.ErrInvalidArgument, stream)
	}
	if strings.IndexByte(stream, '}') >= 0 {
		return "", fmt.Errorf("%w: streamsbroker: stream name %q has a '}' outside a hash tag", idem.ErrInvalidArgument, stream)
	}
	return "{" + stream + "}", nil
}

// DeadLetterStream is where the subscriber of stream moves an entry whose
// deliveries ran past MaxDeliver unsettled (and, with
// SubscriberConfig.DeadLetterOnTerm, terminated entries): stream's hash tag
// plus ":idem-dead-letter" ("{orders}:idem-dead-letter" for "orders"), in
// the same cluster slot, so the move and the XACK are one script. It
// returns "" for a name refused by Validate.
func DeadLetterStream(stream string) string {
	p, err := slotPrefix(stream)
	if err != nil {
		return ""
	}
	return p + ":idem-dead-letter"
}

// dedupKey holds the entry id of message id's first publish to stream for
// the dedup window.
func dedupKey(prefix, id string) string { return prefix + ":idem-dedup:" + id }
