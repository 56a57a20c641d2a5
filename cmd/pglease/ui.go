package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

var uiSpec = commandSpec{
	name:     "ui",
	summary:  "the console in a browser: groups, lag, topics, messages, resets and replays",
	synopsis: "[--listen 127.0.0.1:8080] [--allow-host NAME]... [--token-file FILE] [--allow-writes] [--sample-every 5s] [--warn-after 5s]",
	help: `Serves a web console on --listen (127.0.0.1:8080 by default: only this
machine): the consumer groups with their members, rows and lag, the live
sessions, the maintainer, and a red banner naming the transaction when the
xmin horizon holds delivery back; a group's rows with owner, epoch,
position, lag and a chart of its lag over the last minutes (sampled by the
server every --sample-every while it runs); the topics, with a message
browser (newest first, paged, payload as text or hex, look-up by UUID).
Every page is read through the Inspector; the browser sends no SQL.

Every page needs the console's token: open the URL printed at start, which
carries it (?token=...) once and starts a session (a random cookie that
expires after 12 hours; the token is not in it), or type the token on the
page that asks for it. The token is read from
--token-file or $PGLEASE_UI_TOKEN; without either, a random one is made
and printed in that URL. The console answers only to requests whose Host is
an IP address (only a loopback one when it listens on loopback), localhost,
the --listen host or a name given with --allow-host: a web page cannot read
it by pointing a name of its own at this address.

It reads only, unless started with --allow-writes: then an operator who
signs in with their name and the token may reset a group's offsets (a
dry-run preview, then a confirmation; refused while a live Subscriber owns
a row unless forced, as in pglease reset-offsets), replay messages (as
pglease replay) and delete an idle group's offsets. Signing in starts a
write session (random, for 8 hours; signing out ends it on the server).
Writes are refused without one, from another origin (the Origin or Referer
header must be this console's address) and without the session's
anti-forgery field; each is logged on stderr with the name the operator
signed in with and their address.

--timeout bounds each page's queries. The console runs until interrupted.`,
	new: func() subcommand { return &uiCmd{} },
}

const (
	defaultUIListen    = "127.0.0.1:8080"
	defaultSampleEvery = 5 * time.Second
	// chartSamples is how many lag samples a group's chart keeps.
	chartSamples = 180
	// maxGroupRows is how many rows a group's page shows.
	maxGroupRows = 1000
	// maxOverviewSessions is how many sessions the overview lists.
	maxOverviewSessions = 200
	// accessCookie holds the identifier of a read session, writeCookie
	// that of a write session (signed in): see sessionStore.
	accessCookie = "pglease_ui_access"
	writeCookie  = "pglease_ui_write"
)

// The HTTP server's limits: a client that is slow to send its request, or
// to read the answer, or that keeps an idle connection, is disconnected.
const (
	uiReadHeaderTimeout = 5 * time.Second
	uiReadTimeout       = 30 * time.Second // a form is at most 1 MiB
	uiIdleTimeout       = 2 * time.Minute
	// uiWriteTimeout is added to --timeout (which bounds a page's
	// queries) for the time to send the page.
	uiWriteTimeout    = 30 * time.Second
	uiMaxHeaderBytes  = 64 << 10
	uiMaxRequestBytes = 1 << 20
)

//go:embed ui_assets
var uiAssets embed.FS

type uiCmd struct {
	listen      string
	allowHosts  stringList
	allowWrites bool
	tokenFile   string
	sampleEvery time.Duration
	warnAfter   time.Duration
}

func (c *uiCmd) longRunning() {}

func (c *uiCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "listen", defaultUIListen, "serve on this `ADDRESS` (host:port; port 0: any free port)")
	fs.Var(&c.allowHosts, "allow-host", "also answer to requests for this host `NAME` (repeatable; IP addresses and localhost always)")
	fs.BoolVar(&c.allowWrites, "allow-writes", false, "offer resets, replays and deletions to operators who sign in with the token")
	fs.StringVar(&c.tokenFile, "token-file", "", "read the console's token from this `FILE` (default: $PGLEASE_UI_TOKEN, else a random one)")
	fs.DurationVar(&c.sampleEvery, "sample-every", defaultSampleEvery, "sample every group's lag for the charts this often (`DURATION`)")
	fs.DurationVar(&c.warnAfter, "warn-after", defaultWarnAfter,
		"show the red banner when the oldest writing transaction is older than this `DURATION`")
}

func (c *uiCmd) check(*flag.FlagSet) error {
	if c.sampleEvery < 100*time.Millisecond {
		return usageErrorf("--sample-every must be at least 100ms, got %s", c.sampleEvery)
	}
	if c.warnAfter < 0 {
		return usageErrorf("--warn-after must not be negative, got %s", c.warnAfter)
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return usageErrorf("--listen %q is not HOST:PORT: %v", c.listen, err)
	}
	for _, h := range c.allowHosts.values {
		if h == "" || strings.ContainsAny(h, ":/[] ") {
			return usageErrorf("--allow-host %q is not a host name (give the name without a port)", h)
		}
	}
	return nil
}

func (c *uiCmd) run(ctx context.Context, e *cmdEnv) error {
	token, generated, err := c.token(e)
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return parseDSNError(e.dsnSource, err)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName + " ui"
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	insp, err := admin.NewInspector(pool, e.tables)
	if err != nil {
		return err
	}
	listenHost, _, _ := net.SplitHostPort(c.listen)
	srv, err := newUIServer(uiConfig{
		insp: insp, pool: pool, tables: e.tables, token: token, allowWrites: c.allowWrites, warnAfter: c.warnAfter,
		timeout: e.timeout, log: e.stderr, loopbackOnly: isLoopbackListen(c.listen),
		hosts: append([]string{listenHost}, c.allowHosts.values...),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.listen, err)
	}
	hs := newHTTPServer(srv, defaultUILimits(e.timeout))
	// The server's own errors go to stderr as the rest: through its
	// filters (redactWriter, terminalWriter).
	hs.ErrorLog = log.New(e.stderr, "pglease ui: http: ", log.LstdFlags|log.LUTC)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv.sampler.run(ctx, c.sampleEvery)
	}()
	base := "http://" + ln.Addr().String() + "/"
	if generated {
		fmt.Fprintf(e.stdout, "pglease ui: serving on %s?token=%s (writes %s); interrupt to stop\n", base, token, onOff(c.allowWrites))
	} else {
		fmt.Fprintf(e.stdout, "pglease ui: serving on %s (writes %s): open %s?token=TOKEN with the token of %s; interrupt to stop\n",
			base, onOff(c.allowWrites), base, c.tokenSource())
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = hs.Shutdown(shutCtx)
		cancel()
		<-errc //nolint:errcheck // http.ErrServerClosed, after Shutdown
	}
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// uiLimits are the timeouts and sizes of the console's HTTP server.
type uiLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

// defaultUILimits are the limits of a console whose pages' queries are
// bounded by timeout (0: not bounded).
func defaultUILimits(timeout time.Duration) uiLimits {
	write := uiWriteTimeout + timeout
	if timeout <= 0 {
		write = 10 * uiWriteTimeout
	}
	return uiLimits{readHeader: uiReadHeaderTimeout, read: uiReadTimeout, write: write, idle: uiIdleTimeout,
		maxHeaderBytes: uiMaxHeaderBytes}
}

// newHTTPServer is the console's HTTP server: a client slow to send its
// request or read the answer, or idle, is disconnected.
func newHTTPServer(h http.Handler, l uiLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read, WriteTimeout: l.write,
		IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeaderBytes}
}

// tokenSource says where the token was read from.
func (c *uiCmd) tokenSource() string {
	if c.tokenFile != "" {
		return "--token-file " + c.tokenFile
	}
	return "$PGLEASE_UI_TOKEN"
}

// token returns the token from --token-file or $PGLEASE_UI_TOKEN, or
// makes one (generated is then true).
func (c *uiCmd) token(e *cmdEnv) (token string, generated bool, err error) {
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return "", false, fmt.Errorf("read --token-file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if len(t) < minTokenLength {
			return "", false, fmt.Errorf("the token in %s is shorter than %d characters", c.tokenFile, minTokenLength)
		}
		return t, false, nil
	}
	if t := strings.TrimSpace(e.getenv("PGLEASE_UI_TOKEN")); t != "" {
		if len(t) < minTokenLength {
			return "", false, fmt.Errorf("$PGLEASE_UI_TOKEN is shorter than %d characters", minTokenLength)
		}
		return t, false, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", false, err
	}
	return hex.EncodeToString(b), true, nil
}

// minTokenLength is the shortest token the console accepts.
const minTokenLength = 16

func onOff(b bool) string {
	if b {
		return "allowed with the token"
	}
	return "off"
}

// uiConfig is what a uiServer runs with.
type uiConfig struct {
	insp        *admin.Inspector
	pool        *pgxpool.Pool // for dry runs: a transaction rolled back
	tables      pglease.Tables
	token       string // the console's token: reads need it, writes too
	allowWrites bool
	warnAfter   time.Duration
	timeout     time.Duration // per request; 0: none
	log         io.Writer     // the log of writes
	// loopbackOnly refuses requests whose Host is an IP address other
	// than a loopback one: set when the console listens on one.
	loopbackOnly bool
	// hosts are the names, besides IP addresses and localhost, that the
	// console answers to (the --listen host, --allow-host). A request for
	// any other name is refused, so that a web page whose name an
	// attacker points at the console's address (DNS rebinding) cannot
	// read it through the operator's browser.
	hosts []string
}

// uiServer is the console's HTTP handler.
type uiServer struct {
	uiConfig
	tmpl     *template.Template
	mux      *http.ServeMux
	sessions *sessionStore
	sampler  *lagSampler
	logMu    sync.Mutex
}

func newUIServer(cfg uiConfig) (*uiServer, error) {
	if len(cfg.token) < minTokenLength {
		return nil, fmt.Errorf("the console needs a token of at least %d characters", minTokenLength)
	}
	tmpl, err := template.New("").Funcs(uiFuncs).ParseFS(uiAssets, "ui_assets/*.html")
	if err != nil {
		return nil, err
	}
	s := &uiServer{uiConfig: cfg, tmpl: tmpl, mux: http.NewServeMux(), sessions: newSessionStore(),
		sampler: newLagSampler(cfg.insp, chartSamples)}
	for i, h := range s.hosts {
		s.hosts[i] = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	}
	static, err := fs.Sub(uiAssets, "ui_assets")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.page(s.overview))
	s.mux.HandleFunc("GET /group", s.page(s.group))
	s.mux.HandleFunc("GET /topics", s.page(s.topics))
	s.mux.HandleFunc("GET /topic", s.page(s.topic))
	s.mux.HandleFunc("GET /message", s.page(s.message))
	s.mux.HandleFunc("GET /signin", s.page(s.signinForm))
	s.mux.HandleFunc("POST /open", s.open)
	s.mux.HandleFunc("POST /signin", s.write(s.signin))
	s.mux.HandleFunc("POST /signout", s.write(s.signout))
	s.mux.HandleFunc("POST /actions/reset", s.write(s.reset))
	s.mux.HandleFunc("POST /actions/replay", s.write(s.replay))
	s.mux.HandleFunc("POST /actions/delete-group", s.write(s.deleteGroup))
	return s, nil
}

func (s *uiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r.Host) {
		// Misdirected Request: not a name of this server.
		http.Error(w, fmt.Sprintf("pglease ui answers only to IP addresses, localhost and the names of --listen and --allow-host, not to %q%s",
			r.Host, s.loopbackNote()), http.StatusMisdirectedRequest)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if t, ok := r.URL.Query()["token"]; ok && r.Method == http.MethodGet {
		s.openWithToken(w, r, strings.Join(t, ""))
		return
	}
	opening := r.Method == http.MethodPost && r.URL.Path == "/open"
	if !s.canRead(r) && !strings.HasPrefix(r.URL.Path, "/static/") && !opening {
		s.render(w, http.StatusUnauthorized, "open.html", &pageData{Title: "Open the console"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *uiServer) loopbackNote() string {
	if s.loopbackOnly {
		return " (it listens on a loopback address: of IP addresses, only loopback ones)"
	}
	return ""
}

// canRead reports whether the request belongs to a live read session.
func (s *uiServer) canRead(r *http.Request) bool {
	_, ok := s.readSession(r)
	return ok
}

// openWithToken serves a GET with ?token=: the right token starts a read
// session and sends the browser to the same page of the console without
// the token in its address (to the overview when the path is not one of
// the console's pages: never to another site).
func (s *uiServer) openWithToken(w http.ResponseWriter, r *http.Request, token string) {
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.token)) != 1 {
		s.render(w, http.StatusForbidden, "open.html", &pageData{Title: "Open the console", Error: "That is not the console's token."})
		return
	}
	s.startSession(w, accessCookie, uiSession{}, readSessionTTL)
	q := r.URL.Query()
	q.Del("token")
	target := consolePath(r.URL.Path)
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// open serves the form of the page that asks for the token.
func (s *uiServer) open(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, uiMaxRequestBytes)
	d := &pageData{Title: "Open the console"}
	switch {
	case r.ParseForm() != nil:
		d.Error = "Cannot read the form."
	case !s.sameOrigin(r):
		d.Error = "The form does not come from a page of this console."
	case subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(s.token)) != 1:
		d.Error = "That is not the console's token."
	default:
		s.startSession(w, accessCookie, uiSession{}, readSessionTTL)
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusForbidden, "open.html", d)
}

// hostAllowed reports whether a request's Host (with or without a port)
// is one the console answers to: an IP address (a loopback one when it
// listens on loopback), localhost, or one of its names.
func (s *uiServer) hostAllowed(hostport string) bool {
	host := hostOf(hostport)
	if ip := net.ParseIP(host); ip != nil {
		return !s.loopbackOnly || ip.IsLoopback()
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	for _, h := range s.hosts {
		if h != "" && strings.EqualFold(host, h) {
			return true
		}
	}
	return false
}

// hostOf returns the host of a host[:port], without brackets.
func hostOf(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}

// pageData is what every page template gets.
type pageData struct {
	Title       string
	Nav         string
	Banner      *heldBanner
	AllowWrites bool
	// CanRead: the request belongs to a read session (the page that asks
	// for the token has no navigation).
	CanRead  bool
	SignedIn bool
	Operator string
	CSRF     string
	Error    string
	// Notice is the notice the server set for the read session after a
	// write (see uiServer.redirect): never text of the request.
	Notice string
	Body   any
}

// heldBanner is the red banner: delivery held back by the xmin horizon.
type heldBanner struct {
	Status statusOutput
	Who    string
	Age    string
	Known  bool
	// Topics, on a single server, names the partitions the open
	// publisher holds back; empty where the xmin horizon holds back
	// every topic (Citus).
	Topics string
	Query  string
}

type pageFunc func(ctx context.Context, r *http.Request, d *pageData) (template string, err error)

// page serves a GET page: the horizon banner, then the page's own data.
func (s *uiServer) page(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if s.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.timeout)
			defer cancel()
		}
		d := s.newPageData(r)
		if err := s.banner(ctx, d); err != nil {
			s.fail(w, r, d, err)
			return
		}
		name, err := f(ctx, r, d)
		if err != nil {
			s.fail(w, r, d, err)
			return
		}
		s.render(w, http.StatusOK, name, d)
	}
}

// newPageData starts the data of a page: the notice the server left for
// the read session (a GET shows it once), and the operator of the write
// session.
func (s *uiServer) newPageData(r *http.Request) *pageData {
	d := &pageData{AllowWrites: s.allowWrites, CanRead: true}
	if id, ok := s.readSession(r); ok && r.Method == http.MethodGet {
		d.Notice = s.sessions.takeNotice(id)
	}
	if ws, ok := s.writeSession(r); ok {
		d.SignedIn, d.CSRF, d.Operator = true, ws.csrf, ws.operator
	}
	return d
}

func (s *uiServer) banner(ctx context.Context, d *pageData) error {
	h, err := s.insp.Horizon(ctx)
	if err != nil {
		return err
	}
	st := newStatusOutput(nil, h, s.warnAfter)
	holder := deliveryHolder(h)
	if holder == nil || (st.DeliveryHeldBack != nil && !*st.DeliveryHeldBack) {
		return nil
	}
	b := &heldBanner{Status: st, Known: st.DeliveryHeldBack != nil}
	// On Citus, the coordinator's session whose transaction the worker's
	// backend runs, where known.
	who := *holder
	if h.PerTopic {
		who = publisherSession(h.Publishers[0])
	}
	b.Who = fmt.Sprintf("pid %d (%s, user %s, database %s)", who.PID, orDash(who.ApplicationName),
		orDash(who.User), orDash(who.Database))
	if holder.GID != "" {
		b.Who = fmt.Sprintf("prepared transaction %q", holder.GID)
	}
	if h.PerTopic && h.Publishers[0].Node != "" {
		if p := h.Publishers[0]; p.Client != nil {
			b.Who += fmt.Sprintf(", on worker %s as pid %d", p.Node, p.PID)
		} else {
			b.Who += " on worker " + p.Node
		}
	}
	b.Age, b.Query = formatDuration(holder.Age), who.Query
	if h.PerTopic {
		b.Topics = formatHeld(h.Publishers[0])
	}
	d.Banner = b
	return nil
}

func (s *uiServer) render(w http.ResponseWriter, status int, name string, d *pageData) {
	var buf strings.Builder
	if err := s.tmpl.ExecuteTemplate(&buf, name, d); err != nil {
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, buf.String())
}

func (s *uiServer) fail(w http.ResponseWriter, _ *http.Request, d *pageData, err error) {
	status := http.StatusInternalServerError
	var he *httpError
	if errors.As(err, &he) {
		status = he.status
	}
	d.Title, d.Error = "Error", err.Error()
	s.render(w, status, "error.html", d)
}

// httpError is an error with the HTTP status to answer with.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) error {
	return &httpError{status: http.StatusForbidden, msg: fmt.Sprintf(format, args...)}
}

// sameOrigin reports whether the request comes from a page of this
// console: its Origin header, or without one its Referer, is
// http://HOST where HOST is the request's Host, itself a name the console
// answers to (ServeHTTP refuses the others).
func (s *uiServer) sameOrigin(r *http.Request) bool {
	if !s.hostAllowed(r.Host) {
		return false
	}
	want := "http://" + r.Host
	if o := r.Header.Get("Origin"); o != "" {
		return o == want
	}
	ref := r.Header.Get("Referer")
	return ref == want || strings.HasPrefix(ref, want+"/")
}

type writeFunc func(ctx context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error

// write serves a POST: refused unless writes are allowed, the request is
// same-origin and, but for signing in, belongs to a live write session and
// carries its anti-forgery field.
func (s *uiServer) write(f writeFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if s.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.timeout)
			defer cancel()
		}
		d := s.newPageData(r)
		ws, signedIn := s.writeSession(r)
		r.Body = http.MaxBytesReader(w, r.Body, uiMaxRequestBytes)
		err := r.ParseForm()
		switch {
		case err != nil:
			err = badRequest("read the form: %v", err)
		case !s.allowWrites:
			err = forbidden("writes are off: this console was started without --allow-writes")
		case !s.sameOrigin(r):
			err = forbidden("the request does not come from a page of this console (Origin %q, Referer %q)",
				r.Header.Get("Origin"), r.Header.Get("Referer"))
		case r.URL.Path != "/signin" && !signedIn:
			err = forbidden("sign in to write first: your name and the console's token")
		case r.URL.Path != "/signin" && !validCSRF(ws, r):
			err = forbidden("the form's anti-forgery field is missing or wrong; reload the page")
		}
		if err != nil {
			s.logWrite(r, d, r.URL.Path, "refused: "+err.Error())
			s.fail(w, r, d, err)
			return
		}
		if err := s.banner(ctx, d); err != nil {
			s.fail(w, r, d, err)
			return
		}
		if err := f(ctx, w, r, d); err != nil {
			s.fail(w, r, d, err)
		}
	}
}

// logWrite logs a write (or a refused one, or a preview) with who asked.
func (s *uiServer) logWrite(r *http.Request, d *pageData, action, result string) {
	who := d.Operator
	if who == "" {
		who = "(not signed in)"
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	fmt.Fprintf(s.log, "%s pglease ui: %s by %q from %s (%s): %s\n", time.Now().UTC().Format(time.RFC3339),
		action, who, r.RemoteAddr, abbreviate(r.UserAgent(), 60), result)
}

// redirect sends the browser to path (a page of the console) with q, and
// leaves notice for the next page of its read session: the notice bar
// shows only what the server put there.
func (s *uiServer) redirect(w http.ResponseWriter, r *http.Request, path string, q url.Values, notice string) {
	if id, ok := s.readSession(r); ok && notice != "" {
		s.sessions.setNotice(id, notice)
	}
	target := consolePath(path)
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

func (s *uiServer) signinForm(_ context.Context, _ *http.Request, d *pageData) (string, error) {
	d.Title, d.Nav = "Sign in", "signin"
	if !s.allowWrites {
		return "", forbidden("writes are off: this console was started without --allow-writes, so there is nothing to sign in to")
	}
	return "signin.html", nil
}

func (s *uiServer) signin(_ context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	name := strings.TrimSpace(r.PostForm.Get("name"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(s.token)) != 1 {
		d.Operator = name
		s.logWrite(r, d, "sign-in", "refused: wrong token")
		return forbidden("that is not the console's token")
	}
	if name == "" {
		return badRequest("say who you are: the name is logged with every write")
	}
	if len(name) > maxOperatorName {
		return badRequest("the name is longer than %d bytes", maxOperatorName)
	}
	// A new session, whatever the browser had: a session identifier that
	// someone else set in the browser never becomes a signed-in one.
	s.sessions.end(cookieValue(r, writeCookie))
	s.startSession(w, writeCookie, uiSession{write: true, operator: name, csrf: randomID()}, writeSessionTTL)
	d.Operator = name
	s.logWrite(r, d, "sign-in", "ok")
	s.redirect(w, r, "/", nil, "Signed in as "+name+": writes are on.")
	return nil
}

// maxOperatorName bounds the name given at sign-in (it is in every line
// of the log of writes).
const maxOperatorName = 200

// signout ends the write session on the server: its cookie, kept or
// copied, no longer writes.
func (s *uiServer) signout(_ context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	s.sessions.end(cookieValue(r, writeCookie))
	clearCookie(w, writeCookie)
	s.logWrite(r, d, "sign-out", "ok")
	s.redirect(w, r, "/", nil, "Signed out.")
	return nil
}

// isLoopbackListen reports whether addr (host:port) is on a loopback
// address or localhost.
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && isLoopbackName(host)
}

func isLoopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
