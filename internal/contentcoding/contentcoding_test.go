package contentcoding

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"net/http"
	"slices"
	"testing"
)

func TestList(t *testing.T) {
	for _, c := range []struct {
		lines []string
		want  []string
		ok    bool
	}{
		{nil, nil, true},
		{[]string{"identity"}, nil, true},
		{[]string{"GZIP, deflate"}, []string{"gzip", "deflate"}, true},
		{[]string{"x-gzip", " identity ,deflate"}, []string{"x-gzip", "deflate"}, true},
		{[]string{"gzip, br"}, nil, false},
		{[]string{"gzip,gzip,gzip,gzip,gzip"}, nil, false},
	} {
		got, ok := List(http.Header{"Content-Encoding": c.lines})
		if ok != c.ok || ok && !slices.Equal(got, c.want) {
			t.Errorf("List(%q) = %q, %v; want %q, %v", c.lines, got, ok, c.want, c.ok)
		}
	}
}

// TestUndo: gzip, deflate in the zlib format and as a raw stream (sent
// under that name by some peers), a body that does not decode, and the limit.
func TestUndo(t *testing.T) {
	plain := []byte(`{"order_id":"o-1","amount":"10.00"}`)
	var gz, zl, raw bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(plain)
	gw.Close()
	zw := zlib.NewWriter(&zl)
	zw.Write(plain)
	zw.Close()
	fw, _ := flate.NewWriter(&raw, flate.DefaultCompression)
	fw.Write(plain)
	fw.Close()
	for _, c := range []struct {
		coding string
		b      []byte
	}{{"gzip", gz.Bytes()}, {"x-gzip", gz.Bytes()}, {"deflate", zl.Bytes()}, {"deflate", raw.Bytes()}} {
		got, err := Undo(c.coding, c.b, 1<<20, nil)
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("Undo(%s) = %q, %v; want the plain body", c.coding, got, err)
		}
	}
	if _, err := Undo("gzip", plain, 1<<20, nil); err == nil {
		t.Error("Undo(gzip) of bytes that are not gzip: no error")
	}
	if _, err := Undo("gzip", gz.Bytes(), 8, nil); err == nil {
		t.Error("Undo past the limit: no error")
	}
}
