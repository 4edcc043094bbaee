package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// decodeBody decodes the body of a POST call (at most limit bytes) into in,
// a struct: it must be one JSON object with no member named twice and only
// members in knows (json.Decoder.DisallowUnknownFields), and nothing after
// it but white space. Every POST call changes a record or an order, so a
// body that is not exactly one such object is refused rather than read in
// part: encoding/json alone would act on the first of two objects sent in
// one body ({"key":"a",…}{"key":"b",…}: only a settled, yet 200), and on
// the last of two members that it matches alike, whatever their case
// ("key" and "KEY"). When it returns an error, w has not been written.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, in any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return err
	}
	if err := oneObject(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(in)
}

// writeBodyError answers a POST call whose body decodeBody refused (err): 413
// body_too_large, naming the limit, for one over it (the proxy's code for
// the same refusal; it was 400 bad_request, which says the body is wrong,
// not too long), else 400 bad_request naming shape, the body's fields.
func writeBodyError(w http.ResponseWriter, shape string, err error) {
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		writeError(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge,
			"body over this call's limit of "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes")
		return
	}
	writeError(w, http.StatusBadRequest, codeBadRequest, "body must be JSON "+shape+": "+err.Error())
}

// oneObject checks that b is one JSON object, alone, whose members are
// each named once, case aside (encoding/json matches a member to a field
// whatever its case).
func oneObject(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err == io.EOF {
		return errors.New("empty body")
	}
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string) // a member's name: Token checked the syntax
		for _, n := range names {
			if strings.EqualFold(n, name) {
				return fmt.Errorf("member %q given twice", name)
			}
		}
		names = append(names, name)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err == io.EOF { // the closing brace
		return io.ErrUnexpectedEOF
	} else if err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("something follows the JSON object")
	}
	return nil
}
