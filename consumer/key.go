package consumer

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// ErrNoKey: the message has no usable idempotency key. It takes the
// MissingKey path (dead-letter or reject), never silent processing.
var ErrNoKey = errors.New("consumer: message has no usable idempotency key")

// KeyFunc extracts a message's idempotency key. An error (or an empty key)
// sends the message down the MissingKey path.
type KeyFunc func(m *broker.Message) ([]byte, error)

// FingerprintFunc computes a message's payload fingerprint (at most
// idem.MaxFingerprintLen bytes; nil for none).
type FingerprintFunc func(m *broker.Message) []byte

// MessageIDKey uses the producer-fixed message id: every redelivery and
// every re-publish of the message share it.
func MessageIDKey(m *broker.Message) ([]byte, error) {
	if m.ID == "" {
		return nil, fmt.Errorf("%w: empty message id", ErrNoKey)
	}
	return []byte(m.ID), nil
}

// BusinessKey builds keys from a business id and an operation type (seed
// 001's unique (business_id, operation_type)): "operation:business_id".
// extract returns them; either empty is ErrNoKey. The operation must not
// contain ':' so distinct pairs give distinct keys.
func BusinessKey(extract func(m *broker.Message) (businessID, operation string, err error)) KeyFunc {
	return func(m *broker.Message) ([]byte, error) {
		id, op, err := extract(m)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoKey, err)
		}
		if id == "" || op == "" {
			return nil, fmt.Errorf("%w: empty business id or operation", ErrNoKey)
		}
		if strings.Contains(op, ":") {
			return nil, fmt.Errorf("%w: operation %q contains ':'", ErrNoKey, op)
		}
		return []byte(op + ":" + id), nil
	}
}

// JSONBusinessKey is BusinessKey over two fields of a JSON payload (dotted
// paths, e.g. "order.id"). A string field is used as is, any other JSON
// value as its compact text.
func JSONBusinessKey(idField, opField string) KeyFunc {
	return BusinessKey(func(m *broker.Message) (string, string, error) {
		vals, err := jsonFields(m.Payload, idField, opField)
		if err != nil {
			return "", "", err
		}
		return vals[0], vals[1], nil
	})
}

// JSONFieldsKey keys a message by the SHA-256 of chosen fields of its JSON
// payload (dotted paths), hex-encoded: messages agreeing on those fields
// are the same operation whatever else differs (timestamps, trace ids). A
// missing field, or a payload that is not a JSON object, is ErrNoKey.
func JSONFieldsKey(fields ...string) KeyFunc {
	return func(m *broker.Message) ([]byte, error) {
		if len(fields) == 0 {
			return nil, fmt.Errorf("%w: JSONFieldsKey without fields", ErrNoKey)
		}
		vals, err := jsonFields(m.Payload, fields...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoKey, err)
		}
		parts := make([][]byte, 0, 2*len(vals))
		for i, v := range vals {
			parts = append(parts, []byte(fields[i]), []byte(v))
		}
		sum := idem.FingerprintOf(parts...)
		return []byte(hex.EncodeToString(sum)), nil
	}
}

// PayloadFingerprint is idem.FingerprintOf(payload): the SHA-256 of the
// payload's length (8 bytes, big-endian) and the payload, not the plain
// SHA-256 (docs/fingerprint.md gives the format and test vectors).
func PayloadFingerprint(m *broker.Message) []byte { return idem.FingerprintOf(m.Payload) }

// NoFingerprint turns fingerprint checks off.
func NoFingerprint(*broker.Message) []byte { return nil }

// JSONFieldsFingerprint fingerprints chosen fields of a JSON payload, for
// payloads whose other fields legitimately differ between duplicates. A
// payload without them gets no fingerprint.
func JSONFieldsFingerprint(fields ...string) FingerprintFunc {
	return func(m *broker.Message) []byte {
		vals, err := jsonFields(m.Payload, fields...)
		if err != nil {
			return nil
		}
		parts := make([][]byte, len(vals))
		for i, v := range vals {
			parts[i] = []byte(v)
		}
		return idem.FingerprintOf(parts...)
	}
}

// jsonFields returns the values at the dotted paths of a JSON object.
func jsonFields(payload []byte, paths ...string) ([]string, error) {
	var root map[string]json.RawMessage
	if err := json.Unmarshal(payload, &root); err != nil {
		return nil, fmt.Errorf("payload is not a JSON object: %w", err)
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		v, err := lookup(root, p)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func lookup(root map[string]json.RawMessage, path string) (string, error) {
	obj := root
	segs := strings.Split(path, ".")
	for i, s := range segs {
		raw, ok := obj[s]
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return "", fmt.Errorf("field %q missing", path)
		}
		if i == len(segs)-1 {
			var str string
			if json.Unmarshal(raw, &str) == nil {
				if str == "" {
					return "", fmt.Errorf("field %q empty", path)
				}
				return str, nil
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil {
				return "", fmt.Errorf("field %q: %w", path, err)
			}
			return buf.String(), nil
		}
		obj = nil
		if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
			return "", fmt.Errorf("field %q: %q is not an object", path, s)
		}
	}
	return "", fmt.Errorf("field %q missing", path)
}
