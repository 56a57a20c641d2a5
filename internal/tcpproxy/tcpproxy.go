// Package tcpproxy is a TCP proxy for tests that can freeze the
// connections it forwards: they stay open but nothing goes through any
// more, as with a connection behind a NAT or a proxy that lost it, or a
// peer that vanished without a FIN. The peers see a half-open connection:
// their writes succeed and nothing arrives, for as long as the test likes,
// with no timeout of the kernel to end it.
//
// A test puts a [Proxy] between a client and a server (say, a pgx
// connection and PostgreSQL), calls [Proxy.Freeze] to break the
// connections that exist, and checks that the client notices and
// reconnects: connections accepted after Freeze forward normally.
//
// [StartOptions] with [Options.Delay] makes the proxy a link of some
// latency: each direction of each connection delivers what it reads that
// long after reading it, in order, as a network between two machines
// would (this kernel's traffic control has no delaying qdisc to do it
// below TCP).
//
// It uses nothing but the standard library and is meant for tests only.
package tcpproxy

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds the connection to the target for each accepted
// connection.
const dialTimeout = 10 * time.Second

// bufferSize is the size of the buffer of each direction of a connection.
const bufferSize = 32 << 10

// delayedChunks bounds what a direction of a delayed connection holds
// back: at most that many reads of up to bufferSize bytes each. When it is
// full the proxy stops reading that direction, and TCP's flow control
// slows the sender down.
const delayedChunks = 64

// MaxDelay is the largest [Options.Delay].
const MaxDelay = 10 * time.Second

// Options configures a [Proxy].
type Options struct {
	// Delay, when positive, holds back what each direction of each
	// connection reads for that long before it writes it to the other
	// side: a round trip through the proxy takes at least twice Delay.
	// Bytes arrive complete and in order; each direction holds at most
	// 64 reads of up to 32 KiB at a time. At most [MaxDelay].
	Delay time.Duration
}

// Proxy listens on 127.0.0.1 and forwards each accepted connection to a
// target address. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	delay  time.Duration
	ln     net.Listener
	ctx    context.Context // cancelled by Close: ends dials under way
	cancel context.CancelFunc

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	// held, while not nil, is closed by Release: connections accepted
	// meanwhile wait for it before they dial the target.
	held chan struct{}
	// cut, when set, decides after which replies a connection is cut
	// (see CutAfter).
	cut atomic.Pointer[func(tag string) bool]

	wg sync.WaitGroup // the accept loop and every link's goroutines
}

// link is one accepted connection and its connection to the target.
type link struct {
	client net.Conn
	delay  time.Duration
	done   chan struct{} // closed by close

	mu     sync.Mutex
	server net.Conn // nil until dialled
	ended  bool     // closed: no server may be set any more

	// fwd is held for reading by a goroutine while it writes what it read
	// to the other side, and for writing by Freeze, so that once Freeze
	// returns nothing more is forwarded.
	fwd    sync.RWMutex
	frozen atomic.Bool
}

// Start listens on 127.0.0.1 on a free port and forwards every connection
// it accepts to target (host:port), until [Proxy.Close].
func Start(target string) (*Proxy, error) {
	return StartOptions(target, Options{})
}

// StartOptions is [Start] with options.
func StartOptions(target string, opts Options) (*Proxy, error) {
	if opts.Delay < 0 || opts.Delay > MaxDelay {
		return nil, fmt.Errorf("tcpproxy: Options.Delay must lie between 0 and %s, got %s", MaxDelay, opts.Delay)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		delay:  opts.Delay,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		links:  map[*link]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address the proxy listens on, as host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops forwarding on every connection that exists now, in both
// directions, without closing them: from the time Freeze returns, what
// either peer sends is read and dropped, so its writes succeed and nothing
// arrives. A frozen connection ends only when a peer closes it (the proxy
// then closes the other side too, so that, say, a PostgreSQL backend does
// not outlive its client) or on [Proxy.Close]. Connections accepted after
// Freeze forward normally. Freeze may be called again.
func (p *Proxy) Freeze() {
	for _, l := range p.snapshot() {
		l.freeze()
	}
}

// Unfreeze resumes forwarding on the connections that Freeze froze. What
// was sent while they were frozen is lost: a protocol above sees a gap in
// the stream.
func (p *Proxy) Unfreeze() {
	for _, l := range p.snapshot() {
		l.unfreeze()
	}
}

// Hold makes the connections accepted from now on wait, without dialling
// the target, until [Proxy.Release]: a client that reconnects meanwhile
// finds a server that accepts and says nothing. Connections that exist go
// on as they are. Hold may be called again while held.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release lets the connections that Hold kept waiting dial the target, and
// the ones accepted from now on at once.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// Conns returns the number of connections accepted and not yet ended,
// frozen or not.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to end. It returns the error of closing the listener;
// later calls wait likewise and return nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	// No connection is added from now on.
	p.closed = true
	p.mu.Unlock()

	p.cancel()
	err := p.ln.Close()
	for _, l := range p.snapshot() {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		l := &link{client: c, delay: p.delay, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		held := p.held
		p.mu.Unlock()
		go p.serve(l, held)
	}
}

// serve dials the target for l, once held (when not nil) is closed, and
// forwards both ways until either side ends.
func (p *Proxy) serve(l *link, held <-chan struct{}) {
	defer p.wg.Done()
	defer p.remove(l)

	if held != nil {
		select {
		case <-held:
		case <-p.ctx.Done():
			l.close()
			return
		}
	}

	dialer := net.Dialer{Timeout: dialTimeout}
	s, err := dialer.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		l.close()
		return
	}
	if !l.setServer(s) {
		// Closed meanwhile.
		_ = s.Close()
		return
	}

	var both sync.WaitGroup
	both.Add(1)
	go func() {
		defer both.Done()
		l.pipe(s, l.client)
	}()
	l.pipe(l.client, p.replies(s))
	both.Wait()
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe copies from src to dst, dropping what it reads while l is frozen,
// until either fails; then it closes both sides, which ends the other
// direction too. A peer's end of its stream thus closes the whole
// connection: there are no half-closed connections.
func (l *link) pipe(dst, src net.Conn) {
	if l.delay > 0 {
		l.pipeDelayed(dst, src)
		return
	}
	defer l.close()
	buf := make([]byte, bufferSize)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.forward(dst, buf[:n]) {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward writes b to dst unless l is frozen; it returns false when the
// write failed otherwise than by Freeze.
func (l *link) forward(dst net.Conn, b []byte) bool {
	l.fwd.RLock()
	defer l.fwd.RUnlock()
	var err error
	if !l.frozen.Load() {
		_, err = dst.Write(b)
	}
	// A write that Freeze cut short ended on its deadline: the connection
	// stays open, frozen.
	return err == nil || l.frozen.Load()
}

// chunk is what one read of a delayed direction got, and when it is due
// on the other side.
type chunk struct {
	data []byte
	due  time.Time
}

// pipeDelayed is pipe with l.delay: a goroutine reads src and queues what
// it reads, stamped with the time it is due, and this one writes each
// chunk to dst once it is due. When src ends, what was read is still
// delivered, then both sides are closed; close (Close, or the other
// direction's end) drops what is queued.
func (l *link) pipeDelayed(dst, src net.Conn) {
	queue := make(chan chunk, delayedChunks)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(queue)
		buf := make([]byte, bufferSize)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(l.delay)}
				select {
				case queue <- c:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		l.close() // ends the read under way, if any
		<-read
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if !l.forward(dst, c.data) {
			return
		}
	}
}

func (l *link) freeze() {
	l.frozen.Store(true)
	// Cut short the writes under way (a peer that reads nothing could hold
	// one for ever), then wait for them to end.
	l.setWriteDeadline(time.Unix(1, 0))
	// Taking the lock waits for every write under way to end; none starts
	// while frozen.
	l.fwd.Lock()
	l.fwd.Unlock() //nolint:staticcheck // SA2001: the empty section is the wait

}

func (l *link) unfreeze() {
	l.fwd.Lock()
	defer l.fwd.Unlock()
	if l.frozen.Load() {
		l.setWriteDeadline(time.Time{})
		l.frozen.Store(false)
	}
}

func (l *link) setWriteDeadline(t time.Time) {
	_ = l.client.SetWriteDeadline(t)
	l.mu.Lock()
	s := l.server
	l.mu.Unlock()
	if s != nil {
		_ = s.SetWriteDeadline(t)
	}
}

// setServer records the connection to the target; it returns false when l
// was closed meanwhile.
func (l *link) setServer(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.server = s
	return true
}

// close closes both sides; later calls do nothing.
func (l *link) close() {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended = true
	close(l.done)
	s := l.server
	l.mu.Unlock()
	_ = l.client.Close()
	if s != nil {
		_ = s.Close()
	}
}
