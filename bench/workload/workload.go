// Package workload holds the requests the benchmarks send: raw HTTP/1.1
// bytes, built without allocation, that look like a legacy app's payment
// calls.
package workload

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idemproxy/idemproxy/bench/loadgen"
)

// Bodies are a JSON object whose order_id is idemproxy's default key source
// (IDEMPROXY_KEY_SOURCES=json:order_id), so protected requests carry no
// Idempotency-Key header and idemproxy derives one, as in production.
const (
	// Get is the unprotected request.
	Get = "GET /v1/payments/pay_2c4f9a1e7b3d4e8f HTTP/1.1\r\n" +
		"Host: 127.0.0.1\r\nUser-Agent: idembench\r\nAccept: application/json\r\n\r\n"
	postHead = "POST /v1/payments HTTP/1.1\r\n" +
		"Host: 127.0.0.1\r\nUser-Agent: idembench\r\nAccept: application/json\r\n" +
		"Content-Type: application/json\r\nContent-Length: "
	bodyHead = `{"order_id":"`
	bodyTail = `","amount":1000,"currency":"RUB","description":"idembench payment","customer":{"id":"cus_0001","email":"buyer@example.com"}}`
)

// AppendPost appends the payment POST whose order_id is prefix followed by
// id to dst.
func AppendPost(dst []byte, prefix string, id uint64) []byte {
	var num [20]byte
	digits := strconv.AppendUint(num[:0], id, 10)
	n := len(bodyHead) + len(prefix) + len(digits) + len(bodyTail)
	dst = append(dst, postHead...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	dst = append(dst, "\r\n\r\n"...)
	dst = append(dst, bodyHead...)
	dst = append(dst, prefix...)
	dst = append(dst, digits...)
	return append(dst, bodyTail...)
}

// CheckKeys is how many stored operations CheckReplays re-sends.
const CheckKeys = 1000

// CheckReplays re-sends CheckKeys of the records operations stored at addr
// with AppendPost's prefix and sequence numbers 0 to records-1, spread over
// them, and returns how many came back as replays. A request that failed is
// an error.
func CheckReplays(ctx context.Context, addr, prefix string, records int) (int64, error) {
	stride := uint64(max(records/CheckKeys, 1))
	res, err := loadgen.Run(ctx, loadgen.Config{
		Addr: addr, Conns: 8, Total: CheckKeys,
		Build: func(dst []byte, seq uint64) []byte { return AppendPost(dst, prefix, seq*stride) },
	})
	if err != nil {
		return 0, err
	}
	if res.Failed() != 0 {
		return res.Replayed, fmt.Errorf("replay check: %d failed: %v %v", res.Failed(), res.Statuses, res.Errors)
	}
	return res.Replayed, nil
}
