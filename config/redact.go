package config

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// userinfoPassword matches the password of "scheme://user:password@" in a
// string that net/url cannot parse.
var userinfoPassword = regexp.MustCompile(`(://[^:/?#@]*:)[^@/?#]*@`)

// redactErr returns an error with err's message, in which every copy of
// connString has its password masked. The parsers of go-redis (through
// net/url) and, best effort, pgx quote their input in errors, and these
// errors end up in boot logs.
func redactErr(err error, connString string) error {
	redacted := userinfoPassword.ReplaceAllString(connString, "${1}xxxxx@")
	if u, perr := url.Parse(connString); perr == nil && u.User != nil {
		redacted = u.Redacted()
	}
	msg := err.Error()
	msg = strings.ReplaceAll(msg, strconv.Quote(connString), strconv.Quote(redacted))
	msg = strings.ReplaceAll(msg, connString, redacted)
	return errors.New(msg)
}
