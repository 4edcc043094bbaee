package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// presets are the settings each provider of the product documents implies,
// by IDEMPROXY_PRESET. A preset fills only the variables the environment does
// not set, so an explicit variable always wins (an empty one resets a variable
// to its default, as it does without a preset). Variables a preset does not
// name keep their defaults (no nonce; the default retry codes, which the
// payments and cards providers never send). No
// preset holds a credential: the secret (IDEMPROXY_SIGN_SECRET) and, for
// payouts, the public id (IDEMPROXY_STATIC_HEADERS=X-Public-Id=<id>) are the
// operator's.
var presets = map[string]map[string]string{
	// Payouts: X-Timestamp and a hex HMAC of "ts\nMETHOD\npath\nbody", the key
	// not signed; 429/5xx and three 409 codes are retried; the two status
	// lookups must always reach the provider; its "busy" is
	// 409 idempotency.in_progress, which apps written for it wait on.
	"payouts": {
		"SIGN_CANONICAL":    `{timestamp}\n{method}\n{path}\n{body}`,
		"SIGN_ENCODING":     "hex",
		"SIGNATURE_HEADER":  "X-Signature",
		"TIMESTAMP_HEADER":  "X-Timestamp",
		"KEY_SOURCES":       "json:order_id",
		"RETRY_STATUSES":    "429,500,502,503,504",
		"RETRY_CODES":       "payout.funds_maturing,idempotency.in_progress,payout.frozen",
		"ROUTES":            "POST /v1/payout/info=unprotected; POST /v1/payment/info=unprotected",
		"INPROGRESS_STATUS": "409",
		"INPROGRESS_CODE":   "idempotency.in_progress",
		// Its lookup (POST /v1/payout/info, no probe by default) answers an
		// order it never created "404 payout.not_found": only that is "not
		// executed", for an operator who adds the lookup.
		"STATUS_PROBE_NOT_FOUND_CODES": "payout.not_found",
	},
	// Payments: a new X-Nonce per attempt and a hex HMAC over method, path,
	// timestamp, nonce, key and the body's SHA-256; every POST carries a key
	// (one order_id, one key); 429 and every status of 500 or more are
	// retried (its retry loop stops only on "status < 500 and not 429"), no
	// 4xx is.
	"payments": {
		"SIGN_CANONICAL":    `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`,
		"SIGN_ENCODING":     "hex",
		"SIGNATURE_HEADER":  "X-Signature",
		"TIMESTAMP_HEADER":  "X-Timestamp",
		"NONCE_HEADER":      "X-Nonce",
		"KEY_SOURCES":       "json:order_id",
		"RETRY_STATUSES":    "429,500-599",
		"INPROGRESS_STATUS": "409",
		"INPROGRESS_CODE":   "idempotency_in_progress",
		// "After a 504, first GET /payments/{payment_id}"; keys are kept
		// "at least 48 hours".
		"STATUS_PROBE":           "GET /payments/{resp.payment_id}",
		"PROVIDER_KEY_RETENTION": "48h",
		// The lookup says whether a payment exists, so it resolves only
		// the creation of one: a refund's 504 may name its payment too.
		"STATUS_PROBE_ROUTES": "POST /payments",
		// No STATUS_PROBE_NOT_FOUND_CODES: the provider documents no answer
		// for a payment it does not have, so any 404 but a gateway's HTML
		// page means not executed, as the contract says.
	},
	// Cards: a new signature ("new time") per retry; timeouts, any 5xx, 503
	// maintenance and 429 are retried with the same key, 4xx business codes
	// are not. Card bodies carry no order id: card issue, top-up and close are
	// keyed by a 10-minute fingerprint window; cardholders need no key, the
	// provider deduplicates them by external_id.
	"cards": {
		"SIGN_CANONICAL":    `{timestamp}\n{method}\n{path}\n{body}`,
		"SIGN_ENCODING":     "hex",
		"SIGNATURE_HEADER":  "X-Signature",
		"TIMESTAMP_HEADER":  "X-Timestamp",
		"KEY_SOURCES":       "json:order_id",
		"RETRY_STATUSES":    "429,500-599",
		"ROUTES":            "POST /cardholders=unprotected; POST /cards=fingerprint:10m; POST /cards/*/topup=fingerprint:10m; POST /cards/*/close=fingerprint:10m",
		"INPROGRESS_STATUS": "409",
		"INPROGRESS_CODE":   "idempotency_in_progress",
	},
}

// presetNames lists the presets for messages.
func presetNames() string {
	return strings.Join(slices.Sorted(maps.Keys(presets)), ", ")
}

// applyPreset adds to vars (the environment by name) the variables of the
// preset IDEMPROXY_PRESET names that vars does not set.
func applyPreset(vars map[string]string) error {
	name, ok := vars[envPrefix+"PRESET"]
	if !ok || name == "" {
		return nil
	}
	preset, ok := presets[name]
	if !ok {
		return bad("PRESET", fmt.Errorf("unknown preset %q (want %s)", name, presetNames()))
	}
	for k, v := range preset {
		if _, set := vars[envPrefix+k]; !set {
			vars[envPrefix+k] = v
		}
	}
	return nil
}
