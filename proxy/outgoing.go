package proxy

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"slices"
	"strings"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/retry"
)

// outgoingKey says which Idempotency-Key the upstream request carries.
type outgoingKey struct {
	value      string // the key idemproxy sends; "" sends none
	keepClient bool   // send the client's own key header as it came (unprotected requests)
	// app is the app's own key when value is that key bound to its client
	// (an unprotected request with client tokens): the answer shows the app
	// this one where the provider echoes value.
	app string
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
	if key.app != "" {
		rp.ModifyResponse = func(resp *http.Response) error {
			showAppKey(resp.Header, key)
			return nil
		}
	}
	return &rp
}

// showAppKey replaces, in an answer's header, the bound key the provider
// echoes with the app's own: the app sees its own key in every answer
// (docs/contract.md, Tenancy), never the one only idemproxy can compute.
func showAppKey(h http.Header, key outgoingKey) {
	for i, v := range h[KeyHeader] { // an answer's header names arrive canonical
		if v == key.value {
			h[KeyHeader][i] = key.app
		}
	}
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
	h.dropUnderscored(out)
	// Trailers arrive after the body and were never checked: none go upstream.
	pr.Out.Trailer = nil
}

// dropUnderscored removes the client's headers that spell a header
// idemproxy owns with underscores for dashes (Idempotency_Key, X_Signature,
// Idemproxy_Client_Token). Rack, WSGI, PHP and other servers that turn
// header names into CGI-style variables (HTTP_IDEMPOTENCY_KEY) read such a
// header as the one idemproxy set, beside it or in its place (Puma's
// CVE-2024-45614), so it would pass a key, signature or credential of the
// client's own choosing, or the client's token, to the provider.
func (h *Handler) dropUnderscored(out http.Header) {
	for k := range out {
		if strings.IndexByte(k, '_') >= 0 && h.underscored[textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(k, "_", "-"))] {
			delete(out, k)
		}
	}
}

// outbound builds the upstream request of a protected operation, as
// httputil.ReverseProxy with h.rewrite builds it for the forward path: a copy
// of r bound to ctx, with the length of body (which the caller hands the
// attempt layer as retry.Call.Body: each attempt gets its own reader over
// it, so this request carries none), without hop-by-hop headers (those
// its Connection header names included) and client-sent forwarding headers,
// with unparsable query parameters dropped, without the client's
// Accept-Encoding, then rewritten (rewrite: URL, key, credential, trailers)
// and without Go's default User-Agent.
func (h *Handler) outbound(ctx context.Context, r *http.Request, body []byte, key outgoingKey) *http.Request {
	out := r.WithContext(ctx)
	u := *r.URL
	out.URL = &u
	out.Header = r.Header.Clone()
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	out.Body, out.GetBody, out.ContentLength, out.TransferEncoding = nil, nil, int64(len(body)), nil
	out.Close = false
	removeHopByHop(out.Header)
	if tokenListHas(r.Header["Te"], "trailers") {
		out.Header["Te"] = []string{"trailers"}
	}
	for _, n := range forwardingHeaders {
		delete(out.Header, n)
	}
	// The answer is read here, not by the app: its codes and status words
	// decide retries, and its bytes are stored and replayed to any app
	// that repeats the request. Without the app's Accept-Encoding, Go's
	// transport asks for gzip itself and decodes it.
	delete(out.Header, "Accept-Encoding")
	out.URL.RawQuery = cleanQueryParams(out.URL.RawQuery)
	pr := httputil.ProxyRequest{In: r, Out: out}
	h.rewrite(&pr, key)
	if _, ok := pr.Out.Header["User-Agent"]; !ok {
		pr.Out.Header["User-Agent"] = noUserAgent
	}
	return pr.Out
}

// noUserAgent keeps net/http from sending its default User-Agent. Shared by
// every request: nothing writes into a header's value slice in place.
var noUserAgent = []string{""}

// forwardingHeaders are removed from what a client sent, as ReverseProxy
// with Rewrite does: idemproxy does not vouch for them.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// hopHeaders are the hop-by-hop headers ReverseProxy removes in both
// directions (RFC 9110 section 7.6.1, plus the older ones it keeps removing).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// HopHeaders returns the hop-by-hop headers idemproxy removes in both
// directions (a copy).
func HopHeaders() []string { return slices.Clone(hopHeaders) }

// removeHopByHop deletes the headers h's Connection header names, then the
// hop-by-hop ones.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		delete(h, f)
	}
}

// tokenListHas says whether a comma-separated header holds token (any case).
func tokenListHas(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// cleanQueryParams drops what ReverseProxy drops from a query: if it has a
// semicolon or a bad escape, it is parsed and re-encoded, which removes the
// unparsable parameters; otherwise it is kept as it is.
func cleanQueryParams(s string) string {
	reencode := func(s string) string {
		v, _ := url.ParseQuery(s)
		return v.Encode()
	}
	for i := 0; i < len(s); {
		switch s[i] {
		case ';':
			return reencode(s)
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return reencode(s)
			}
			i += 3
		default:
			i++
		}
	}
	return s
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// answerHeader is the header of a protected operation's answer, as
// ReverseProxy passed it into a recorder: without hop-by-hop headers, and
// with the upstream's trailers (the body is read, so they have arrived)
// announced in a Trailer header and kept as headers.
func answerHeader(resp *http.Response) http.Header {
	h := resp.Header
	if h == nil {
		h = http.Header{}
	}
	removeHopByHop(h)
	if len(resp.Trailer) > 0 {
		keys := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
		for k, vv := range resp.Trailer {
			for _, v := range vv {
				h.Add(k, v)
			}
		}
	}
	return h
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

// unprotectedKey is the outgoing key of an unprotected request: without
// client authentication, the key a protected request with the client's
// header sends (idemproxy keeps no record of it), else the client's key
// bound like a protected one, so that no client can reach another's
// operation at the provider through it. A UUID key goes in its canonical
// spelling (idemkey.Canonical), as a protected request's does: a status
// lookup with the key upper-cased or in braces, as the app's database gives
// it back, asks the provider for the operation the order went under, not
// for one under another spelling that the provider never saw.
//
// Without client authentication, a header idemproxy cannot read as one key
// goes as it came when it is one line; on several lines that differ it is
// refused, nothing sent. Why: forwarded as they came, repeated lines reached
// the provider as one comma-joined value ("k1, k1", RFC 9110 §5.3) while the
// signature ({idempotency_key}) covered the first line only, so the payments
// provider refused every such lookup; lines that differ leave to chance
// which key the provider reads.
func (h *Handler) unprotectedKey(r *http.Request, tenant string) (outgoingKey, error) {
	key, present, err := idemkey.FromHeader(r.Header)
	if h.opt.Clients == nil {
		switch {
		case !present || err != nil && len(r.Header.Values(KeyHeader)) == 1:
			return outgoingKey{keepClient: true}, nil
		case err != nil:
			return outgoingKey{}, err
		}
		return outgoingKey{value: idemkey.Canonical(key)}, nil
	}
	if err != nil || !present {
		return outgoingKey{}, err
	}
	return outgoingKey{value: h.upstreamKey(tenant, idemkey.Canonical(key)), app: idemkey.HeaderValue(key)}, nil
}
