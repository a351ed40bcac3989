// Package httpapi serves idem's HTTP contract (docs/http.md) over any
// idem.Store, so that programs not written in Go claim, complete, release,
// fail and extend keys as the Guard does:
//
//	POST /v1/claim        {"key","fingerprint"?,"lease_ms"?,"ttl_ms"?}
//	                      201 acquired {token} | 200 completed {result, replayed} |
//	                      409 in_progress + Retry-After | 200 failed {error} | 422 fingerprint_mismatch
//	POST /v1/claim/batch  {"claims":[...]} -> 200 {"results":[...]} in order, one store round trip
//	POST /v1/complete     {"key","token","result"?}  200 | 409 fenced | 404
//	POST /v1/release      {"key","token","error"?}   200 | 409 fenced | 404
//	POST /v1/fail         {"key","token","error"?}   200 | 409 fenced | 404
//	POST /v1/extend       {"key","token","lease_ms"} 200 | 409 fenced | 404
//	GET /v1/records?key=K  the record | 404;  DELETE /v1/records?key=K  204
//	GET /v1/stats, /v1/recent  the dashboard's figures and keys, of the token's namespace
//	GET /metrics, /healthz, /readyz
//	anything else              Config.Dashboard (package dashboard), or 404
//
// Keys, fingerprints and results travel as JSON strings (any Unicode text,
// NUL as \u0000) or, for bytes that are not UTF-8 text, base64 under
// key_b64, fingerprint_b64 and result_b64; answers use the same rule.
//
// Input is decoded strictly: a body that is not exactly one JSON object,
// a member name that is unknown, repeated or spelled in another case, a
// value of the wrong type, an empty or oversized key, a duration that is
// not a whole number of milliseconds within idem's limits, or text the
// decoder would silently alter (invalid UTF-8, lone surrogates) gets 400
// {"error": code, "detail": ...} before the store is called; a body over
// Config.MaxBodyBytes gets 413. Bad input never gets a 5xx.
//
// A Handler holds no state of its own (besides counters): several
// processes over one shared store (Redis, PostgreSQL, MySQL) answer as one.
// With Config.Tokens, each bearer token is bound to one namespace's store
// handle and a request sees that namespace only.
package httpapi
