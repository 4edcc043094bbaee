package proxy_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/sandbox"
)

// keyLookupProvider verifies the payments provider's signature over method,
// path, timestamp, nonce, Idempotency-Key and the body's SHA-256, reading the
// key as the whole field value: several field lines of one name are one
// comma-joined value (RFC 9110 §5.3), as Node, WSGI and most frameworks hand
// it to the provider's code. It records the key lines of every request.
type keyLookupProvider struct {
	mu   sync.Mutex
	keys [][]string
}

func (p *keyLookupProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	lines := r.Header.Values("Idempotency-Key")
	p.mu.Lock()
	p.keys = append(p.keys, lines)
	p.mu.Unlock()
	sum := sha256.Sum256(body)
	canonical := strings.Join([]string{r.Method, r.URL.EscapedPath(), r.Header.Get("X-Timestamp"),
		r.Header.Get("X-Nonce"), strings.Join(lines, ", "), hex.EncodeToString(sum[:])}, "\n")
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(canonical))
	if got, _ := hex.DecodeString(r.Header.Get("X-Signature")); !hmac.Equal(got, m.Sum(nil)) {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"signature_invalid"}}`)
		return
	}
	io.WriteString(w, `{"status":"succeeded"}`)
}

// An unprotected request (a lookup) whose app sent its Idempotency-Key on
// two lines, repeated identically, goes upstream with the key once: both
// lines forwarded, the provider read "k1, k1" where idemproxy signed "k1",
// and refused every such lookup (401). The key goes as a protected request
// with that header sends it ("k1" quoted as an RFC 8941 string is k1), so a
// lookup names the operation the order went under. Lines that differ are
// refused, nothing sent, as they are on a protected request: which one the
// provider reads, and which one idemproxy signs, is anyone's guess.
func TestUnprotectedKeyLinesGoOnce(t *testing.T) {
	tpl, _ := resign.ParseTemplate(sandbox.PaymentsCanonical)
	prov := &keyLookupProvider{}
	url := chain(t, prov, resign.Config{Secret: secret, Template: tpl, NonceHeader: "X-Nonce"}, fastPolicy(1))
	cases := []struct {
		name   string
		lines  []string
		status int
		sent   []string // the key lines the provider got; nil: nothing sent
	}{
		{"one line", []string{"k1"}, http.StatusOK, []string{"k1"}},
		{"repeated", []string{"k1", "k1"}, http.StatusOK, []string{"k1"}},
		{"repeated, one quoted", []string{"k1", `"k1"`}, http.StatusOK, []string{"k1"}},
		{"quoted", []string{`"k1"`}, http.StatusOK, []string{"k1"}},
		{"lines that differ", []string{"k1", "k2"}, http.StatusBadRequest, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prov.mu.Lock()
			prov.keys = nil
			prov.mu.Unlock()
			req, _ := http.NewRequest("GET", url+"/payments/pay-1", nil)
			req.Header["Idempotency-Key"] = c.lines
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Errorf("got %d %s, want %d", resp.StatusCode, b, c.status)
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			switch {
			case c.sent == nil && len(prov.keys) != 0:
				t.Errorf("provider got %q, want nothing sent", prov.keys)
			case c.sent != nil && (len(prov.keys) != 1 || strings.Join(prov.keys[0], "|") != strings.Join(c.sent, "|")):
				t.Errorf("provider got key lines %q, want one request with %q", prov.keys, c.sent)
			}
		})
	}
}
