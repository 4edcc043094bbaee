// Package sandbox is an HTTP server that behaves like one of the three
// providers idemproxy was designed for (cards, payments and payouts; see
// docs/signing.md and docs/retries.md), with fault injection and a ledger of
// executions.
//
// It serves two audiences: a person trying idemproxy by hand with curl, and a
// chaos test suite that counts how many times each operation really executed.
// Everything the sandbox does follows the providers' documented behaviour,
// not idemproxy's code.
//
// # Providers
//
// Config.Provider selects one behaviour per server:
//
//   - "cards": POST /cards (issue), POST /cards/{id}/topup and
//     POST /cards/{id}/close require Idempotency-Key (422
//     schema_validation_failed without it). A key lives forever: a repeat
//     returns the ORIGINAL operation (same id, same bytes) even with another
//     body or on another endpoint. POST /cardholders is deduplicated by
//     external_id and needs no key. GET /cards/{id} shows a card. Business
//     refusals (404 card_not_found, 409 card_not_active, 409
//     balance_exhausted when Config.Balance is set and the hold does not fit)
//     create nothing. The amounts AmountFailed and AmountNeedsReview end an
//     issue or top-up in the operation statuses "failed" and "needs_review".
//   - "payments": every POST requires Idempotency-Key (422
//     idempotency_key_required). POST /payments creates a payment; the same
//     key with the same body gets the stored response plus
//     "Idempotent-Replayed: true", the same key with another body gets 409
//     idempotency_conflict. GET /payments/{id} returns a payment.
//   - "payouts": POST /v1/payout needs order_id (400 without) and is
//     deduplicated by it; a known Idempotency-Key returns its object with
//     "Idempotent-Replayed: true". POST /v1/payout/info {order_id} returns the
//     payout or 404 payout.not_found. POST /v1/payment and
//     POST /v1/payment/info do the same for payments (no refusals; 404
//     payment.not_found). While a payout with the same key or
//     order is still being processed (until its response is written), other
//     requests get 409 idempotency.in_progress. Config.MaturingAttempts makes
//     new orders answer 409 payout.funds_maturing or payout.frozen first;
//     Config.Balance makes larger amounts answer 409 payout.insufficient_funds.
//
// Errors are {"error":{"code":"...","message":"..."}}, except the payouts
// 429, which is {"state":1,"message":"rate limit exceeded"} with Retry-After
// and no error code, as the payouts provider answers it.
//
// # Signatures
//
// Signatures are checked only when Config.Secret is set; every signature is
// the lowercase hex HMAC-SHA256 of a canonical string, with X-Timestamp in unix
// seconds and accepted within ±300 s of Config.Now. Paths are the request's
// escaped path without the query.
//
//   - payments: X-Timestamp, X-Nonce (single use: a reused nonce is 409
//     nonce_reused) and X-Signature over
//     METHOD "\n" path "\n" timestamp "\n" nonce "\n" idempotency_key "\n" hex(sha256(body)),
//     which is idemproxy's IDEMPROXY_SIGN_CANONICAL
//     {method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}
//     (PaymentsCanonical). A stale timestamp or a bad signature is 401.
//   - payouts: X-Public-Id (must equal Config.PublicID when that is set),
//     X-Timestamp and X-Signature over timestamp "\n" METHOD "\n" path "\n" body;
//     the Idempotency-Key is NOT signed. IDEMPROXY_SIGN_CANONICAL
//     {timestamp}\n{method}\n{path}\n{body} (TimestampCanonical).
//   - cards: the provider only says a retry is signed anew (new time), and
//     points to its replay protection; the sandbox checks X-Timestamp and
//     X-Signature over the same string as payouts, and refuses a signature
//     it has already accepted with 401 signature_reused (a request resent
//     whole, or a retry signed in the same second as the attempt before it).
//
// # Faults
//
// Config.Faults gives each fault an independent probability per request
// (drawn from a generator seeded with Config.Seed, so a run is repeatable for
// a given sequence of requests). Before processing, in this order of
// precedence: DropBeforeProcessing (the connection is closed, nothing runs),
// Maintenance (503 maintenance, "money did not move"), RateLimited (429 with
// Retry-After), Status5xx (500 or 503 JSON, 502 or 504 HTML as from a
// gateway). After processing: DropAfterProcessing (the operation executes and
// is recorded, then the connection is closed and the response lost), then
// SlowAfterProcessing (the response waits Config.SlowDelay), then
// GatewayTimeoutAfterProcessing (504 gateway_timeout instead of the result;
// the payments provider names the payment_id, so that the client can look it
// up with GET /payments/{payment_id}). The provider's own
// rate limit (Config.RateLimit) is checked before any fault. Faults never
// apply to /_sandbox/ routes.
//
// # Ledger
//
// Every operation that actually executed (not a replay, not a deduplication
// hit, not a refusal) is recorded with its kind, order_id (the request body's
// top-level "order_id", when present), Idempotency-Key, time, status and
// response body. GET /_sandbox/ledger returns the counts (executions, per
// order and per key, duplicate orders, replays, throttled requests, faults by
// kind); GET /_sandbox/ledger?full=1 adds the entries. Server.Ledger returns
// the same snapshot, entries included, for in-process tests.
package sandbox
