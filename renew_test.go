package main

// End-to-end tests of an order's key generations and of listing records by
// state, through the real binary in front of the cards sandbox (failed and
// needs_review operations on set amounts) and the records and orders
// subcommands.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// cardsSetup is the cards sandbox behind a gateway that answers 504 for
// orders F-unknown… without passing them on, and holds order F-held in
// flight until release is closed.
type cardsSetup struct {
	sb      *sandbox.Server
	held    chan struct{} // receives when F-held executes
	release chan struct{}
	p       *opsProc // where the app's requests go
	adm     *opsProc // where the operator's calls go: p, or another replica
	db      string   // the PostgreSQL database's URL, when shared
	dir     string   // the data directory, when not shared
	env     []string // the environment p runs with
	// unknownPosts counts the requests for orders F-unknown… that reached
	// the gateway.
	unknownPosts atomic.Int32
}

// onStores runs test on the embedded store and on PostgreSQL, where the
// app's requests go to one replica and the operator's calls to another.
func onStores(t *testing.T, test func(t *testing.T, shared bool)) {
	t.Run("badger", func(t *testing.T) { test(t, false) })
	t.Run("postgres", func(t *testing.T) { test(t, true) })
}

func startCards(t *testing.T, shared bool) *cardsSetup {
	t.Helper()
	c := &cardsSetup{held: make(chan struct{}, 1), release: make(chan struct{})}
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderCards, ExecuteHook: func(op sandbox.Operation) {
		if op.OrderID == "F-held" {
			c.held <- struct{}{}
			<-c.release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.sb = sb
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"F-unknown`)) {
			c.unknownPosts.Add(1)
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sb.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { close(c.release); up.Close() })
	if !shared {
		c.dir = t.TempDir()
		c.env = unknownEnv(up.URL, c.dir, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
		c.p = launch(t, launchSpec{env: c.env})
		c.adm = c.p
		return c
	}
	c.db = pgtest.Database(t)
	c.env = sharedEnv(up.URL, c.db, append(fastRetry(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)...)
	c.p = launch(t, launchSpec{env: c.env})
	c.adm = launch(t, launchSpec{env: c.env})
	return c
}

func (c *cardsSetup) post(t *testing.T, order, amount string) reply {
	t.Helper()
	return send(t, "POST", c.cardsURL(), cardOrder(order, amount))
}

// goPost is post from a new goroutine (goSend).
func (c *cardsSetup) goPost(order, amount string) <-chan sentReply {
	return goSend("POST", c.cardsURL(), cardOrder(order, amount))
}

func (c *cardsSetup) cardsURL() string { return "http://" + c.p.proxy + "/cards" }

func cardOrder(order, amount string) string {
	return `{"order_id":"` + order + `","amount":"` + amount + `","tariff_id":"t1"}`
}

func (c *cardsSetup) admin(t *testing.T, method, path, body string) reply {
	t.Helper()
	return send(t, method, "http://"+c.adm.admin+path, body, "Authorization", "Bearer "+adminToken)
}

func (c *cardsSetup) renew(t *testing.T, order string) reply {
	t.Helper()
	return c.admin(t, "POST", "/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"`+order+`"}`)
}

// cli runs the binary's operator subcommand against this instance.
func (c *cardsSetup) cli(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_ADDR=" + c.adm.admin, "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func TestRenewRefusedUnlessFailed(t *testing.T) { onStores(t, testRenewRefusedUnlessFailed) }

func testRenewRefusedUnlessFailed(t *testing.T, shared bool) {
	c := startCards(t, shared)
	if r := c.post(t, "F-ok", "10"); r.status != http.StatusOK {
		t.Fatalf("POST F-ok = %d %s", r.status, r.body)
	}
	if r := c.post(t, "F-unknown", "10"); r.status != http.StatusBadGateway {
		t.Fatalf("POST F-unknown = %d %s, want 502", r.status, r.body)
	}
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); !strings.Contains(r.body, `"needs_review"`) {
		t.Fatalf("POST F-review = %d %s, want needs_review", r.status, r.body)
	}
	heldDone := c.goPost("F-held", "10")
	<-c.held

	for order, why := range map[string]string{"F-ok": "success", "F-unknown": "unknown", "F-review": "needs review", "F-held": "in flight"} {
		r := c.renew(t, order)
		if r.status != http.StatusConflict || !strings.Contains(r.body, `"renew_refused"`) {
			t.Errorf("renew of %s (%s) = %d %s, want 409 renew_refused", order, why, r.status, r.body)
		}
	}

	// Listed by state, with their keys.
	for state, order := range map[string]string{"in_flight": "F-held", "unknown": "F-unknown", "needs_review": "F-review"} {
		o := c.admin(t, "GET", "/admin/v1/orders?method=POST&path=/cards&value="+order, "")
		var ord struct{ Key string }
		json.Unmarshal([]byte(o.body), &ord)
		l := c.admin(t, "GET", "/admin/v1/records?state="+state+"&limit=10", "")
		if l.status != http.StatusOK || ord.Key == "" || !strings.Contains(l.body, `"key":"`+ord.Key+`"`) {
			t.Errorf("list %s = %d %s, want the key %s of %s", state, l.status, l.body, ord.Key, order)
		}
		out, code := c.cli(t, "records", "list", "--state", state)
		if code != 0 || !strings.Contains(out, ord.Key) {
			t.Errorf("idemproxy records list --state %s = %d\n%s\nwant %s listed", state, code, out, ord.Key)
		}
	}
	c.release <- struct{}{}
	if r := <-heldDone; r.err != nil {
		t.Error(r.err)
	}

	// needs_review is final: a repeat replays, the provider never sees it again.
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat of F-review = %d %s, want a replay", r.status, r.body)
	}
	if n := c.sb.Ledger().ByOrder["F-review"]; n != 1 {
		t.Fatalf("F-review executed %d times, want 1", n)
	}
}

func TestRenewFailedOrderUsesNextGeneration(t *testing.T) {
	onStores(t, testRenewFailedOrderUsesNextGeneration)
}

func testRenewFailedOrderUsesNextGeneration(t *testing.T, shared bool) {
	c := startCards(t, shared)
	first := c.post(t, "F-1", sandbox.AmountFailed)
	if !strings.Contains(first.body, `"failed"`) {
		t.Fatalf("POST F-1 = %d %s, want a failed operation", first.status, first.body)
	}
	key1 := first.header.Get("Idempotency-Key")
	if again := c.post(t, "F-1", sandbox.AmountFailed); again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat before renew = %d %s, want the failed operation replayed", again.status, again.body)
	}

	out, code := c.cli(t, "orders", "renew", "--path", "/cards", "--value", "F-1", "--json")
	var renewed struct {
		Key        string
		Generation int
	}
	if code != 0 || json.Unmarshal([]byte(out), &renewed) != nil || renewed.Generation != 2 || renewed.Key == key1 || renewed.Key == "" {
		t.Fatalf("idemproxy orders renew = %d %s, want generation 2 with a new key", code, out)
	}
	if !strings.Contains(c.adm.waitLine(t, `"msg":"admin: order renewed`), `"from_key":"`+key1+`"`) {
		t.Fatal("the renew's log line does not name the old key")
	}

	// The app fixed the cause and sends the order again: the new key goes out.
	second := c.post(t, "F-1", "20")
	if second.status != http.StatusOK || second.header.Get("Idempotency-Key") != renewed.Key ||
		second.header.Get("Idempotent-Replayed") != "" || strings.Contains(second.body, `"failed"`) {
		t.Fatalf("POST after renew = %d %s key %s, want a fresh operation under %s",
			second.status, second.body, second.header.Get("Idempotency-Key"), renewed.Key)
	}
	l := c.sb.Ledger()
	if l.ByKey[key1] != 1 || l.ByKey[renewed.Key] != 1 {
		t.Fatalf("provider executions by key = %v, want one under each generation's key", l.ByKey)
	}
	o := c.admin(t, "GET", "/admin/v1/orders?method=POST&path=/cards&value=F-1", "")
	if !strings.Contains(o.body, `"generation":2`) || !strings.Contains(o.body, `"key":"`+renewed.Key+`"`) || !strings.Contains(o.body, `"state":"final"`) {
		t.Fatalf("order after renew = %s", o.body)
	}
	// A success is not renewed again.
	if r := c.renew(t, "F-1"); r.status != http.StatusConflict {
		t.Fatalf("renew of the succeeded generation = %d %s, want 409", r.status, r.body)
	}
	out, code = c.cli(t, "orders", "get", "--path", "/cards", "--value", "F-1")
	if code != 0 || !strings.Contains(out, renewed.Key) || !strings.Contains(out, "generation  2") {
		t.Fatalf("idemproxy orders get = %d\n%s", code, out)
	}
}

// TestRenewAtOnceOnTwoReplicas: two operators renew one failed order at
// once, on two replicas of a shared store (on the embedded store, both on
// the one process): exactly one renew is answered 200 and logged, the other
// is refused 409 renew_refused, as a second renew in a row is. The app's
// retries, to both replicas at once, then run the order once under the new
// key, and both replicas show generation 2 with its final record. Before
// ErrSuperseded, two renews that read the record before either wrote were
// both answered 200 and both logged as a renew.
func TestRenewAtOnceOnTwoReplicas(t *testing.T) { onStores(t, testRenewAtOnceOnTwoReplicas) }

func testRenewAtOnceOnTwoReplicas(t *testing.T, shared bool) {
	c := startCards(t, shared)
	renewAt := func(p *opsProc, order string) <-chan sentReply {
		return goSend("POST", "http://"+p.admin+"/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"`+order+`"}`,
			"Authorization", "Bearer "+adminToken)
	}
	const orders = 8
	for i := range orders {
		order := "F-twice-" + strconv.Itoa(i)
		first := c.post(t, order, sandbox.AmountFailed)
		if !strings.Contains(first.body, `"failed"`) {
			t.Fatalf("POST %s = %d %s, want a failed operation", order, first.status, first.body)
		}
		a, b := renewAt(c.p, order), renewAt(c.adm, order)
		var renewed []string
		for _, ch := range []<-chan sentReply{a, b} {
			r := <-ch
			switch {
			case r.err != nil:
				t.Fatal(r.err)
			case r.status == http.StatusOK:
				renewed = append(renewed, r.body)
			case r.status != http.StatusConflict || !strings.Contains(r.body, `"renew_refused"`):
				t.Fatalf("renew of %s = %d %s, want 200 or 409 renew_refused", order, r.status, r.body)
			}
		}
		if len(renewed) != 1 || !strings.Contains(renewed[0], `"generation":2`) {
			t.Fatalf("renews of %s at once answered 200 %d times (%q); want once, generation 2", order, len(renewed), renewed)
		}
		x, y := goSend("POST", c.cardsURL(), cardOrder(order, "20")), goSend("POST", "http://"+c.adm.proxy+"/cards", cardOrder(order, "20"))
		for _, ch := range []<-chan sentReply{x, y} {
			if r := <-ch; r.err != nil || r.status != http.StatusOK || strings.Contains(r.body, `"failed"`) {
				t.Fatalf("retry of %s after the renew = %+v, want the new operation's 200", order, r)
			}
		}
		if n := c.sb.Ledger().ByOrder[order]; n != 2 {
			t.Fatalf("provider executed %s %d times, want twice: the failed one and one under the new key", order, n)
		}
		for _, p := range []*opsProc{c.p, c.adm} {
			o := send(t, "GET", "http://"+p.admin+"/admin/v1/orders?method=POST&path=/cards&value="+order, "", "Authorization", "Bearer "+adminToken)
			if !strings.Contains(o.body, `"generation":2`) || !strings.Contains(o.body, `"state":"final"`) || !strings.Contains(o.body, `"status":200`) {
				t.Fatalf("order %s on %s after the renew = %s, want generation 2, final 200", order, p.admin, o.body)
			}
		}
	}
	logged := strings.Count(c.p.text(), `"msg":"admin: order renewed`)
	if shared {
		logged += strings.Count(c.adm.text(), `"msg":"admin: order renewed`)
	}
	if logged != orders {
		t.Fatalf("%d renews logged for %d orders renewed once each", logged, orders)
	}
}

// TestListRecordsPages: the operator pages through the unknown records with
// limit and cursor: these records are small, so a page holds limit records
// unless it is the last (a page is also cut at store.MaxListBytes), whose
// next_cursor is "", and the pages together hold each unknown record once
// (and no final one).
func TestListRecordsPages(t *testing.T) { onStores(t, testListRecordsPages) }

func testListRecordsPages(t *testing.T, shared bool) {
	c := startCards(t, shared)
	want := map[string]bool{}
	for _, order := range []string{"F-unknown-1", "F-unknown-2", "F-unknown-3"} {
		r := c.post(t, order, "10")
		if r.status != http.StatusBadGateway {
			t.Fatalf("POST %s = %d %s, want 502", order, r.status, r.body)
		}
		want[r.header.Get("Idempotency-Key")] = true
	}
	if r := c.post(t, "F-ok", "10"); r.status != http.StatusOK {
		t.Fatalf("POST F-ok = %d %s", r.status, r.body)
	}
	got := map[string]int{}
	cursor := ""
	for page := 1; ; page++ {
		if page > 5 {
			t.Fatalf("no last page after 5 pages of 2 for 3 records; got %v", got)
		}
		r := c.admin(t, "GET", "/admin/v1/records?state=unknown&limit=2&cursor="+url.QueryEscape(cursor), "")
		var l struct {
			Records []struct {
				Key, State string
			}
			NextCursor *string `json:"next_cursor"`
		}
		if err := json.Unmarshal([]byte(r.body), &l); err != nil || r.status != http.StatusOK || l.NextCursor == nil {
			t.Fatalf("page %d = %d %s, want 200 with records and next_cursor", page, r.status, r.body)
		}
		if len(l.Records) > 2 || len(l.Records) < 2 && *l.NextCursor != "" {
			t.Fatalf("page %d holds %d records with next_cursor %q: want 2, or fewer only on the last page (next_cursor \"\")",
				page, len(l.Records), *l.NextCursor)
		}
		for _, rec := range l.Records {
			if rec.State != "unknown" {
				t.Errorf("page %d lists %s in state %s", page, rec.Key, rec.State)
			}
			got[rec.Key]++
		}
		if *l.NextCursor == "" {
			break
		}
		cursor = *l.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("pages listed %v, want each of %v once", got, want)
	}
	for k, n := range got {
		if !want[k] || n != 1 {
			t.Fatalf("pages listed %v, want each of %v once", got, want)
		}
	}
}

// TestRecordFields: GET /admin/v1/records/{key} gives a final record with
// every field the operator's view lists, the stored body only with ?body=1,
// and 404 not_found for a key never seen.
func TestRecordFields(t *testing.T) { onStores(t, testRecordFields) }

func testRecordFields(t *testing.T, shared bool) {
	c := startCards(t, shared)
	sent := c.post(t, "F-fields", "10")
	if sent.status != http.StatusOK {
		t.Fatalf("POST F-fields = %d %s", sent.status, sent.body)
	}
	key := sent.header.Get("Idempotency-Key")
	r := c.admin(t, "GET", "/admin/v1/records/"+key, "")
	var rec map[string]any
	if err := json.Unmarshal([]byte(r.body), &rec); err != nil || r.status != http.StatusOK {
		t.Fatalf("GET record = %d %s", r.status, r.body)
	}
	want := map[string]any{"key": key, "upstream_key": key, "client": "default", "state": "final", "method": "POST",
		"path": "/cards", "status": float64(200), "attempts": float64(1), "last_error": ""}
	for f, v := range want {
		if rec[f] != v {
			t.Errorf("record %s = %#v, want %#v (record %s)", f, rec[f], v, r.body)
		}
	}
	for _, f := range []string{"created_at", "first_sent_at", "expires_at"} {
		if s, _ := rec[f].(string); s == "" {
			t.Errorf("record %s = %#v, want a time (record %s)", f, rec[f], r.body)
		} else if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			t.Errorf("record %s = %q: %v", f, s, err)
		}
	}
	if _, ok := rec["body"]; ok {
		t.Errorf("record without ?body=1 holds the body: %s", r.body)
	}
	rb := c.admin(t, "GET", "/admin/v1/records/"+key+"?body=1", "")
	var withBody struct{ Body json.RawMessage }
	if err := json.Unmarshal([]byte(rb.body), &withBody); err != nil || rb.status != http.StatusOK {
		t.Fatalf("GET record ?body=1 = %d %s", rb.status, rb.body)
	}
	var stored, answered any
	if json.Unmarshal(withBody.Body, &stored) != nil || json.Unmarshal([]byte(sent.body), &answered) != nil ||
		!reflect.DeepEqual(stored, answered) {
		t.Errorf("record body = %s, want the answer the app got: %s", withBody.Body, sent.body)
	}
	if nf := c.admin(t, "GET", "/admin/v1/records/no-such-key", ""); nf.status != http.StatusNotFound || !strings.Contains(nf.body, `"not_found"`) {
		t.Errorf("GET unknown key = %d %s, want 404 not_found", nf.status, nf.body)
	}
}

// TestRenewOrderKeyedByItsSecondSource: with IDEMPROXY_KEY_SOURCES
// json:order_id,form:order_id, an order the app posts as a form has the form
// source's key. The orders calls find it there: get shows its record (it
// said "nothing sent under this key yet", the JSON source's key, for an order
// the provider had executed), and renew moves it to its next generation (it
// was refused for want of a record), which the app's next form post uses.
func TestRenewOrderKeyedByItsSecondSource(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			io.WriteString(w, `{"id":"op_1","status":"failed"}`)
			return
		}
		io.WriteString(w, `{"id":"op_2","status":"succeeded"}`)
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken,
		"IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id")})
	form := []string{"Content-Type", "application/x-www-form-urlencoded"}
	first := send(t, "POST", "http://"+p.proxy+"/pay", "order_id=FM-1&amount=5", form...)
	key1 := first.header.Get("Idempotency-Key")
	if first.status != http.StatusOK || !strings.Contains(first.body, `"failed"`) || key1 == "" {
		t.Fatalf("form POST = %d %s key %q, want the failed operation", first.status, first.body, key1)
	}
	auth := []string{"Authorization", "Bearer " + adminToken}
	o := send(t, "GET", "http://"+p.admin+"/admin/v1/orders?method=POST&path=/pay&value=FM-1", "", auth...)
	if o.status != http.StatusOK || !strings.Contains(o.body, `"key":"`+key1+`"`) || !strings.Contains(o.body, `"state":"final"`) {
		t.Fatalf("GET order = %d %s, want generation 1 under the form key %s with its final record", o.status, o.body, key1)
	}
	rn := send(t, "POST", "http://"+p.admin+"/admin/v1/orders/renew", `{"method":"POST","path":"/pay","value":"FM-1"}`, auth...)
	var renewed struct {
		Key        string
		Generation int
	}
	if rn.status != http.StatusOK || json.Unmarshal([]byte(rn.body), &renewed) != nil || renewed.Generation != 2 {
		t.Fatalf("renew = %d %s, want 200 generation 2", rn.status, rn.body)
	}
	second := send(t, "POST", "http://"+p.proxy+"/pay", "order_id=FM-1&amount=6", form...)
	if second.status != http.StatusOK || second.header.Get("Idempotency-Key") != renewed.Key || strings.Contains(second.body, `"failed"`) {
		t.Fatalf("form POST after renew = %d %s key %s, want a new operation under the renewed key %s",
			second.status, second.body, second.header.Get("Idempotency-Key"), renewed.Key)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{key1, renewed.Key}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys sent upstream = %v, want %v", keys, want)
	}
}

// TestCLIShowsRenewedAndBodies: the people's output of the records commands
// shows what their --json does: records get of an order's renewed generation
// says it was renewed (it looked like any final record: a person could not
// tell that the order's requests now go under another key), and records list
// --body shows each record's body (the flag was taken and nothing shown).
func TestCLIShowsRenewedAndBodies(t *testing.T) {
	c := startCards(t, false)
	failed := c.post(t, "F-1", sandbox.AmountFailed)
	if !strings.Contains(failed.body, `"failed"`) {
		t.Fatalf("POST F-1 = %d %s, want a failed operation", failed.status, failed.body)
	}
	review := c.post(t, "F-2", sandbox.AmountNeedsReview)
	if !strings.Contains(review.body, `"needs_review"`) {
		t.Fatalf("POST F-2 = %d %s, want needs_review", review.status, review.body)
	}
	if out, code := c.cli(t, "orders", "renew", "--path", "/cards", "--value", "F-1"); code != 0 {
		t.Fatalf("orders renew = %d %s", code, out)
	}
	out, code := c.cli(t, "records", "get", failed.header.Get("Idempotency-Key"))
	if code != 0 || !strings.Contains(out, "renewed") {
		t.Errorf("records get of the renewed generation = %d\n%s\nwant it said renewed", code, out)
	}
	out, code = c.cli(t, "records", "list", "--state", "needs_review", "--body")
	if code != 0 || !strings.Contains(out, review.body) {
		t.Errorf("records list --body = %d\n%s\nwant the body %s", code, out, review.body)
	}
}

// TestOrderPathAsARequestHasIt: orders get and renew read the order's path
// as a request target is read. A path with a query finds the order, since a
// query is no part of a request's key; one no request can have (no leading
// /, white space, a fragment, a dot-segment) is 400 bad_request. Before,
// each was taken as written and answered 200 with the key of an order that
// cannot exist and "record": null, "nothing sent under this key yet", for
// an order the provider had executed.
func TestOrderPathAsARequestHasIt(t *testing.T) {
	c := startCards(t, false)
	if r := c.post(t, "F-path", "10"); r.status != http.StatusOK {
		t.Fatalf("POST F-path = %d %s", r.status, r.body)
	}
	get := func(path string) reply {
		t.Helper()
		return c.admin(t, "GET", "/admin/v1/orders?method=POST&value=F-path&path="+url.QueryEscape(path), "")
	}
	for _, path := range []string{"/cards", "/cards?source=app", "/%63ards"} {
		if r := get(path); r.status != http.StatusOK || !strings.Contains(r.body, `"state":"final"`) {
			t.Errorf("order at %q = %d %s, want its final record", path, r.status, r.body)
		}
	}
	for _, path := range []string{"cards", " /cards", "/cards ", "/./cards", "/x/../cards", "/cards#x", "/%2e/cards"} {
		if r := get(path); r.status != http.StatusBadRequest || !strings.Contains(r.body, `"bad_request"`) {
			t.Errorf("order at %q = %d %s, want 400 bad_request: no request has that path", path, r.status, r.body)
		}
	}
	if out, code := c.cli(t, "orders", "get", "--path", "cards", "--value", "F-path"); code != 1 || !strings.Contains(out, "bad_request") {
		t.Errorf("idemproxy orders get --path cards = %d %s, want exit 1 bad_request", code, out)
	}
	if r := c.admin(t, "POST", "/admin/v1/orders/renew", `{"method":"POST","path":"cards","value":"F-path"}`); r.status != http.StatusBadRequest {
		t.Errorf("renew at path cards = %d %s, want 400", r.status, r.body)
	}
}
