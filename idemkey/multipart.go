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

// phpBoundary returns the boundary PHP's multipart parser takes from a
// Content-Type (main/rfc1867.c, rfc1867_post_handler): for a media type
// that is multipart/form-data up to the first ';', ',' or space, the text
// after the '=' that follows the first "boundary" (as written, else in any
// letter case), up to its closing quote if it starts with one, else up to
// ';' or ','. Go's mime package reads a Content-Type with a parameter it
// cannot parse ("boundary=x; v2") or a comma before the parameters as none,
// and "xboundary=y; boundary=x" as boundary x, where PHP reads y.
func phpBoundary(contentType string) (string, bool) {
	mt := contentType
	if i := strings.IndexAny(mt, ";, "); i >= 0 {
		mt = mt[:i]
	}
	if !strings.EqualFold(mt, mimeFormData) {
		return "", false
	}
	i := strings.Index(contentType, "boundary")
	if i < 0 {
		i = strings.Index(strings.ToLower(contentType), "boundary")
	}
	if i < 0 {
		return "", false
	}
	eq := strings.IndexByte(contentType[i:], '=')
	if eq < 0 {
		return "", false
	}
	b := contentType[i+eq+1:]
	if strings.HasPrefix(b, `"`) {
		end := strings.IndexByte(b[1:], '"')
		if end < 0 {
			return "", false
		}
		b = b[1 : 1+end]
	} else if end := strings.IndexAny(b, ";,"); end >= 0 {
		b = b[:end]
	}
	return b, b != ""
}

// formPart is one part of a multipart/form-data body as it came: its header
// and its bytes (not decoded, whatever its Content-Transfer-Encoding says).
type formPart struct {
	header textproto.MIMEHeader
	data   []byte
}

// formParts splits a multipart/form-data body into its parts, in order;
// ok is false when it does not parse (a missing closing boundary
// included), and parts are then those read before the error, the last one
// with the bytes read of it (PHP registers the fields of a body cut short).
func formParts(body []byte, boundary string) (parts []formPart, ok bool) {
	r := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := r.NextRawPart()
		if errors.Is(err, io.EOF) {
			return parts, true
		}
		if err != nil {
			return parts, false
		}
		data, err := io.ReadAll(p)
		parts = append(parts, formPart{header: p.Header, data: data})
		if err != nil {
			return parts, false
		}
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
// value: parsers differ on whether they decode it. A part that PHP reads as
// the field and Go's mime package does not, or the other way round
// (partField), is such another spelling.
func formDataValue(buf, body []byte, boundary, name string) ([]byte, bool) {
	parts, ok := formParts(body, boundary)
	if !ok {
		return buf[:0], false
	}
	found, exact := false, false
	for _, p := range parts {
		field, asNamed := partField(p.header.Get("Content-Disposition"), name)
		if !field {
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
		exact = exact || asNamed
	}
	if !found || !exact {
		return buf[:0], false
	}
	return buf, len(buf) > 0
}

// formDataMentions reports whether a multipart/form-data body has a part
// called name, in any spelling (formNameIs) and to Go or to PHP
// (partField), without a filename and not empty, whatever its
// Content-Transfer-Encoding (Unreadable).
func formDataMentions(body []byte, boundary, name string) bool {
	parts, _ := formParts(body, boundary)
	for _, p := range parts {
		if field, _ := partField(p.header.Get("Content-Disposition"), name); field && len(p.data) > 0 {
			return true
		}
	}
	return false
}

// partField reports whether a part with Content-Disposition cd is the
// field name, in some spelling (formNameIs), to Go's mime package (a
// form-data disposition whose parameters parse, its name, no filename or
// filename*) or to PHP (phpDisposition); asNamed, whether it is that field
// to both, named as written.
func partField(cd, name string) (field, asNamed bool) {
	var goName string
	disp, params, err := mime.ParseMediaType(cd)
	_, file := params["filename"]
	goField := err == nil && strings.EqualFold(disp, "form-data") && !file
	if goField {
		goName = params["name"]
		goField = formNameIs([]byte(goName), name)
	}
	phpName, phpNamed, phpFile := phpDisposition(cd)
	phpField := phpNamed && !phpFile && formNameIs([]byte(phpName), name)
	return goField || phpField, goField && phpField && goName == name && phpName == name
}

// phpDisposition reads a part's Content-Disposition as PHP's multipart
// parser does (main/rfc1867.c): parameters separated by ';' outside quotes,
// the disposition type not looked at, a parameter without '=' skipped, a
// value in double or single quotes (a backslash escapes the quote or a
// backslash) or up to white space, the last name and the last filename
// winning, and no filename*. A part with a filename is a file.
func phpDisposition(cd string) (name string, named, file bool) {
	s := strings.TrimLeft(cd, phpSpace)
	for s != "" {
		var pair string
		pair, s = phpWord(s, ';')
		s = strings.TrimLeft(s, phpSpace)
		if !strings.Contains(pair, "=") {
			continue
		}
		key, val := phpWord(pair, '=')
		switch {
		case strings.EqualFold(key, "name"):
			name, named = phpConfWord(val), true
		case strings.EqualFold(key, "filename"):
			file = true
		}
	}
	return name, named, file
}

// phpSpace is C's isspace.
const phpSpace = " \t\n\v\f\r"

// phpWord is PHP's php_ap_getword: s up to the first stop outside quotes,
// and what follows the run of stops there.
func phpWord(s string, stop byte) (word, rest string) {
	i := 0
	for i < len(s) && s[i] != stop {
		if q := s[i]; q == '"' || q == '\'' {
			i++
			for i < len(s) && s[i] != q {
				if s[i] == '\\' && i+1 < len(s) && s[i+1] == q {
					i += 2
				} else {
					i++
				}
			}
			if i < len(s) {
				i++
			}
			continue
		}
		i++
	}
	word, rest = s[:i], s[i:]
	for rest != "" && rest[0] == stop {
		rest = rest[1:]
	}
	return word, rest
}

// phpConfWord is PHP's php_ap_getword_conf: s without leading white space,
// up to its closing quote if it starts with one (a backslash escaping the
// quote or a backslash), else up to white space.
func phpConfWord(s string) string {
	s = strings.TrimLeft(s, phpSpace)
	var quote byte
	if s != "" && (s[0] == '"' || s[0] == '\'') {
		quote, s = s[0], s[1:]
	} else if i := strings.IndexAny(s, phpSpace); i >= 0 {
		s = s[:i]
	}
	var b strings.Builder
	for i := 0; i < len(s) && (quote == 0 || s[i] != quote); i++ {
		if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '\\' || quote != 0 && s[i+1] == quote) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
