package main

import "strconv"

// The requests every target receives. Bodies look like a legacy app's
// payment call: a JSON object whose order_id is idemproxy's default key
// source (IDEMPROXY_KEY_SOURCES=json:order_id), so protected requests carry no
// Idempotency-Key header and idemproxy derives one, as in production.
const (
	getRequest = "GET /v1/payments/pay_2c4f9a1e7b3d4e8f HTTP/1.1\r\n" +
		"Host: 127.0.0.1\r\nUser-Agent: idembench\r\nAccept: application/json\r\n\r\n"
	postHead = "POST /v1/payments HTTP/1.1\r\n" +
		"Host: 127.0.0.1\r\nUser-Agent: idembench\r\nAccept: application/json\r\n" +
		"Content-Type: application/json\r\nContent-Length: "
	bodyHead = `{"order_id":"`
	bodyTail = `","amount":1000,"currency":"RUB","description":"idembench payment","customer":{"id":"cus_0001","email":"buyer@example.com"}}`
)

// buildGet is the unprotected request (D, and A/B/C's GET rows).
func buildGet(dst []byte, _ uint64) []byte { return append(dst, getRequest...) }

// buildNewPost returns requests whose order_id is prefix+seq: a new
// operation every request (E, and A/B/C's POST rows), unique across the run
// because sequence numbers never repeat within it and prefix names the run.
func buildNewPost(prefix string) func([]byte, uint64) []byte {
	return func(dst []byte, seq uint64) []byte { return appendPost(dst, prefix, seq) }
}

// buildReplayPost returns requests for the operations prefix+0 ..
// prefix+(n-1), cycling: once those are stored, every request is a replay (F).
func buildReplayPost(prefix string, n uint64) func([]byte, uint64) []byte {
	return func(dst []byte, seq uint64) []byte { return appendPost(dst, prefix, seq%n) }
}

func appendPost(dst []byte, prefix string, id uint64) []byte {
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
