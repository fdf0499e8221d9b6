package framework

import (
	"strings"
	"unicode/utf8"
)

// MaxExcerpt is how many bytes of a client-sent value an error message
// repeats ([Excerpt]).
const MaxExcerpt = 200

// Excerpt returns the form in which an error message repeats a value the
// client sent (an unknown type, a consumer name, an instance or run id): s
// cut at a character boundary to at most [MaxExcerpt] bytes and marked
// with "..." when it was longer, with invalid UTF-8 replaced by "?". A
// client's megabyte of name is not echoed back whole.
func Excerpt(s string) string {
	if len(s) > MaxExcerpt {
		cut := MaxExcerpt
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
