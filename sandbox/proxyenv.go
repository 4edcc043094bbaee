package sandbox

import (
	"fmt"
	"strings"
)

// ProxyEnv returns the idemproxy settings that make idemproxy talk to a
// sandbox built from cfg and reachable at upstreamURL, one NAME=value per
// line with the value quoted for a POSIX shell: the provider's preset
// (IDEMPROXY_PRESET, named like the provider), the URL, and the credentials
// the sandbox checks. The secret itself is never written out:
// IDEMPROXY_SIGN_SECRET refers to "$SANDBOX_SECRET".
func ProxyEnv(cfg Config, upstreamURL string) []string {
	lines := []string{
		"IDEMPROXY_PRESET=" + cfg.Provider,
		"IDEMPROXY_UPSTREAM_URL=" + shellQuote(upstreamURL),
	}
	if len(cfg.Secret) > 0 {
		lines = append(lines, `IDEMPROXY_SIGN_SECRET="$SANDBOX_SECRET"`)
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

// shellQuote single-quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
