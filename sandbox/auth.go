package sandbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Canonical-string templates in idemproxy's IDEMPROXY_SIGN_CANONICAL syntax,
// where "\n" (backslash, n) stands for a newline.
const (
	// PaymentsCanonical matches the payments provider:
	// METHOD\npath\ntimestamp\nnonce\nidempotency_key\nhex(sha256(body)).
	PaymentsCanonical = `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`
	// TimestampCanonical matches the payouts and cards providers
	// (timestamp\nMETHOD\npath\nbody).
	TimestampCanonical = `{timestamp}\n{method}\n{path}\n{body}`
)

// signatureWindow is how far X-Timestamp may be from now: 300 s for
// payments, ±5 minutes for payouts.
const signatureWindow = 300 * time.Second

// Sign returns the lowercase hex HMAC-SHA256 of canonical under secret, as
// every provider expects in X-Signature. Exported for tests and tools that
// talk to the sandbox directly.
func Sign(secret []byte, canonical string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(canonical))
	return hex.EncodeToString(m.Sum(nil))
}

// PaymentsString is the payments canonical string for one request.
func PaymentsString(method, path, timestamp, nonce, idempotencyKey string, body []byte) string {
	sum := sha256.Sum256(body)
	return strings.Join([]string{method, path, timestamp, nonce, idempotencyKey, hex.EncodeToString(sum[:])}, "\n")
}

// TimestampString is the payouts and cards canonical string for one request.
func TimestampString(timestamp, method, path string, body []byte) string {
	return timestamp + "\n" + method + "\n" + path + "\n" + string(body)
}

// fresh reports whether ts is unix seconds within signatureWindow of now.
func fresh(ts string, now time.Time) bool {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	d := now.Sub(time.Unix(sec, 0))
	return d <= signatureWindow && d >= -signatureWindow
}

// validSignature compares a hex signature with the expected one in constant
// time; hex case does not matter.
func validSignature(secret []byte, canonical, got string) bool {
	gotRaw, err := hex.DecodeString(got)
	if err != nil {
		return false
	}
	want, _ := hex.DecodeString(Sign(secret, canonical)) // Sign always returns valid hex
	return hmac.Equal(gotRaw, want)
}

// Why a request was not authentic; providers map these to their own codes.
var (
	errStaleTimestamp = errors.New("X-Timestamp missing or outside the 300 s window")
	errBadSignature   = errors.New("X-Signature missing or wrong")
)

// checkTimestampSigned checks X-Timestamp and X-Signature over
// TimestampString, the cards and payouts scheme.
func checkTimestampSigned(c *call, secret []byte, now time.Time) error {
	ts := c.r.Header.Get("X-Timestamp")
	if !fresh(ts, now) {
		return errStaleTimestamp
	}
	canonical := TimestampString(ts, c.r.Method, c.r.URL.EscapedPath(), c.body)
	if !validSignature(secret, canonical, c.r.Header.Get("X-Signature")) {
		return errBadSignature
	}
	return nil
}
