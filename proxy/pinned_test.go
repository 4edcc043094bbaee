package proxy_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// pinnedMultipart is a multipart/form-data body with the boundary "pin".
const pinnedMultipart = "--pin\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n10.00\r\n" +
	"--pin\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\nmp-1\r\n--pin--\r\n"

// The key and the fingerprint the proxy gives each of these requests are
// the ones the versions before the body was read once for both gave
// (computed on main at b795eb4): a record an earlier version stored must
// still be found under its key and match its fingerprint after an upgrade,
// or its retry is sent again (a second charge) or refused 409. Each body
// stands for a way the canonical form or a key source could drift: nested
// objects, number spellings (1e3, 1000, 1.0 are three fingerprints; 1000 and
// "1000" one key), unicode escapes and lone surrogates, repeated members
// (same value, different values, other letter case), escaped member names,
// a byte order mark, form, multipart and gzip bodies, invalid JSON, a key
// from the query, and a path spelled otherwise than its normal form.
func TestKeysAndFingerprintsPinned(t *testing.T) {
	sources := func(o *proxy.Options, _ *retry.Policy) {
		o.KeySources, _ = idemkey.ParseSources("json:order_id,json:payment.order_id,form:order_id,query:order_id")
	}
	gz := gzipped(t, `{"order_id":"gz-1","amount":1000}`, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, c := range []struct {
		name, path, body string
		hdr              []string
		key, fp          string
	}{
		{"flat", "/v1/payments", `{"order_id":"o-1","amount":1000,"currency":"RUB","description":"idembench payment","customer":{"id":"cus_0001","email":"buyer@example.com"}}`, nil,
			"67278ac3-5192-54f9-b342-ea2e8207d8a5", "2e092c52aeef5271b66957217294d11201f17fb7a9d032de95b55ee16ec22220"},
		{"nested", "/v1/payments", `{"meta":[1,{"b":2,"a":[{"z":null,"y":true}]}],"payment":{"order_id":"n-1","amount":{"value":1000,"cur":"RUB"}}}`, nil,
			"282bbd8f-54d1-59c4-8144-43b1bce819d0", "1bed2a0af30c184925cc61d94395677f3df4f011066adebc884dfdba64ff8d53"},
		{"numbers 1e3", "/v1/payments", `{"order_id":1e3,"amount":1000,"fee":1.0,"x":-0.5E+2}`, nil,
			"c3caa4ce-4286-5e83-8bdf-5bbca1b530e0", "1331444a3645b4ab147697c2e2b42fb11940ea46b72e86d40f64b155b660a1f2"},
		{"numbers 1000", "/v1/payments", `{"order_id":1000,"amount":1000,"fee":1.0,"x":-0.5E+2}`, nil,
			"a8fc629e-ddce-51d3-a71b-a7c7c5a41c95", "8c3e6db20553fa6a8af6bbe075a1de07299cb8a0517c34ac267127f25f468c21"},
		{"numbers \"1000\"", "/v1/payments", `{"order_id":"1000","amount":1e3,"fee":1,"x":-50}`, nil,
			"a8fc629e-ddce-51d3-a71b-a7c7c5a41c95", "094c2d8fe1b7b6728bbc45085009927b3f725da78d91a2067eec10788256bee9"},
		{"unicode escapes", "/v1/payments", `{"order_id":"caf\u00e9-\ud83d\ude00","note":"\u0041\n\u001f\/","lone":"\ud800x\udc00"}`, nil,
			"575ef140-c9db-56a4-aa26-ca5c0d9e96dd", "fc154be286780c02b1f5294735b889c19975a3ee5bbea281f541d9bc9477cff4"},
		{"unicode raw", "/v1/payments", `{"order_id":"café-😀","note":"A\n\u001F/","lone":"\uD800x\uDC00"}`, nil,
			"575ef140-c9db-56a4-aa26-ca5c0d9e96dd", "fc154be286780c02b1f5294735b889c19975a3ee5bbea281f541d9bc9477cff4"},
		{"escaped member name", "/v1/payments", `{"order\u005fid":"esc-1","a":1}`, nil,
			"802aa81b-f9c2-5e44-a69b-9614bcf2c961", "9cc30553032b9b8ac99980860b4e69792c2b08ba76a1bcf13c7b910f86b17931"},
		{"repeated same", "/v1/payments", `{"order_id":"d-1","amount":1,"order_id":"d\u002d1"}`, nil,
			"a9632534-2b3b-52d5-8f8c-673ca5c1e85e", "2e08feb87df6be548160e56784982631525e6ccdd31ddd90acf1580d16828100"},
		{"repeated different", "/v1/payments", `{"order_id":"a","ORDER_ID":"b","payment":{"order_id":"p-2"}}`, nil,
			"4707b273-2563-5b45-9c4d-58b5f4735f59", "5de0fb8578f9b606800874d26e59c7c3f516c89c3024e70cf1050552be6d54f5"},
		{"repeated other case only", "/v1/payments", `{"Order_Id":"c-1","payment":{"order_id":"p-3","order_id":"p-3"}}`, nil,
			"ebcbc89f-d29a-5c7d-990a-ab92f4a15265", "38bbe854934e3613081f60e7bcf2c353235bc6f6062011493906520b73cba741"},
		{"repeated nested", "/v1/payments", `{"payment":{"order_id":"x"},"payment":{"order_id":"x","b":1}}`, nil,
			"3e18e515-0d9a-5d93-8479-bc9facaa24cc", "8c3918909f00362d834d8ffba9068fe1426fe9685eead4c2e583850ec38d93c0"},
		{"whitespace and order", "/v1/payments", "{ \"z\" : [ 1 , 2 ] ,\n\t\"order_id\" : \"ws-1\" , \"a\":{}}\r\n", nil,
			"7fe7b423-b005-5850-aeda-cd199e683b79", "a0db4846a581270c64f95ed1ec505a51106f03a81279b6919acfa9e88b7b0c75"},
		{"byte order mark", "/v1/payments", "\xef\xbb\xbf{\"order_id\":\"bom-1\"}", nil,
			"bd617a61-73e3-5c71-ae58-30c89768b83f", "dad5efc552a84db74a791563cb521ff8168f009c3bbc9879902c674fb46ef152"},
		{"json as text/plain", "/v1/payments", `{"order_id":"tp-1","b":[]}`, []string{"Content-Type", "text/plain"},
			"f08495c3-6397-5b0d-ace8-e5401f630098", "a80abe250b110559a5757a12ce5c5d1e3b2d66a1f990b4db73f8e668d84ab658"},
		{"form", "/v1/payments", "order_id=f-1&amount=10.00&b=%20x&a=1", []string{"Content-Type", "application/x-www-form-urlencoded"},
			"40f21d48-0cb9-5a39-9147-a48b2bc76e37", "6edabbb861e7cd4a032a7941ee5a2392bbfcf01118f440784ad25300ae924f25"},
		{"multipart", "/v1/payouts", pinnedMultipart, []string{"Content-Type", "multipart/form-data; boundary=pin"},
			"2c9a035d-c06e-5040-acb7-1d98f0432901", "19387e27b030da2d90c4a9d72a23e7cca9bb919549e4b56f67b34792790dc1a6"},
		{"gzip", "/v1/payments", gz, []string{"Content-Encoding", "gzip"},
			"5dc0cfbf-6522-54f4-a673-ce4bfcd6ebe3", "55d2979f771e98752857011a6d86889367998901ccc632052190874b6bb4b611"},
		{"query", "/v1/payments?order_id=q-1&b=2&a=%7E", `[1,{"b":1,"a":2}]`, nil,
			"7386b5de-1818-5062-99d3-aa4fc6d0f786", "60e96738b969ab282e73801ef0a647c96b476774acb82a0c0fbe843c5e865a0e"},
		{"invalid json, app's key", "/v1/payments", `{"order_id":"inv-1",}`, []string{"Idempotency-Key", "app-key-1"},
			"app-key-1", "a1b01260b2b622af420ca67724c550d56b21984bc40530ff6787d9b1af8629a4"},
		{"app's key over a source", "/v1/payments", `{"order_id":"own-1"}`, []string{"Idempotency-Key", "app-key-2"},
			"app-key-2", "7b3163b8ba8152eab1f4b7bc611eed1334953c1d4585466b164aab2eaa1b3ee9"},
		{"path spelled otherwise", "/v1/p%61yments", `{"order_id":"sp-1"}`, nil,
			"2e241303-758c-5121-9c99-5f56c32d910b", "b8e4e3db19dfd870ba7338eb6b7c74639982091c4c70f840381d7d97536b06da"},
	} {
		e := newEnv(t, sources) // a store of its own: some cases share a key (1000 and "1000")
		a := e.do(t, "POST", c.path, c.body, c.hdr...)
		if a.status != http.StatusCreated {
			t.Errorf("%s: %d %s", c.name, a.status, a.body)
			continue
		}
		key := a.header.Get("Idempotency-Key")
		rec, err := e.store.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
		if err != nil {
			t.Errorf("%s: record of key %s: %v", c.name, key, err)
			continue
		}
		fp := hex.EncodeToString(rec.Fingerprint)
		t.Logf("%s: key %s fp %s", c.name, key, fp)
		if key != c.key || fp != c.fp {
			t.Errorf("%s: key %s, fingerprint %s; want key %s, fingerprint %s", c.name, key, fp, c.key, c.fp)
		}
	}
}
