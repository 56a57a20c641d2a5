package main

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// The console's sessions. Opening the console with its token starts a
// read session; signing in with a name and the token starts a write
// session. Each is a random identifier that the browser keeps in a cookie
// and the server in memory, with what the session may do, the name the
// operator signed in with and the form's anti-forgery field: a cookie
// says nothing by itself, cannot be made from the token, expires, and
// ends on the server when the operator signs out (or the console stops).
const (
	// readSessionTTL is how long the console stays open in a browser
	// after the token was given.
	readSessionTTL = 12 * time.Hour
	// writeSessionTTL is how long a sign-in lasts.
	writeSessionTTL = 8 * time.Hour
	// maxSessions bounds the sessions kept: beyond it, starting one ends
	// the one that expires first.
	maxSessions = 1000
)

// uiSession is one session of the console.
type uiSession struct {
	write    bool   // a write session (signed in); else a read session
	operator string // the name given at sign-in
	csrf     string // the forms' anti-forgery field (write sessions)
	expires  time.Time
	// notice is the text of the notice bar on the next page, set by the
	// server after a write (read sessions).
	notice string
}

// sessionStore holds the console's live sessions by identifier.
type sessionStore struct {
	mu   sync.Mutex
	now  func() time.Time
	byID map[string]*uiSession
}

func newSessionStore() *sessionStore {
	return &sessionStore{now: time.Now, byID: map[string]*uiSession{}}
}

// randomID returns 32 random bytes in hex.
func randomID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("pglease ui: no randomness: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	return hex.EncodeToString(b)
}

// start records a new session and returns its identifier.
func (st *sessionStore) start(s uiSession, ttl time.Duration) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := st.now()
	for id, old := range st.byID {
		if !now.Before(old.expires) {
			delete(st.byID, id)
		}
	}
	if len(st.byID) >= maxSessions {
		var first string
		for id, old := range st.byID {
			if first == "" || old.expires.Before(st.byID[first].expires) {
				first = id
			}
		}
		delete(st.byID, first)
	}
	s.expires = now.Add(ttl)
	id := randomID()
	st.byID[id] = &s
	return id
}

// get returns a copy of the live session id of the kind asked for.
func (st *sessionStore) get(id string, write bool) (uiSession, bool) {
	if len(id) != 64 {
		return uiSession{}, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.byID[id]
	if !ok || s.write != write {
		return uiSession{}, false
	}
	if !st.now().Before(s.expires) {
		delete(st.byID, id)
		return uiSession{}, false
	}
	return *s, true
}

// end ends session id.
func (st *sessionStore) end(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.byID, id)
}

// setNotice sets the notice that the next page of read session id shows.
func (st *sessionStore) setNotice(id, notice string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s, ok := st.byID[id]; ok && !s.write {
		s.notice = notice
	}
}

// takeNotice returns the notice of read session id and clears it.
func (st *sessionStore) takeNotice(id string) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.byID[id]
	if !ok || s.write {
		return ""
	}
	n := s.notice
	s.notice = ""
	return n
}

// cookieValue returns the value of the request's cookie name ("" without).
func cookieValue(r *http.Request, name string) string {
	c, err := r.Cookie(name)
	if err != nil {
		return ""
	}
	return c.Value
}

// readSession returns the identifier of the request's live read session.
func (s *uiServer) readSession(r *http.Request) (string, bool) {
	id := cookieValue(r, accessCookie)
	_, ok := s.sessions.get(id, false)
	return id, ok
}

// writeSession returns the request's live write session: signed in.
func (s *uiServer) writeSession(r *http.Request) (uiSession, bool) {
	if !s.allowWrites {
		return uiSession{}, false
	}
	return s.sessions.get(cookieValue(r, writeCookie), true)
}

// validCSRF reports whether the form's anti-forgery field is the one of
// the write session.
func validCSRF(ws uiSession, r *http.Request) bool {
	return ws.csrf != "" && subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(ws.csrf)) == 1
}

// startSession starts a session and sets its cookie: it expires with
// the session.
func (s *uiServer) startSession(w http.ResponseWriter, cookie string, sess uiSession, ttl time.Duration) string {
	id := s.sessions.start(sess, ttl)
	http.SetCookie(w, &http.Cookie{Name: cookie, Value: id, Path: "/", MaxAge: int(ttl / time.Second), HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	return id
}

// clearCookie tells the browser to forget a cookie.
func clearCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// consolePaths are the pages a redirect after opening the console may
// lead to: nothing else, so that the console's address cannot send the
// browser to another site.
var consolePaths = map[string]bool{"/": true, "/group": true, "/topics": true, "/topic": true, "/message": true, "/signin": true}

// consolePath returns p when it is a page of the console, else "/".
func consolePath(p string) string {
	if consolePaths[p] {
		return p
	}
	return "/"
}
