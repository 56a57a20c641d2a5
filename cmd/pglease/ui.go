package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

func init() {
	commands = append(commands, commandSpec{
		name:     "ui",
		summary:  "the console in a browser: groups, lag, topics, messages, resets and replays",
		synopsis: "[--listen 127.0.0.1:8080] [--allow-writes [--token-file FILE]] [--sample-every 5s] [--warn-after 5s]",
		help: `Serves a web console on --listen (127.0.0.1:8080 by default: only this
machine): the consumer groups with their members, rows and lag, the live
sessions, the maintainer, and a red banner naming the transaction when the
xmin horizon holds delivery back; a group's rows with owner, epoch,
position, lag and a chart of its lag over the last minutes (sampled by the
server every --sample-every while it runs); the topics, with a message
browser (newest first, paged, payload as text or hex, look-up by UUID).
Every page is read through the Inspector; the browser sends no SQL.

It reads only, unless started with --allow-writes: then an operator who
signs in with the write token may reset a group's offsets (a dry-run preview,
then a confirmation; refused while a live Subscriber owns a row unless
forced, as in pglease reset-offsets), replay messages (as pglease replay)
and delete an idle group's offsets. The token is read from --token-file or
$PGLEASE_UI_TOKEN; without either, a random one is made and printed on
stderr. Writes are refused without the token, from another origin (the
Origin or Referer header must be this server) and without the form's
anti-forgery field; each is logged on stderr with the name the operator
signed in with and their address.

--timeout bounds each page's queries. The console runs until interrupted.`,
		new: func() subcommand { return &uiCmd{} },
	})
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
	tokenCookie         = "pglease_ui_token"
	nameCookie          = "pglease_ui_name"
)

//go:embed ui_assets
var uiAssets embed.FS

type uiCmd struct {
	listen      string
	allowWrites bool
	tokenFile   string
	sampleEvery time.Duration
	warnAfter   time.Duration
}

func (c *uiCmd) longRunning() {}

func (c *uiCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "listen", defaultUIListen, "serve on this `ADDRESS` (host:port; port 0: any free port)")
	fs.BoolVar(&c.allowWrites, "allow-writes", false, "offer resets, replays and deletions to operators with the write token")
	fs.StringVar(&c.tokenFile, "token-file", "", "read the write token from this `FILE` (default: $PGLEASE_UI_TOKEN, else a random one)")
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
	if c.tokenFile != "" && !c.allowWrites {
		return usageErrorf("--token-file needs --allow-writes")
	}
	return nil
}

func (c *uiCmd) run(ctx context.Context, e *cmdEnv) error {
	token := ""
	if c.allowWrites {
		var err error
		if token, err = c.writeToken(e); err != nil {
			return err
		}
	}
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return fmt.Errorf("parse the connection string: %w", err)
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
	insp, err := pglease.NewInspector(pool, e.adapter)
	if err != nil {
		return err
	}
	srv, err := newUIServer(uiConfig{
		insp: insp, pool: pool, adapter: e.adapter, token: token, allowWrites: c.allowWrites, warnAfter: c.warnAfter,
		timeout: e.timeout, log: e.stderr, loopbackOnly: isLoopbackListen(c.listen),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.listen, err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv.sampler.run(ctx, c.sampleEvery)
	}()
	fmt.Fprintf(e.stdout, "pglease ui: serving on http://%s/ (writes %s); interrupt to stop\n", ln.Addr(), onOff(c.allowWrites))
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

// writeToken returns the token from --token-file or $PGLEASE_UI_TOKEN, or
// makes one and prints it.
func (c *uiCmd) writeToken(e *cmdEnv) (string, error) {
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return "", fmt.Errorf("read --token-file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if len(t) < 16 {
			return "", fmt.Errorf("the token in %s is shorter than 16 characters", c.tokenFile)
		}
		return t, nil
	}
	if t := strings.TrimSpace(e.getenv("PGLEASE_UI_TOKEN")); t != "" {
		if len(t) < 16 {
			return "", errors.New("$PGLEASE_UI_TOKEN is shorter than 16 characters")
		}
		return t, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	t := hex.EncodeToString(b)
	fmt.Fprintf(e.stderr, "pglease ui: write token (sign in with it to reset, replay or delete): %s\n", t)
	return t, nil
}

func onOff(b bool) string {
	if b {
		return "allowed with the token"
	}
	return "off"
}

// uiConfig is what a uiServer runs with.
type uiConfig struct {
	insp        *pglease.Inspector
	pool        *pgxpool.Pool // for dry runs: a transaction rolled back
	adapter     pglease.DefaultSchemaAdapter
	token       string // the write token; "" when writes are off
	allowWrites bool
	warnAfter   time.Duration
	timeout     time.Duration // per request; 0: none
	log         io.Writer     // the log of writes
	// loopbackOnly refuses requests whose Host is not a loopback address
	// or localhost: set when the console listens on one, so that a web
	// page whose name an attacker points at 127.0.0.1 (DNS rebinding)
	// cannot read the console through the operator's browser.
	loopbackOnly bool
}

// uiServer is the console's HTTP handler.
type uiServer struct {
	uiConfig
	tmpl    *template.Template
	mux     *http.ServeMux
	csrf    string // the anti-forgery field of the forms
	sampler *lagSampler
	logMu   sync.Mutex
}

func newUIServer(cfg uiConfig) (*uiServer, error) {
	if cfg.allowWrites && len(cfg.token) < 16 {
		return nil, errors.New("writes need a token of at least 16 characters")
	}
	tmpl, err := template.New("").Funcs(uiFuncs).ParseFS(uiAssets, "ui_assets/*.html")
	if err != nil {
		return nil, err
	}
	s := &uiServer{uiConfig: cfg, tmpl: tmpl, mux: http.NewServeMux(), sampler: newLagSampler(cfg.insp, chartSamples)}
	if cfg.allowWrites {
		mac := hmac.New(sha256.New, []byte(cfg.token))
		mac.Write([]byte("pglease ui forms"))
		s.csrf = hex.EncodeToString(mac.Sum(nil))
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
	s.mux.HandleFunc("POST /signin", s.write(s.signin))
	s.mux.HandleFunc("POST /signout", s.write(s.signout))
	s.mux.HandleFunc("POST /actions/reset", s.write(s.reset))
	s.mux.HandleFunc("POST /actions/replay", s.write(s.replay))
	s.mux.HandleFunc("POST /actions/delete-group", s.write(s.deleteGroup))
	return s, nil
}

func (s *uiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.loopbackOnly && !isLoopbackHost(r.Host) {
		// Misdirected Request: not a name of this server.
		http.Error(w, fmt.Sprintf("pglease ui listens on a loopback address and answers only to localhost, 127.0.0.1 or [::1], not to %q", r.Host),
			http.StatusMisdirectedRequest)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	s.mux.ServeHTTP(w, r)
}

// pageData is what every page template gets.
type pageData struct {
	Title       string
	Nav         string
	Banner      *heldBanner
	AllowWrites bool
	SignedIn    bool
	Operator    string
	CSRF        string
	Error       string
	Notice      string
	Body        any
}

// heldBanner is the red banner: delivery held back by the xmin horizon.
type heldBanner struct {
	Status statusOutput
	Who    string
	Age    string
	Known  bool
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

func (s *uiServer) newPageData(r *http.Request) *pageData {
	d := &pageData{AllowWrites: s.allowWrites, Notice: r.URL.Query().Get("notice")}
	if s.allowWrites && s.signedIn(r) {
		d.SignedIn, d.CSRF = true, s.csrf
		if c, err := r.Cookie(nameCookie); err == nil {
			d.Operator, _ = url.QueryUnescape(c.Value)
		}
	}
	return d
}

func (s *uiServer) banner(ctx context.Context, d *pageData) error {
	h, err := s.insp.Horizon(ctx)
	if err != nil {
		return err
	}
	st := newStatusOutput(nil, h, s.warnAfter)
	if h.Holder == nil || (st.DeliveryHeldBack != nil && !*st.DeliveryHeldBack) {
		return nil
	}
	b := &heldBanner{Status: st, Known: st.DeliveryHeldBack != nil}
	b.Who = fmt.Sprintf("pid %d (%s, user %s, database %s)", h.Holder.PID, orDash(h.Holder.ApplicationName),
		orDash(h.Holder.User), orDash(h.Holder.Database))
	if h.Holder.GID != "" {
		b.Who = fmt.Sprintf("prepared transaction %q", h.Holder.GID)
	}
	b.Age = formatDuration(h.Holder.Age)
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

// signedIn reports whether the request carries the write token.
func (s *uiServer) signedIn(r *http.Request) bool {
	c, err := r.Cookie(tokenCookie)
	return err == nil && s.token != "" && subtle.ConstantTimeCompare([]byte(c.Value), []byte(s.token)) == 1
}

// sameOrigin reports whether the request comes from a page of this
// server: its Origin header, or without one its Referer, names this host.
func sameOrigin(r *http.Request) bool {
	want := "http://" + r.Host
	if o := r.Header.Get("Origin"); o != "" {
		return o == want
	}
	ref := r.Header.Get("Referer")
	return ref == want || strings.HasPrefix(ref, want+"/")
}

type writeFunc func(ctx context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error

// write serves a POST: refused unless writes are allowed, the request is
// same-origin and, but for signing in, carries the token cookie and the
// form's anti-forgery field.
func (s *uiServer) write(f writeFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if s.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.timeout)
			defer cancel()
		}
		d := s.newPageData(r)
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		err := r.ParseForm()
		switch {
		case err != nil:
			err = badRequest("read the form: %v", err)
		case !s.allowWrites:
			err = forbidden("writes are off: this console was started without --allow-writes")
		case !sameOrigin(r):
			err = forbidden("the request does not come from a page of this console (Origin %q, Referer %q)",
				r.Header.Get("Origin"), r.Header.Get("Referer"))
		case r.URL.Path != "/signin" && !s.signedIn(r):
			err = forbidden("sign in with the write token first")
		case r.URL.Path != "/signin" && subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1:
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

// redirect sends the browser to path with a notice.
func redirect(w http.ResponseWriter, r *http.Request, path string, q url.Values, notice string) {
	if q == nil {
		q = url.Values{}
	}
	if notice != "" {
		q.Set("notice", notice)
	}
	target := path
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
		return forbidden("that is not the write token")
	}
	if name == "" {
		return badRequest("say who you are: the name is logged with every write")
	}
	cookie := func(n, v string) {
		http.SetCookie(w, &http.Cookie{Name: n, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	cookie(tokenCookie, s.token)
	cookie(nameCookie, url.QueryEscape(name))
	d.Operator = name
	s.logWrite(r, d, "sign-in", "ok")
	redirect(w, r, "/", nil, "Signed in as "+name+": writes are on.")
	return nil
}

func (s *uiServer) signout(_ context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	for _, n := range []string{tokenCookie, nameCookie} {
		http.SetCookie(w, &http.Cookie{Name: n, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	s.logWrite(r, d, "sign-out", "ok")
	redirect(w, r, "/", nil, "Signed out.")
	return nil
}

// isLoopbackListen reports whether addr (host:port) is on a loopback
// address or localhost.
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && isLoopbackName(host)
}

// isLoopbackHost reports whether a request's Host (with or without a
// port) names a loopback address or localhost.
func isLoopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	return isLoopbackName(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
}

func isLoopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
