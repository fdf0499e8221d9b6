package eventstore

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// ScanBytes implements pgx's BytesScanner for the metadata jsonb column:
// every event a reader or the dispatcher loads decodes its metadata, and
// encoding/json's reflection cost dominated a catch-up pass. Postgres prints
// jsonb as a flat object here, so the common shape (known keys, string
// values without escapes) is decoded directly; anything else falls back to
// encoding/json with the same result. NULL is an error, as for any struct.
func (m *Metadata) ScanBytes(src []byte) error {
	if src == nil {
		return errors.New("cannot scan NULL into *eventstore.Metadata")
	}
	*m = Metadata{}
	if decodeMetadataFast(src, m) {
		return nil
	}
	*m = Metadata{}
	return json.Unmarshal(src, m)
}

// decodeMetadataFast decodes {"key": "value", ...} where every key is one
// of Metadata's JSON names, spelled exactly, and every value a string
// without escapes, control characters or invalid UTF-8. It reports false
// (leaving m in any state) for every other input, valid or not.
func decodeMetadataFast(b []byte, m *Metadata) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		key, next, ok := plainString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		val, next, ok := plainString(b, skipSpace(b, i+1))
		if !ok {
			return false
		}
		switch string(key) {
		case "userId":
			m.UserID = string(val)
		case "requestId":
			m.RequestID = string(val)
		case "correlationId":
			m.CorrelationID = string(val)
		case "causationId":
			m.CausationID = string(val)
		case "idempotencyKey":
			m.IdempotencyKey = string(val)
		case "idempotencyOwner":
			m.IdempotencyOwner = string(val)
		case "idempotencyReclaimedFrom":
			m.IdempotencyReclaimedFrom = string(val)
		default:
			return false // encoding/json matches other spellings case-insensitively
		}
		i = skipSpace(b, next)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// plainString reads a JSON string at b[i] that needs no unescaping and
// returns its contents and the index after the closing quote.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	start := i + 1
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s = b[start:j]
			return s, j + 1, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipSpace returns the index of the first non-whitespace byte at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
