package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// What pglease prints on stderr (errors, the console's log of writes)
// passes through a redactWriter: the password of every connection string
// in it is masked, in each form libpq accepts, and so is every password
// of the connection strings the command was given (--dsn, $DATABASE_URL,
// --source-dsn, $PGPASSWORD) wherever it appears. Errors of parsing a
// connection string never quote it in the first place (parseDSNError).

// redactMask replaces a password.
const redactMask = "xxxxx"

// minScrubbedSecret is the length from which a password given to the
// command is masked wherever it appears in what is printed; a shorter one
// is masked where it stands in a connection string only (masking every
// occurrence of two letters would make the messages unreadable).
const minScrubbedSecret = 4

var (
	// uriPattern finds a postgres:// or postgresql:// URI in text: up to
	// white space or a character that quotes it.
	uriPattern = regexp.MustCompile("(?i)postgres(?:ql)?://[^\\s`\"'<>]*")
	// passwordKey finds a password keyword (password, sslpassword, and
	// PGPASSWORD as in an environment) and its "=", with white space
	// around it as libpq allows.
	passwordKey = regexp.MustCompile(`(?i)password\s*=[ \t\n\r\v\f]*`)
)

// redactText returns text with the passwords of the connection strings in
// it masked, and every secret of at least minScrubbedSecret bytes too.
func redactText(text string, secrets []string) string {
	var b strings.Builder
	last := 0
	for _, loc := range uriPattern.FindAllStringIndex(text, -1) {
		b.WriteString(redactKeywordValues(text[last:loc[0]]))
		b.WriteString(redactURI(text[loc[0]:loc[1]]))
		last = loc[1]
	}
	b.WriteString(redactKeywordValues(text[last:]))
	out := b.String()
	for _, s := range secrets {
		if len(s) >= minScrubbedSecret {
			out = strings.ReplaceAll(out, s, redactMask)
		}
	}
	return out
}

// redactKeywordValues masks the value of every password keyword in text:
// a quoted value up to its closing quote (a backslash escapes the next
// character), else up to white space (a backslash escapes it too).
func redactKeywordValues(text string) string {
	var b strings.Builder
	for {
		loc := passwordKey.FindStringIndex(text)
		if loc == nil {
			b.WriteString(text)
			return b.String()
		}
		b.WriteString(text[:loc[1]])
		rest := text[loc[1]:]
		end := keywordValueEnd(rest)
		if end > 0 {
			b.WriteString(redactMask)
		}
		text = rest[end:]
	}
}

// keywordValueEnd returns the length of the keyword value at the start of
// s, as libpq reads it (an unterminated quote runs to the end).
func keywordValueEnd(s string) int {
	if s == "" {
		return 0
	}
	if s[0] == '\'' {
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '\'':
				return i + 1
			}
		}
		return len(s)
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case ' ', '\t', '\n', '\r', '\v', '\f':
			return i
		}
	}
	return len(s)
}

// redactURI masks the password of a URI: the userinfo's (everything from
// its first ":" to the last "@", so that an "@" or "/" left unencoded in
// the password is masked too) and the password parameters of its query.
func redactURI(u string) string {
	i := strings.Index(u, "://") + 3
	scheme, rest := u[:i], u[i:]
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if c := strings.IndexByte(rest[:at], ':'); c >= 0 {
			rest = rest[:c+1] + redactMask + rest[at:]
		}
	}
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		return scheme + rest
	}
	pairs := strings.Split(rest[q+1:], "&")
	for n, pair := range pairs {
		key, _, ok := strings.Cut(pair, "=")
		if !ok {
			continue
		}
		if k, err := url.QueryUnescape(key); err == nil {
			key = k
		}
		if strings.Contains(strings.ToLower(key), "password") {
			pairs[n] = pair[:strings.IndexByte(pair, '=')+1] + redactMask
		}
	}
	return scheme + rest[:q+1] + strings.Join(pairs, "&")
}

// dsnSecrets returns the passwords of a connection string, as written and
// decoded (the forms they may be printed in).
func dsnSecrets(dsn string) []string {
	var out []string
	add := func(raw string) {
		out = append(out, raw)
		if d, err := url.PathUnescape(raw); err == nil && d != raw {
			out = append(out, d)
		}
		if strings.HasPrefix(raw, "'") {
			raw = strings.TrimSuffix(raw[1:], "'")
			out = append(out, raw)
		}
		if u := unescapeBackslashes(raw); u != raw {
			out = append(out, u)
		}
	}
	for _, loc := range uriPattern.FindAllStringIndex(dsn, -1) {
		u := dsn[loc[0]:loc[1]]
		rest := u[strings.Index(u, "://")+3:]
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if c := strings.IndexByte(rest[:at], ':'); c >= 0 {
				add(rest[c+1 : at])
				// An "@", "/" or "?" left unencoded in the password ends
				// it where libpq reads it: the rest becomes the host or the
				// path, and is printed as such.
				for _, piece := range strings.FieldsFunc(rest[c+1:at], func(r rune) bool { return r == '@' || r == '/' || r == '?' }) {
					add(piece)
				}
			}
		}
		if q := strings.IndexByte(rest, '?'); q >= 0 {
			for _, pair := range strings.Split(rest[q+1:], "&") {
				key, value, _ := strings.Cut(pair, "=")
				if k, err := url.QueryUnescape(key); err == nil {
					key = k
				}
				if strings.Contains(strings.ToLower(key), "password") && value != "" {
					add(value)
					if v, err := url.QueryUnescape(value); err == nil {
						out = append(out, v)
					}
				}
			}
		}
	}
	text := dsn
	for {
		loc := passwordKey.FindStringIndex(text)
		if loc == nil {
			break
		}
		rest := text[loc[1]:]
		end := keywordValueEnd(rest)
		if end > 0 {
			add(rest[:end])
		}
		text = rest[end:]
	}
	return out
}

// unescapeBackslashes drops each backslash and keeps the character after
// it, as libpq reads a keyword value.
func unescapeBackslashes(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// redactWriter masks passwords in what is written through it (see
// redactText); each Write is redacted as a whole, so write a message in
// one call (as fmt.Fprintf does).
type redactWriter struct {
	w       io.Writer
	mu      sync.Mutex
	secrets []string
}

func newRedactWriter(w io.Writer) *redactWriter { return &redactWriter{w: w} }

// addDSN adds the passwords of connection strings to those masked
// wherever they appear.
func (r *redactWriter) addDSN(dsns ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range dsns {
		r.secrets = append(r.secrets, dsnSecrets(d)...)
	}
	// The longest first: one that contains another is masked whole.
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
}

// addSecret adds a password to those masked wherever they appear.
func (r *redactWriter) addSecret(s string) {
	if s == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secrets = append(r.secrets, s)
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
}

func (r *redactWriter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := io.WriteString(r.w, redactText(string(p), r.secrets)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// parseDSNError is the error of parsing the connection string of what
// (such as "--dsn"): pgx's reason without the connection string, which
// pgx quotes with its password masked only in the forms it recognizes.
func parseDSNError(what string, err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return fmt.Errorf("cannot parse the connection string of %s: %w", what, err)
	}
	bare := *pce
	bare.ConnString = ""
	reason := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	return fmt.Errorf("cannot parse the connection string of %s: %s", what, reason)
}
