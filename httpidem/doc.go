// Package httpidem applies the Idempotency-Key HTTP header semantics
// (draft-ietf-httpapi-idempotency-key-header) to any net/http handler, on
// any idem.Store: Middleware.Handler wraps your handler; NewProxy with the
// middleware in front is `idem proxy`, for APIs not written in Go.
//
// A request with a key runs once; its response (status, headers, body) is
// stored and replayed to repeats with "Idempotent-Replayed: true". A
// repeat while the first runs gets 409 + Retry-After, a repeat with
// another method, path, query or body gets 422, and a route that requires
// a key answers 400 without one. A 5xx (and 408, 425, 429) is not stored:
// the key is released so the client may retry. Keys live in the Store's
// namespace and, with Config.Principal, per principal. docs/http.md in the
// repository shows what a replay looks like and what remains (a process
// that dies after the handler's effect and before the record: the lease
// lapses and a retry runs the handler again).
package httpidem
