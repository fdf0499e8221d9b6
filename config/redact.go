package config

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// userinfoPassword matches the password of "scheme://user:password@" in a
// string that net/url cannot parse.
var userinfoPassword = regexp.MustCompile(`(://[^:/?#@]*:)[^@/?#]*@`)

// keywordPassword matches a password or sslpassword setting of a
// keyword/value connection string as libpq reads it: whitespace allowed
// around '=', the value (group 1) single-quoted or running to the next
// whitespace, with backslash escapes in both.
var keywordPassword = regexp.MustCompile(`(?is)(?:^|\s)(?:ssl)?password\s*=\s*('(?:\\.|[^'\\])*'?|(?:\\.|\\$|[^\s\\])*)`)

// keywordEscape matches one backslash escape of a keyword/value setting.
var keywordEscape = regexp.MustCompile(`(?s)\\(.?)`)

// redactErr returns an error with err's message, in which every copy of
// connString has its password masked. The parsers of go-redis (through
// net/url) and, best effort, pgx quote their input in errors, and these
// errors end up in boot logs. pgx masks only "password=value" of the
// keyword/value form, so the keyword/value passwords libpq also accepts
// ("password = value", quoted values) are masked here.
func redactErr(err error, connString string) error {
	redacted := userinfoPassword.ReplaceAllString(connString, "${1}xxxxx@")
	if u, perr := url.Parse(connString); perr == nil && u.User != nil {
		redacted = u.Redacted()
	}
	msg := err.Error()
	msg = strings.ReplaceAll(msg, strconv.Quote(connString), strconv.Quote(redacted))
	msg = strings.ReplaceAll(msg, connString, redacted)
	if !strings.Contains(connString, "://") {
		msg = redactKeywordPasswords(msg, err, connString)
	}
	return errors.New(msg)
}

// minMaskedLen is the shortest password value masked wherever it occurs
// in a message: shorter ones would mask ordinary words.
const minMaskedLen = 4

// redactKeywordPasswords masks the passwords of the keyword/value
// connString in msg, err's message: the connection string pgx quotes is
// replaced by one with every password value masked, and any other copy of
// a value (as written, and unquoted) is masked too.
func redactKeywordPasswords(msg string, err error, connString string) string {
	matches := keywordPassword.FindAllStringSubmatchIndex(connString, -1)
	if len(matches) == 0 {
		return msg
	}
	head, rest := "", msg
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) && pce.ConnString == connString {
		// The prefix pgx writes, with its own (partial) masking.
		prefix := pgconn.NewParseConfigError(connString, "", nil).Error()
		if r, ok := strings.CutPrefix(msg, prefix); ok {
			var b strings.Builder
			last := 0
			for _, m := range matches {
				b.WriteString(connString[last:m[2]])
				b.WriteString("xxxxx")
				last = m[3]
			}
			b.WriteString(connString[last:])
			head, rest = "cannot parse `"+b.String()+"`: ", r
		}
	}
	for _, m := range matches {
		raw := connString[m[2]:m[3]]
		value := strings.TrimSuffix(strings.TrimPrefix(raw, "'"), "'")
		value = keywordEscape.ReplaceAllString(value, "$1")
		for _, s := range []string{raw, value} {
			if len(s) >= minMaskedLen {
				rest = strings.ReplaceAll(rest, s, "xxxxx")
			}
		}
	}
	return head + rest
}
