package trainerproto

import (
	"bytes"
	"encoding/json"
	"sync"
)

// maxFlatFields bounds the keys scanFlat takes; a step line has about ten.
const maxFlatFields = 24

// flatObject is a JSON object whose values are all scalars (strings,
// numbers, true, false, null), as scanFlat found it: keys and raw values
// point into the line. It replaces map[string]json.RawMessage on the hot
// path, with no allocation.
type flatObject struct {
	n      int
	keys   [maxFlatFields][]byte
	values [maxFlatFields][]byte
}

// flatPool recycles flatObjects (about 1 KiB each); Parse does not retain
// them, and scanFlat resets one before use.
var flatPool = sync.Pool{New: func() any { return new(flatObject) }}

func (f *flatObject) get(key string) (json.RawMessage, bool) {
	for i := 0; i < f.n; i++ {
		if string(f.keys[i]) == key {
			return f.values[i], true
		}
	}
	return nil, false
}

// scanFlat scans b, a whole line (already checked to be valid UTF-8 and
// trimmed), into f. It returns false, leaving the line to encoding/json,
// for anything beyond a flat object of scalars with plain keys: nested
// values, escapes in keys, duplicate keys (encoding/json keeps the last),
// more than maxFlatFields keys, and every syntax error. When it returns
// true, the keys and values are exactly what encoding/json would give.
func scanFlat(b []byte, f *flatObject) bool {
	f.n = 0
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		// Key: a string without escapes.
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end, escaped, ok := scanString(b, i)
		if !ok || escaped {
			return false
		}
		key := b[i+1 : end-1]
		if _, dup := f.get(string(key)); dup || f.n == maxFlatFields {
			return false
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return false
		}
		start := i
		switch c := b[i]; {
		case c == '"':
			if end, _, ok = scanString(b, i); !ok {
				return false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if end, ok = scanNumber(b, i); !ok {
				return false
			}
		case bytes.HasPrefix(b[i:], []byte("true")):
			end = i + 4
		case bytes.HasPrefix(b[i:], []byte("false")):
			end = i + 5
		case bytes.HasPrefix(b[i:], []byte("null")):
			end = i + 4
		default: // objects, arrays, garbage
			return false
		}
		f.keys[f.n], f.values[f.n] = key, b[start:end]
		f.n++
		i = skipWS(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString scans the JSON string starting at b[i] == '"' and returns the
// index after its closing quote and whether it holds escapes. Control
// characters and malformed escapes make it fail.
func scanString(b []byte, i int) (end int, escaped, ok bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, escaped, true
		case c < 0x20:
			return 0, false, false
		case c == '\\':
			escaped = true
			j++
			if j >= len(b) {
				return 0, false, false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return 0, false, false
				}
				for _, h := range b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return 0, false, false
					}
				}
				j += 4
			default:
				return 0, false, false
			}
		}
	}
	return 0, false, false
}

// scanNumber scans a JSON number (RFC 8259 grammar) starting at b[i].
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(j int) int {
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

// jsonString decodes a raw JSON string value; plain ones (no escapes, the
// usual case) without encoding/json.
func jsonString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if kindOf(raw) != '"' {
		return "", false
	}
	if len(raw) >= 2 && raw[len(raw)-1] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		// raw is a valid JSON string (it came from a parsed document), so
		// without escapes its content is the bytes between the quotes.
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}
