package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgBouncer's limits and waits.
const (
	// maxClientConns is PgBouncer's max_client_conn when the open files
	// limit allows it (a descriptor per client and server connection).
	maxClientConns = 2000
	// wantNofile is the open files limit PgBouncer gets, when the hard
	// limit allows it.
	wantNofile = 8192
	// bouncerStartWait bounds how long PgBouncer takes to listen.
	bouncerStartWait = 15 * time.Second
	// bouncerStopWait is how long PgBouncer gets after SIGTERM, then
	// after SIGKILL.
	bouncerStopWait = 5 * time.Second
	// portAttempts is how many ports a server is tried on (another
	// process may take a free port first).
	portAttempts = 5
)

// pgbouncerPaths are where PgBouncer is looked for after PATH: Debian puts
// it in /usr/sbin, which is not on a normal user's PATH.
var pgbouncerPaths = []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer", "/opt/homebrew/bin/pgbouncer"}

//go:embed pgbouncer.ini.tmpl
var iniText string

var iniTemplate = template.Must(template.New("pgbouncer.ini").Option("missingkey=error").Parse(iniText))

// target is the server a PgBouncer stands in front of, and how it logs in.
type target struct {
	Host     string
	Port     uint16
	User     string
	Password string // may be empty
	Database string
	// SSLMode is PgBouncer's server_tls_sslmode: libpq's sslmode of the
	// URL.
	SSLMode string
	// CAFile is PgBouncer's server_tls_ca_file: the URL's sslrootcert,
	// for verify-ca and verify-full.
	CAFile string
}

// targetOf reads the server, user, database and TLS mode of a database
// URL (or keyword/value connection string), with the PG* environment
// variables and libpq's defaults for what it does not say, as pgx does.
func targetOf(dsn string) (target, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return target{}, err
	}
	for _, fb := range cfg.Fallbacks {
		if fb.Host != cfg.Host || fb.Port != cfg.Port {
			return target{}, errors.New("the database URL names several hosts; PgBouncer can stand in front of one")
		}
	}
	t := target{Host: cfg.Host, Port: cfg.Port, User: cfg.User, Password: cfg.Password, Database: cfg.Database, SSLMode: sslModeOf(cfg)}
	if t.Database == "" {
		t.Database = t.User // libpq's default
	}
	if t.SSLMode == "verify-ca" || t.SSLMode == "verify-full" {
		if t.CAFile, err = rootCertOf(dsn); err != nil {
			return target{}, err
		}
	}
	return t, nil
}

// sslModeOf returns libpq's sslmode that pgconn turned into cfg: the TLS
// configuration of the first attempt and of its fallback for the same host
// ("allow": without TLS, then with; "prefer": the other way round).
func sslModeOf(cfg *pgconn.Config) string {
	plainFallback, tlsFallback := false, false
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil {
			plainFallback = true
		} else {
			tlsFallback = true
		}
	}
	switch {
	case cfg.TLSConfig == nil && tlsFallback:
		return "allow"
	case cfg.TLSConfig == nil:
		return "disable"
	case plainFallback:
		return "prefer"
	case !cfg.TLSConfig.InsecureSkipVerify:
		return "verify-full"
	case cfg.TLSConfig.VerifyPeerCertificate != nil:
		return "verify-ca" // also require with a root certificate, as in libpq
	default:
		return "require"
	}
}

// rootCertOf returns the file of root certificates the server of a URL is
// verified with: its sslrootcert, else PGSSLROOTCERT, else libpq's
// ~/.postgresql/root.crt. pgconn reads that file but does not say which it
// was, and only a URL can be read without pgconn: a keyword/value
// connection string that asks for verification is refused.
func rootCertOf(dsn string) (string, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return "", errors.New("the connection string asks to verify the server's certificate: give the database as a URL (postgres://...) for PgBouncer to verify it too")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	if f := u.Query().Get("sslrootcert"); f != "" {
		return checkRootCert(f)
	}
	if f := os.Getenv("PGSSLROOTCERT"); f != "" {
		return checkRootCert(f)
	}
	if home, err := os.UserHomeDir(); err == nil {
		if f := filepath.Join(home, ".postgresql", "root.crt"); fileExists(f) {
			return f, nil
		}
	}
	return "", errors.New("the database URL asks to verify the server's certificate and names no sslrootcert for PgBouncer to verify it with")
}

func checkRootCert(f string) (string, error) {
	if f == "system" {
		return "", errors.New("sslrootcert=system: PgBouncer needs a file of root certificates")
	}
	abs, err := filepath.Abs(f)
	if err != nil {
		return "", err
	}
	return abs, nil
}

func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}

// serverMaxConns returns how many connections the server of dsn allows
// (less the superuser's reserve), or PostgreSQL's default of 100 when it
// cannot be asked.
func serverMaxConns(ctx context.Context, dsn string) int {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 100
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int").Scan(&n)
	if err != nil || n <= 0 {
		return 100
	}
	return n
}

// poolSize is PgBouncer's default_pool_size for a server that allows
// maxConns connections: a quarter of them (less 3 for the superuser's
// reserve), at least 2, at most 40, so that the direct connections of the
// same tests still fit.
func poolSize(maxConns int) int {
	return min(max((maxConns-3)/4, 2), 40)
}

// iniData is what pgbouncer.ini.tmpl needs.
type iniData struct {
	Host       string
	Port       uint16
	ListenPort int
	Dir        string // PgBouncer's pid file, log and auth file
	User       string
	PoolSize   int
	MaxClients int
	SSLMode    string
	CAFile     string
}

// renderIni returns pgbouncer.ini. A value that would break the file's
// syntax (a line break; in the connection string of the server, a space or
// a quote) is refused.
func renderIni(d iniData) ([]byte, error) {
	for name, v := range map[string]string{"host": d.Host, "user": d.User, "directory": d.Dir, "sslrootcert": d.CAFile} {
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, fmt.Errorf("the %s %q has a line break, which PgBouncer's configuration cannot hold", name, v)
		}
	}
	if strings.ContainsAny(d.Host, " \t'\"\\") {
		return nil, fmt.Errorf("the host %q has a space, quote or backslash, which PgBouncer's configuration cannot hold", d.Host)
	}
	var b bytes.Buffer
	if err := iniTemplate.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// authFileLine is the line of PgBouncer's auth_file for user: both values
// in double quotes, a double quote doubled.
func authFileLine(user, password string) string {
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	return q(user) + " " + q(password) + "\n"
}

// findPgBouncer returns the path of the pgbouncer program, or "".
func findPgBouncer() string {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	for _, p := range pgbouncerPaths {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// bouncer is a PgBouncer started by startBouncer, a child of this process.
type bouncer struct {
	dir        string
	port       int
	poolSize   int
	maxClients int
	cmd        *exec.Cmd
	exited     chan struct{} // closed once cmd.Wait returned
}

func (b *bouncer) pidFile() string { return filepath.Join(b.dir, "pgbouncer.pid") }
func (b *bouncer) logFile() string { return filepath.Join(b.dir, "pgbouncer.log") }

// dsn is the URL of database db as user through PgBouncer.
func (b *bouncer) dsn(user, db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// alive reports whether PgBouncer still runs.
func (b *bouncer) alive() bool {
	select {
	case <-b.exited:
		return false
	default:
		return true
	}
}

// stop stops PgBouncer: SIGTERM (its immediate shutdown), SIGKILL after
// 5 s.
func (b *bouncer) stop() {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !b.alive() {
			return
		}
		_ = b.cmd.Process.Signal(sig)
		select {
		case <-b.exited:
			return
		case <-time.After(bouncerStopWait):
		}
	}
}

// startBouncer starts a PgBouncer in transaction mode in front of t, with
// its files in dir (which it creates), as acct, allowing for a server of
// maxConns connections; it returns once PgBouncer accepts connections.
func startBouncer(ctx context.Context, bin, dir string, t target, maxConns int, acct *account) (*bouncer, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if err := acct.chown(dir); err != nil {
		return nil, err
	}
	nofile, err := raiseNofile()
	if err != nil {
		return nil, err
	}
	maxClients := min(maxClientConns, nofile-200)
	if maxClients < 100 {
		return nil, fmt.Errorf("the open files limit (%d) is too low for PgBouncer", nofile)
	}
	d := iniData{Host: t.Host, Port: t.Port, Dir: dir, User: t.User, PoolSize: poolSize(maxConns),
		MaxClients: maxClients, SSLMode: t.SSLMode, CAFile: t.CAFile}
	ini, userlist, startLog := filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "start.log")
	if err := writeOwned(userlist, []byte(authFileLine(t.User, t.Password)), 0o600, acct); err != nil {
		return nil, err
	}
	var b *bouncer
	for attempt := 1; attempt <= portAttempts; attempt++ {
		if d.ListenPort, err = freePort(); err != nil {
			return nil, err
		}
		var text []byte
		if text, err = renderIni(d); err != nil {
			return nil, err
		}
		if err := writeOwned(ini, text, 0o644, acct); err != nil {
			return nil, err
		}
		b = &bouncer{dir: dir, port: d.ListenPort, poolSize: d.PoolSize, maxClients: d.MaxClients, exited: make(chan struct{})}
		_ = os.Remove(b.pidFile())
		_ = os.Remove(b.logFile())
		if err = b.start(ctx, bin, ini, startLog, acct); err == nil {
			return b, nil
		}
		b.stop()
		if !bindFailed(b.logFile(), startLog) {
			break
		}
		logf("port %d was taken meanwhile; trying another for PgBouncer (attempt %d)", d.ListenPort, attempt)
	}
	if out, _ := os.ReadFile(startLog); len(bytes.TrimSpace(out)) > 0 {
		os.Stderr.Write(out)
	}
	if tl := tail(b.logFile(), 30); tl != "" {
		fmt.Fprintln(os.Stderr, tl)
	}
	return nil, fmt.Errorf("PgBouncer did not start: %w", err)
}

// start runs PgBouncer in the foreground, as a child killed with this
// process, and waits until it accepts TCP connections.
func (b *bouncer) start(ctx context.Context, bin, ini, startLog string, acct *account) error {
	out, err := os.Create(startLog)
	if err != nil {
		return err
	}
	defer out.Close()
	// -q: the log goes to the log file only.
	b.cmd = exec.Command(bin, "-q", ini)
	b.cmd.Dir = b.dir
	b.cmd.Stdout, b.cmd.Stderr = out, out
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		close(b.exited)
		return err
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	deadline := time.Now().Add(bouncerStartWait)
	for {
		if !b.alive() {
			return fmt.Errorf("it exited (%v)", b.cmd.ProcessState)
		}
		if portOpen(b.port) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("it does not listen on 127.0.0.1:%d after %s", b.port, bouncerStartWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// reportDeath says, with the last lines of its log, when PgBouncer exited
// before the command ended.
func (b *bouncer) reportDeath() {
	if b.alive() {
		return
	}
	logf("PgBouncer (pid %d) exited before the command ended; the last lines of its log:", b.cmd.Process.Pid)
	if tl := tail(b.logFile(), 20); tl != "" {
		fmt.Fprintln(os.Stderr, tl)
	}
}

// pgbouncerVersion returns the version of the pgbouncer program, or "?".
func pgbouncerVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "?"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if f := strings.Fields(first); len(f) >= 2 {
		return f[1]
	}
	return "?"
}

// raiseNofile raises the soft limit of open files of this process, which
// its children inherit, to 8192 when the hard limit allows it, and returns
// it. (Go programs, the tests among them, raise their own limit anyway.)
func raiseNofile() (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	want := min(uint64(wantNofile), lim.Max)
	if lim.Cur != want {
		lim.Cur = want
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return int(want), nil
}

// bindFailed reports whether one of the logs says the port was taken.
func bindFailed(logs ...string) bool {
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		s := strings.ToLower(string(b))
		if strings.Contains(s, "address already in use") || strings.Contains(s, "could not bind") {
			return true
		}
	}
	return false
}
