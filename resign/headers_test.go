package resign_test

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/resign"
)

func TestParseStaticHeaders(t *testing.T) {
	tests := []struct {
		in   string
		want http.Header
	}{
		{"", http.Header{}},
		{"   ", http.Header{}},
		{"X-Public-Id=abc", http.Header{"X-Public-Id": {"abc"}}},
		{" x-public-id = abc , X-Api-Version=2 ", http.Header{"X-Public-Id": {"abc"}, "X-Api-Version": {"2"}}},
		{"X-Token=a=b==", http.Header{"X-Token": {"a=b=="}}},
		{"X-Quoted=\"v 1\"\tx", http.Header{"X-Quoted": {"\"v 1\"\tx"}}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := resign.ParseStaticHeaders(tc.in)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestParseStaticHeadersErrors(t *testing.T) {
	const secret = "s3cr3t"
	tests := []struct {
		in   string
		want string // must appear in the error
	}{
		{"X-Public-Id=abc,", "entry 2: empty entry"},
		{",X-Public-Id=abc", "entry 1: empty entry"},
		{"X-Public-Id=abc,,X-B=1", "entry 2: empty entry"},
		{"X-Public-Id", `entry 1: missing "="`},
		{"X-A=1," + secret, `entry 2: missing "="`},
		{"=" + secret, "entry 1: empty header name"},
		{"Authorization: Bearer " + secret + "=", `entry 1: invalid header name: character ':' at offset 13`},
		{"X-Public-Id=", "entry 1 (X-Public-Id): empty value"},
		{"X-A=1,X-Key=" + secret + "\x00", "entry 2 (X-Key): value contains control characters"},
		{"X-A=1,x-a=" + secret, "entry 2 (X-A): header given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			_, err := resign.ParseStaticHeaders(tc.in)
			if !errors.Is(err, resign.ErrStaticHeaders) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrStaticHeaders containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error echoes a value: %v", err)
			}
		})
	}
}
