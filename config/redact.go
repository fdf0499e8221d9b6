package config

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// keywordPassword matches a password or sslpassword setting of a
// keyword/value connection string as libpq reads it: whitespace allowed
// around '=', the value (group 1) single-quoted or running to the next
// whitespace, with backslash escapes in both.
var keywordPassword = regexp.MustCompile(`(?is)(?:^|\s)(?:ssl)?password\s*=\s*('(?:\\.|[^'\\])*'?|(?:\\.|\\$|[^\s\\])*)`)

// urlScheme matches the start of a URL; anything else is a keyword/value
// connection string.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// keywordEscape matches one backslash escape of a keyword/value setting.
var keywordEscape = regexp.MustCompile(`(?s)\\(.?)`)

// minFragment is the shortest piece of a password masked wherever it
// occurs in a message: shorter ones would mask ordinary words.
const minFragment = 4

// redactErr returns an error with err's message, in which every copy of
// connString has its password masked. The parsers of go-redis (through
// net/url) and, best effort, pgx quote their input in errors, and these
// errors end up in boot logs. Parsers also quote a URL cut short by an
// unencoded '/', '?' or '#' in its password, and the password's start as
// a "port"; pgx masks only "password=value" of the keyword/value form,
// not the spaces around '=' and the quoted values libpq also accepts. So
// beyond the copies of connString, every piece of a password (at least
// minFragment bytes) is masked wherever it occurs.
func redactErr(err error, connString string) error {
	msg := err.Error()
	var secrets []string
	if urlScheme.MatchString(connString) {
		redacted, pws := redactURL(connString)
		msg = strings.ReplaceAll(msg, strconv.Quote(connString), strconv.Quote(redacted))
		msg = strings.ReplaceAll(msg, connString, redacted)
		for _, pw := range pws {
			secrets = append(secrets, pw)
			if u, uerr := url.PathUnescape(pw); uerr == nil {
				secrets = append(secrets, u)
			}
		}
	} else {
		msg, secrets = redactKeywordPasswords(msg, err, connString)
	}
	return errors.New(maskFragments(msg, secrets))
}

// redactURL returns the URL s with the password of its userinfo masked,
// and the password as written (or the candidates, when net/url and libpq
// read it differently). Besides net/url's reading, s is split as libpq and
// pgx split it: the userinfo ends at the last '@', so a password holding
// an unencoded '/', '?', '#' or '@' is still found whole (net/url reads
// "u:/pw@h" as host "u:" and path "/pw@h", "u:p#w@h" as host "u:p").
func redactURL(s string) (redacted string, passwords []string) {
	redacted = s
	start := strings.Index(s, "://") + len("://")
	end := strings.LastIndex(s, "@")
	if colon := strings.IndexByte(s[start:max(end, start)], ':'); end > start && colon >= 0 {
		colon += start
		redacted = s[:colon+1] + "xxxxx" + s[end:]
		passwords = append(passwords, s[colon+1:end])
	}
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			redacted = u.Redacted()
			passwords = append(passwords, pw)
		}
	}
	return redacted, passwords
}

// redactKeywordPasswords masks the passwords of the keyword/value
// connString in msg, err's message: the connection string pgx quotes is
// replaced by one with every password value masked. It returns the
// message and the password values (as written, and unquoted).
func redactKeywordPasswords(msg string, err error, connString string) (string, []string) {
	matches := keywordPassword.FindAllStringSubmatchIndex(connString, -1)
	if len(matches) == 0 {
		return msg, nil
	}
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) && pce.ConnString == connString {
		// The prefix pgx writes, with its own (partial) masking.
		prefix := pgconn.NewParseConfigError(connString, "", nil).Error()
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			var b strings.Builder
			last := 0
			for _, m := range matches {
				b.WriteString(connString[last:m[2]])
				b.WriteString("xxxxx")
				last = m[3]
			}
			b.WriteString(connString[last:])
			msg = "cannot parse `" + b.String() + "`: " + rest
		}
	}
	var secrets []string
	for _, m := range matches {
		raw := connString[m[2]:m[3]]
		value := strings.TrimSuffix(strings.TrimPrefix(raw, "'"), "'")
		secrets = append(secrets, raw, keywordEscape.ReplaceAllString(value, "$1"))
	}
	return msg, secrets
}

// maskFragments replaces every run of at least minFragment bytes of msg
// that occurs in one of secrets with "xxxxx".
func maskFragments(msg string, secrets []string) string {
	if len(secrets) == 0 {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		n := 0
		for _, s := range secrets {
			n = max(n, longestPrefixIn(msg[i:], s))
		}
		if n >= minFragment {
			b.WriteString("xxxxx")
			i += n
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	return b.String()
}

// longestPrefixIn returns the length of the longest prefix of m that
// occurs in s.
func longestPrefixIn(m, s string) int {
	n := 0
	for n < len(m) && n < len(s) && strings.Contains(s, m[:n+1]) {
		n++
	}
	return n
}
