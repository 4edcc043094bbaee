package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestProbeBodyValueOutsideQuotes: a probe body template whose placeholder
// stands where a JSON value goes, not between quotes ({"order_id":{req.order_id}},
// written for numeric order ids), gets each value as the one JSON value it was
// in the app's body: a number as its text, a string quoted. The provider
// answers the payout with 504 (it ran it), so the app's retry sends the probe
// first; the lookup finds the payout when its body names the order as the app
// did. Before, a string value was put bare: order A-1 gave {"order_id":A-1},
// not JSON (the provider's 400 made the proxy re-send the payout), and "[1]" or
// "null" changed the lookup's structure ({"order_id":[1]}).
func TestProbeBodyValueOutsideQuotes(t *testing.T) {
	for _, c := range []struct{ name, orderID string }{
		{"number", `123`},
		{"string", `"A-1"`},
		{"string holding JSON", `"[1]"`},
		{"string holding null", `"null"`},
		{"string holding members", `"1,\"order_id\":2"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			posts := 0
			var probes []string
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				mu.Lock()
				defer mu.Unlock()
				switch r.URL.Path {
				case "/v1/payouts":
					posts++
					if posts == 1 { // ran, answer lost
						w.WriteHeader(http.StatusGatewayTimeout)
						io.WriteString(w, `{"error":"gateway timeout"}`)
						return
					}
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, `{"id":"po_2","state":"done"}`)
				case "/v1/payout/info":
					probes = append(probes, string(body))
					var got struct {
						OrderID json.RawMessage `json:"order_id"`
					}
					if json.Unmarshal(body, &got) != nil || string(got.OrderID) != c.orderID {
						w.WriteHeader(http.StatusBadRequest)
						io.WriteString(w, `{"error":"bad lookup"}`)
						return
					}
					io.WriteString(w, `{"id":"po_1","state":"done"}`)
				default:
					w.WriteHeader(http.StatusNotFound)
				}
			}))
			defer up.Close()
			p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(),
				`IDEMPROXY_STATUS_PROBE=POST /v1/payout/info {"order_id":{req.order_id}}`)})
			order := `{"order_id":` + c.orderID + `,"amount":"5.00"}`
			if first := send(t, "POST", "http://"+p.proxy+"/v1/payouts", order); first.status != http.StatusGatewayTimeout &&
				first.status != http.StatusBadGateway {
				t.Fatalf("first POST = %d %s, want 502/504", first.status, first.body)
			}
			second := send(t, "POST", "http://"+p.proxy+"/v1/payouts", order)
			mu.Lock()
			defer mu.Unlock()
			if len(probes) != 1 || !json.Valid([]byte(probes[0])) {
				t.Fatalf("probes sent %q, want one JSON body", probes)
			}
			if second.status != http.StatusOK || second.header.Get("Idemproxy-Reconciled") != "true" ||
				!strings.Contains(second.body, `"po_1"`) || posts != 1 {
				t.Fatalf("retry = %d %s (reconciled %q), payouts sent %d, probe %s; want the lookup's 200, reconciled, the payout sent once",
					second.status, second.body, second.header.Get("Idemproxy-Reconciled"), posts, probes[0])
			}
		})
	}
}
