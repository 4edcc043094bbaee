package sandbox

import (
	"fmt"
	"strings"
)

// ProxyEnv returns the idemproxy settings that make idemproxy talk to a
// sandbox built from cfg and reachable at upstreamURL, one NAME=value per
// line with the value quoted for a POSIX shell. The secret itself is never
// written out: IDEMPROXY_SIGN_SECRET refers to "$SANDBOX_SECRET".
func ProxyEnv(cfg Config, upstreamURL string) []string {
	lines := []string{
		"IDEMPROXY_UPSTREAM_URL=" + shellQuote(upstreamURL),
		"IDEMPROXY_KEY_SOURCES=" + shellQuote("json:order_id"),
	}
	if len(cfg.Secret) > 0 {
		canonical := TimestampCanonical
		if cfg.Provider == ProviderPayments {
			canonical = PaymentsCanonical
			lines = append(lines, "IDEMPROXY_NONCE_HEADER=X-Nonce")
		}
		lines = append(lines,
			`IDEMPROXY_SIGN_SECRET="$SANDBOX_SECRET"`,
			"IDEMPROXY_SIGN_CANONICAL="+shellQuote(canonical),
			"IDEMPROXY_SIGN_ENCODING=hex",
			"IDEMPROXY_SIGNATURE_HEADER=X-Signature",
			"IDEMPROXY_TIMESTAMP_HEADER=X-Timestamp")
	}
	if cfg.Provider == ProviderPayouts && cfg.PublicID != "" {
		lines = append(lines, "IDEMPROXY_STATIC_HEADERS="+shellQuote("X-Public-Id="+cfg.PublicID))
	}
	if cfg.RateLimit > 0 {
		lines = append(lines, fmt.Sprintf("IDEMPROXY_RATE_LIMIT=%g", cfg.RateLimit),
			fmt.Sprintf("IDEMPROXY_RATE_BURST=%d", orDefault(cfg.RateBurst, 1)))
	}
	return lines
}

// shellQuote single-quotes s for a POSIX shell; "\n" stays two characters,
// as IDEMPROXY_SIGN_CANONICAL wants.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
