package main

// End-to-end tests of form bodies and queries as PHP reads them, through
// the real binary: a PHP provider ($_POST, $_GET) reads field names and
// values that idemproxy's form and query sources used to read otherwise.

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// phpOrderProvider executes each Idempotency-Key once and reads order_id as
// PHP does: $_POST['order_id'] from an application/x-www-form-urlencoded
// body, else $_GET['order_id'], counting executions per order. Like PHP's
// php_default_treat_data it splits at '&', decodes names and values with
// urldecode (which keeps a '%' not followed by two hex digits as it is),
// and registers a name as php_register_variable_ex does: leading spaces
// dropped, cut at a NUL, ' ' and '.' turned into '_', a '[' with no ']'
// after it too, a name[index] being an array; the last field wins.
type phpOrderProvider struct {
	mu     sync.Mutex
	keys   map[string]bool
	orders map[string]int
}

func (p *phpOrderProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	order := ""
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		order = phpVars(string(b))["order_id"]
	}
	if order == "" {
		order = phpVars(r.URL.RawQuery)["order_id"]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); !p.keys[key] {
		p.keys[key] = true
		p.orders[order]++
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q}`, order)
}

// phpVars reads form text s as PHP's request variables (see
// phpOrderProvider); an array variable is "Array", as PHP converts it to a
// string.
func phpVars(s string) map[string]string {
	vars := map[string]string{}
	for _, pair := range strings.Split(s, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		name := strings.TrimLeft(phpURLDecode(k), " ")
		name, _, _ = strings.Cut(name, "\x00")
		array := false
		if i := strings.IndexByte(name, '['); i >= 0 {
			if strings.IndexByte(name[i:], ']') > 0 {
				name, array = name[:i], true
			} else {
				name = name[:i] + "_" + strings.NewReplacer("[", "_").Replace(name[i+1:])
			}
		}
		name = strings.NewReplacer(" ", "_", ".", "_").Replace(name)
		if name == "" {
			continue
		}
		if array {
			vars[name] = "Array"
			continue
		}
		vars[name] = phpURLDecode(v)
	}
	return vars
}

// phpURLDecode is PHP's urldecode: '+' is a space, %XX a byte, and a '%'
// not followed by two hex digits is kept.
func phpURLDecode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b.WriteByte(' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			var n byte
			fmt.Sscanf(s[i+1:i+3], "%02x", &n)
			b.WriteByte(n)
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// phpPost sends a POST of a form body to path, as raw bytes.
func phpPost(t *testing.T, addr, path, body string) reply {
	t.Helper()
	return rawExchange(t, addr, fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nContent-Type: application/x-www-form-urlencoded\nContent-Length: %d\n\n%s",
		path, len(body), body))
}

// phpProxy runs the binary, with the form and query sources and the
// missing-key policy, in front of a phpOrderProvider.
func phpProxy(t *testing.T, policy string) (*phpOrderProvider, *proc) {
	prov := &phpOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}
	up := httptest.NewServer(prov)
	t.Cleanup(up.Close)
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id,query:order_id",
		"IDEMPROXY_MISSING_KEY="+policy)...)
	return prov, p
}

// checkPHPOrders fails unless prov executed exactly the orders in want.
func checkPHPOrders(t *testing.T, prov *phpOrderProvider, want map[string]int) {
	t.Helper()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if !maps.Equal(prov.orders, want) {
		t.Errorf("provider executed orders %v, want each once: %v", prov.orders, want)
	}
}

// A form body whose order_id value has a '%' that is not an escape
// ("order_id=50%off", an id a legacy app wrote into the body unescaped) is
// forwarded as it came, and PHP reads it as order 50%off; so it is 422 with
// nothing sent under every IDEMPROXY_MISSING_KEY, and so is such a value
// beside a well-formed one, which PHP reads as the last. Before the fix
// idemproxy skipped the field as url.ParseQuery does: under generate each
// blind retry of "order_id=50%off" went with a new random key and the
// provider executed order 50%off twice; and "order_id=b1&order_id=b1%zz"
// went under order b1's key while the provider executed order b1%zz.
func TestHostileFormValueWithBadEscape(t *testing.T) {
	for _, policy := range []string{"reject", "generate", "passthrough"} {
		t.Run(policy, func(t *testing.T) {
			prov, p := phpProxy(t, policy)
			for _, body := range []string{"order_id=50%off&amount=5", "order_id=b1&order_id=b1%zz&amount=5", "amount=5&order_id=b2%"} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					if got := phpPost(t, p.addr, "/v1/payout", body); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s, try %d: %d %s, want 422 idempotency_key_missing", body, try, got.status, got.body)
					}
				}
			}
			// The same ids escaped, and an escape elsewhere in the body,
			// are one order each.
			for try := 1; try <= 2; try++ {
				for _, body := range []string{"order_id=50%25off&amount=5", "order_id=b1&note=100%&amount=5"} {
					if got := phpPost(t, p.addr, "/v1/payout", body); got.status != http.StatusCreated {
						t.Errorf("%s, try %d: %d %s, want 201", body, try, got.status, got.body)
					}
				}
			}
			checkPHPOrders(t, prov, map[string]int{"50%off": 1, "b1": 1})
		})
	}
}

// A form field or query parameter that PHP registers as order_id under
// another spelling ("order.id", "order id", " order_id", "order[id", an
// array "order_id[]", a name cut at a NUL) is a spelling of order_id, as
// one in another letter case is: 422 with nothing sent under every
// IDEMPROXY_MISSING_KEY when it is the only one or beside order_id with
// another value. Before the fix idemproxy did not see it: under generate
// each blind retry of "order.id=n1" got a new random key and the provider,
// reading $_POST['order_id'], executed n1 once per try; under reject,
// "order_id=n6&order.id=n6b" went under order n6's key while PHP executed
// n6b, the last.
func TestHostileFormNameAsPHPReadsIt(t *testing.T) {
	for _, policy := range []string{"reject", "generate"} {
		t.Run(policy, func(t *testing.T) {
			prov, p := phpProxy(t, policy)
			for _, c := range []struct{ path, body string }{
				{"/v1/payout", "order.id=n1&amount=5"},
				{"/v1/payout", "order+id=n2&amount=5"},
				{"/v1/payout", "+order_id=n3&amount=5"},
				{"/v1/payout", "order_id%00x=n4&amount=5"},
				{"/v1/payout", "order[id=n5&amount=5"},
				{"/v1/payout", "order_id=n6&order.id=n6b&amount=5"},
				{"/v1/payout", "order_id=n8&order_id[]=n8b&amount=5"},
				{"/v1/payout?order.id=q1", "amount=5"},
			} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					if got := phpPost(t, p.addr, c.path, c.body); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s %s, try %d: %d %s, want 422 idempotency_key_missing", c.path, c.body, try, got.status, got.body)
					}
				}
			}
			// Other fields with dots or brackets leave order_id alone.
			for try := 1; try <= 2; try++ {
				if got := phpPost(t, p.addr, "/v1/payout?order.x=1", "order_id=n7&order.x=1&items[]=a&amount=5"); got.status != http.StatusCreated {
					t.Errorf("n7, try %d: %d %s, want 201", try, got.status, got.body)
				}
			}
			checkPHPOrders(t, prov, map[string]int{"n7": 1})
		})
	}
}

// An order posted as a form in UTF-16 (.NET's StringContent with
// Encoding.Unicode and "application/x-www-form-urlencoded; charset=utf-16",
// which ASP.NET Core's form reader decodes in that charset) has a key
// source idemproxy cannot read: 422 with nothing sent under
// IDEMPROXY_MISSING_KEY=generate too, as a JSON body in UTF-16 is. Before
// the fix it got a new random key on each blind retry, and the provider
// executed order w16-2 twice.
func TestHostileUTF16FormOrder(t *testing.T) {
	prov := &utf16Provider{goOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id", "IDEMPROXY_MISSING_KEY=generate")...)
	body := []byte{0xff, 0xfe}
	for _, r := range "order_id=w16-2&amount=5.00" {
		body = binary.LittleEndian.AppendUint16(body, uint16(r))
	}
	for try := 1; try <= 2; try++ {
		got := rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/x-www-form-urlencoded; charset=utf-16\nContent-Length: %d\n\n%s", len(body), body))
		if got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
			t.Errorf("try %d: %d %s, want 422 idempotency_key_missing", try, got.status, got.body)
		}
	}
	// The same form in UTF-8 is one order.
	for try := 1; try <= 2; try++ {
		if got := phpPost(t, p.addr, "/v1/payout", "order_id=w8-2&amount=5.00"); got.status != http.StatusCreated {
			t.Errorf("UTF-8, try %d: %d %s, want 201", try, got.status, got.body)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if want := map[string]int{"w8-2": 1}; !maps.Equal(prov.orders, want) {
		t.Errorf("provider executed orders %v, want %v", prov.orders, want)
	}
}

// semicolonOrderProvider executes each Idempotency-Key once and reads a form
// body as Perl's CGI.pm, Go before 1.17, Python's parse_qs before 3.9.2 and
// Django before 3.2 do: fields are separated by '&' or ';', and the first
// order_id wins (Go's FormValue), counting executions per order.
type semicolonOrderProvider struct {
	mu     sync.Mutex
	keys   map[string]bool
	orders map[string]int
}

func (p *semicolonOrderProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	order := ""
	for _, field := range strings.FieldsFunc(string(b), func(c rune) bool { return c == '&' || c == ';' }) {
		if k, v, _ := strings.Cut(field, "="); k == "order_id" && order == "" {
			order, _ = url.QueryUnescape(v)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); key == "" || !p.keys[key] {
		p.keys[key] = true
		p.orders[order]++
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q}`, order)
}

// A form body whose order_id is in a field with a ';' ("amount=5;order_id=s1",
// "order_id=s2;amount=5", a legacy app joining fields with ';') is forwarded
// as it came, and a provider that splits forms at ';' too (Perl's CGI.pm, Go
// before 1.17, Python before 3.9.2, Django before 3.2) reads order s1 or s2
// from it, where PHP, Java, Rack and Node.js read none or "s2;amount=5". So
// it is 422 with nothing sent under every IDEMPROXY_MISSING_KEY. Before the
// fix, under generate and passthrough each blind retry of
// "amount=5;order_id=s1" went with a new random key or none and the provider
// executed s1 once per try; under every policy "order_id=s2;amount=5" went
// under the key of order "s2;amount=5", the provider executed s2, and the
// app's retry of s2 spelt with '&' was executed again. A ';' in another
// field changes nothing.
func TestHostileFormFieldsJoinedBySemicolon(t *testing.T) {
	for _, policy := range []string{"reject", "generate", "passthrough"} {
		t.Run(policy, func(t *testing.T) {
			prov := &semicolonOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}
			up := httptest.NewServer(prov)
			defer up.Close()
			p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id",
				"IDEMPROXY_MISSING_KEY="+policy)...)
			for _, body := range []string{"amount=5;order_id=s1", "order_id=s2;amount=5", "order_id=s3&note=x;order_id=s3b", "x;order_id=s4&amount=5"} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					if got := phpPost(t, p.addr, "/v1/payout", body); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s, try %d: %d %s (key %q), want 422 idempotency_key_missing", body, try, got.status, got.body, got.header.Get("Idempotency-Key"))
					}
				}
			}
			for try := 1; try <= 2; try++ {
				for _, body := range []string{"order_id=s2&amount=5", "order_id=s5&note=a;b&amount=5"} {
					if got := phpPost(t, p.addr, "/v1/payout", body); got.status != http.StatusCreated {
						t.Errorf("%s, try %d: %d %s, want 201", body, try, got.status, got.body)
					}
				}
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if want := map[string]int{"s2": 1, "s5": 1}; !maps.Equal(prov.orders, want) {
				t.Errorf("provider executed orders %v, want each once: %v", prov.orders, want)
			}
		})
	}
}
