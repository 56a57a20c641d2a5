package tcpproxy_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pglease/watermill-pglease/internal/tcpproxy"
)

// message is one message of the PostgreSQL protocol as a server sends it.
func message(kind byte, body string) []byte {
	b := []byte{kind, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// TestCutAfter: a server replies to two statements, each with a
// CommandComplete and a ReadyForQuery, written one byte at a time (the
// proxy must follow messages across reads). Cutting after "INSERT 0 1",
// the client gets the first reply whole, the second's CommandComplete,
// and then the end of the connection instead of its ReadyForQuery.
func TestCutAfter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	first := append(message('C', "SELECT 1\x00"), message('Z', "I")...)
	second := message('C', "INSERT 0 1\x00")
	reply := append(append(append([]byte{}, first...), second...), message('Z', "I")...)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for _, b := range reply {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
		}
		_, _ = io.Copy(io.Discard, c) // until the proxy closes
	}()
	p, err := tcpproxy.Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var tags []string
	p.CutAfter(func(tag string) bool {
		tags = append(tags, tag)
		return tag == "INSERT 0 1"
	})
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	want := append(append([]byte{}, first...), second...)
	if string(got) != string(want) {
		t.Fatalf("client got %q, want %q (the second ReadyForQuery cut)", got, want)
	}
	if len(tags) != 2 || tags[0] != "SELECT 1" || tags[1] != "INSERT 0 1" {
		t.Fatalf("tags seen %q", tags)
	}
}
