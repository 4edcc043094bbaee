package idemkey

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"mime"
	"mime/multipart"
	"net/textproto"
	"slices"
	"strings"
)

// mimeFormData is the media type of an HTML form sent with its files.
const mimeFormData = "multipart/form-data"

// formDataBoundary returns the boundary of a multipart/form-data
// Content-Type; ok is false for any other type or without a boundary.
func formDataBoundary(contentType string) (boundary string, ok bool) {
	if !strings.EqualFold(mediaType(contentType), mimeFormData) {
		return "", false
	}
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil || params["boundary"] == "" {
		return "", false
	}
	return params["boundary"], true
}

// formPart is one part of a multipart/form-data body as it came: its header
// and its bytes (not decoded, whatever its Content-Transfer-Encoding says).
type formPart struct {
	header textproto.MIMEHeader
	data   []byte
}

// formParts splits a multipart/form-data body into its parts, in order;
// ok is false when it does not parse (a missing closing boundary
// included).
func formParts(body []byte, boundary string) (parts []formPart, ok bool) {
	r := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := r.NextRawPart()
		if errors.Is(err, io.EOF) {
			return parts, true
		}
		if err != nil {
			return nil, false
		}
		data, err := io.ReadAll(p)
		if err != nil {
			return nil, false
		}
		parts = append(parts, formPart{header: p.Header, data: data})
	}
}

// appendFormData appends the canonical form of a multipart/form-data body
// to b: each part, in order, with its header fields sorted by name. The
// boundary, which clients draw at random for every request (curl, and PHP's
// curl with an array of fields), and the preamble and epilogue, which carry
// nothing, are left out, so that a retry of the same form is the same
// request. ok is false when the body does not parse.
func appendFormData(b, body []byte, boundary string) ([]byte, bool) {
	parts, ok := formParts(body, boundary)
	if !ok {
		return b, false
	}
	b = binary.AppendUvarint(b, uint64(len(parts)))
	for _, p := range parts {
		names := slices.Sorted(maps.Keys(p.header))
		b = binary.AppendUvarint(b, uint64(len(names)))
		for _, name := range names {
			b = appendField(b, name)
			b = binary.AppendUvarint(b, uint64(len(p.header[name])))
			for _, v := range p.header[name] {
				b = appendField(b, v)
			}
		}
		b = appendField(b, p.data)
	}
	return b, true
}

// formDataValue returns the value of the field called name in a
// multipart/form-data body, with formValue's rules: a part with that name
// and no filename, its bytes as they came; a field given twice with
// different values, also in another spelling (formNameIs), or present only
// in another spelling, counts as absent, and so does an empty value. A part
// with a Content-Transfer-Encoding other than 7bit, 8bit or binary gives no
// value: parsers differ on whether they decode it.
func formDataValue(buf, body []byte, boundary, name string) ([]byte, bool) {
	parts, ok := formParts(body, boundary)
	if !ok {
		return buf[:0], false
	}
	found, exact := false, false
	for _, p := range parts {
		disp, params, err := mime.ParseMediaType(p.header.Get("Content-Disposition"))
		if err != nil || !strings.EqualFold(disp, "form-data") || !formNameIs([]byte(params["name"]), name) {
			continue
		}
		if _, file := params["filename"]; file {
			continue
		}
		switch strings.ToLower(p.header.Get("Content-Transfer-Encoding")) {
		case "", "7bit", "8bit", "binary":
		default:
			return buf[:0], false
		}
		if found && !bytes.Equal(buf, p.data) {
			return buf[:0], false
		}
		buf, found = append(buf[:0], p.data...), true
		exact = exact || params["name"] == name
	}
	if !found || !exact {
		return buf[:0], false
	}
	return buf, len(buf) > 0
}

// formDataMentions reports whether a multipart/form-data body has a part
// called name, in any spelling (formNameIs), without a filename and not empty,
// whatever its Content-Transfer-Encoding (Unreadable).
func formDataMentions(body []byte, boundary, name string) bool {
	parts, _ := formParts(body, boundary)
	for _, p := range parts {
		disp, params, err := mime.ParseMediaType(p.header.Get("Content-Disposition"))
		if err != nil || !strings.EqualFold(disp, "form-data") || !formNameIs([]byte(params["name"]), name) {
			continue
		}
		if _, file := params["filename"]; !file && len(p.data) > 0 {
			return true
		}
	}
	return false
}
