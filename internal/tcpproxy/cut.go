package tcpproxy

import (
	"encoding/binary"
	"io"
	"net"
)

// CutAfter makes the proxy drop the replies of transactions that ended:
// it reads the messages of the PostgreSQL protocol that the server sends,
// hands the command tag of each CommandComplete to f, and when f returns
// true closes that connection at the next ReadyForQuery instead of
// forwarding it. The server has then ended the transaction (committed an
// implicit one, or run the COMMIT that f was shown) and the client never
// learns it: the failure of a commit whose reply was lost. What the
// server sent before the ReadyForQuery is forwarded. f runs in the
// proxy's goroutines, one per connection, concurrently; nil stops
// cutting. It applies to the connections accepted from now on, and
// assumes a connection without TLS (sslmode=disable).
func (p *Proxy) CutAfter(f func(tag string) bool) {
	if f == nil {
		p.cut.Store(nil)
		return
	}
	p.cut.Store(&f)
}

// replies returns the server side of a link as the link reads it: s
// itself, or, when CutAfter is set, s read through a cutter.
func (p *Proxy) replies(s net.Conn) net.Conn {
	f := p.cut.Load()
	if f == nil {
		return s
	}
	return &cutter{Conn: s, cut: *f}
}

// cutter is the server side of a connection whose messages are followed:
// Read returns what the server sent up to the ReadyForQuery where the
// connection is cut, then io.EOF, which ends the link. A message's header
// is held back until it is whole, so that a ReadyForQuery split across
// reads is cut whole too.
type cutter struct {
	net.Conn
	cut func(tag string) bool

	head  [5]byte // the type and length of the message being read
	headN int     // bytes of head read
	left  int     // bytes of the current message's body still to come
	tag   []byte  // the body of a CommandComplete being read
	armed bool    // a CommandComplete was cut: cut at the next ReadyForQuery

	buf  []byte // what one read of the server got
	out  []byte // followed bytes not returned yet
	stop bool   // the cut was reached: out, then io.EOF
	err  error  // the server side's read error, returned after out
}

// Read implements net.Conn.
func (c *cutter) Read(b []byte) (int, error) {
	for len(c.out) == 0 {
		if c.stop {
			return 0, io.EOF
		}
		if c.err != nil {
			return 0, c.err
		}
		if len(c.buf) < len(b) {
			c.buf = make([]byte, len(b))
		}
		n, err := c.Conn.Read(c.buf[:len(b)])
		c.err = err
		c.out = c.out[:0]
		c.follow(c.buf[:n])
	}
	n := copy(b, c.out)
	c.out = c.out[n:]
	return n, nil
}

// follow reads p as the next bytes of the server's messages and appends
// to out what the client may have.
func (c *cutter) follow(p []byte) {
	for i := 0; i < len(p) && !c.stop; {
		if c.left > 0 { // inside a body
			k := min(c.left, len(p)-i)
			if c.head[0] == 'C' {
				c.tag = append(c.tag, p[i:i+k]...)
			}
			c.out = append(c.out, p[i:i+k]...)
			i += k
			c.left -= k
			if c.left == 0 && c.head[0] == 'C' {
				tag := string(c.tag)
				if len(tag) > 0 && tag[len(tag)-1] == 0 {
					tag = tag[:len(tag)-1]
				}
				c.tag = c.tag[:0]
				if c.cut(tag) {
					c.armed = true
				}
			}
			continue
		}
		c.head[c.headN] = p[i]
		c.headN++
		i++
		if c.headN < 5 {
			continue
		}
		c.headN = 0
		c.left = int(binary.BigEndian.Uint32(c.head[1:])) - 4
		if c.head[0] == 'Z' && c.armed {
			// The transaction ended: nothing of this message on.
			c.stop = true
			return
		}
		c.out = append(c.out, c.head[:]...)
	}
}
