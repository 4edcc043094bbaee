package proxy

import (
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/retry"
)

// outgoingKey says which Idempotency-Key the upstream request carries.
type outgoingKey struct {
	value      string // the key idemproxy sends; "" sends none
	keepClient bool   // send the client's own key header as it came (unprotected requests)
}

// replayLicenceHeaders are the other spelling of the key header that net/http
// and some providers read; a client's copy never goes upstream.
var replayLicenceHeaders = []string{"X-Idempotency-Key"}

// reverseProxy returns the ReverseProxy for one request, whose Rewrite sets the
// request's outgoing key and whose Transport runs the request's attempt
// sequence as ex says. A copy per request keeps the key and the call explicit
// values instead of a header on the client's request (where a Connection
// header naming it would remove it from the upstream copy) or a context value.
func (h *Handler) reverseProxy(key outgoingKey, ex *retry.Exchange) *httputil.ReverseProxy {
	rp := *h.rp
	rp.Rewrite = func(pr *httputil.ProxyRequest) { h.rewrite(pr, key) }
	rp.Transport = ex
	return &rp
}

// rewrite builds the upstream request. It runs after ReverseProxy removed the
// hop-by-hop headers, the ones a client's Connection header names included,
// so what it sets reaches the attempt layer whatever the client sent: the
// key here, and the signature, timestamp, nonce and static credentials in the
// signing layer below, on every attempt.
func (h *Handler) rewrite(pr *httputil.ProxyRequest, key outgoingKey) {
	pr.SetURL(h.opt.Upstream)
	out := pr.Out.Header
	if h.opt.Clients != nil { // idemproxy's own credential stays here
		delFold(out, h.opt.Clients.Header())
	}
	// The body is buffered or streamed already; waiting for 100 Continue only adds latency.
	out.Del("Expect")
	delFold(out, replayLicenceHeaders...)
	if !key.keepClient {
		delFold(out, KeyHeader)
		if key.value != "" {
			out.Set(KeyHeader, key.value)
		}
	}
	// Trailers arrive after the body and were never checked: none go upstream.
	pr.Out.Trailer = nil
}

// delFold deletes names from h whatever the case of h's keys: a Header map
// built in code need not hold canonical keys.
func delFold(h http.Header, names ...string) {
	for k := range h {
		for _, n := range names {
			if strings.EqualFold(k, n) {
				delete(h, k)
			}
		}
	}
}

// upstreamKey is the key sent upstream for tenant's key: the key itself
// without client authentication (keys stay as they always were), else bound
// to the client with the key secret.
func (h *Handler) upstreamKey(tenant, key string) string {
	if h.opt.Clients == nil {
		return key
	}
	return idemkey.Bind(h.opt.KeySecret, tenant, key)
}

// unprotectedKey is the outgoing key of an unprotected request: the client's
// own header as it came without client authentication (idemproxy keeps no
// record of it), else the client's key bound like a protected one, so that
// no client can reach another's operation at the provider through it.
func (h *Handler) unprotectedKey(r *http.Request, tenant string) (outgoingKey, error) {
	if h.opt.Clients == nil {
		return outgoingKey{keepClient: true}, nil
	}
	key, present, err := idemkey.FromHeader(r.Header)
	if err != nil || !present {
		return outgoingKey{}, err
	}
	return outgoingKey{value: h.upstreamKey(tenant, key)}, nil
}
