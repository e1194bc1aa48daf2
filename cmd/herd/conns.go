package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// The server's own bounds on a client connection: how long its request
// header may take, how long it may sit idle between requests, and how
// large the header may be.
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 30 * time.Second
	maxHeaderBytes    = 16 << 10
)

// newServer returns the server of herd proxy for h, and ln limited to
// maxConns open connections (0: no limit). While a connection waits for a
// slot, the server's keep-alives are off, so that idle connections are
// closed and busy ones close after their answer; they are on again once a
// connection is accepted below the limit.
func newServer(h http.Handler, ln net.Listener, maxConns int) (*http.Server, net.Listener) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	if maxConns == 0 {
		return srv, ln
	}
	return srv, newLimitListener(ln, maxConns, srv.SetKeepAlivesEnabled)
}

// proxyServer is what herd proxy serves with: an *http.Server, or a
// *herdhttp.Server in front of one.
type proxyServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
}

// hitServer returns a herdhttp.Server whose loop answers the hits of h
// on each connection (taking a slot of gate, when there is one, for each)
// and hands every connection with any other request to srv; ln's limit,
// when it has one, switches the keep-alives of both.
func hitServer(srv *http.Server, ln net.Listener, h *herdhttp.Handler, gate func() (func(), bool)) *herdhttp.Server {
	hs := &herdhttp.Server{Handler: h, Fallback: srv, Admit: gate}
	if l, ok := ln.(*limitListener); ok {
		l.keepAlives = hs.SetKeepAlivesEnabled
	}
	return hs
}

// limitListener is a net.Listener with at most cap(slots) connections
// open at once. A connection accepted past the limit is held unserved
// until one closes. It is written here rather than taken from
// golang.org/x/net/netutil, which this module does not depend on and
// whose LimitListener cannot say when it is full.
type limitListener struct {
	net.Listener
	slots chan struct{} // one value per open connection
	// keepAlives turns the server's keep-alives on or off. It is called
	// from Accept only, and off closes the server's idle connections,
	// which release their slots (see limitConn.Close), so no lock may be
	// held around it.
	keepAlives func(on bool)
	off        bool // keep-alives are off; touched by Accept only
	closeOnce  sync.Once
	done       chan struct{} // closed by Close

	waiting func() // nil, or called when a connection starts to wait: tests
}

func newLimitListener(ln net.Listener, n int, keepAlives func(on bool)) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), keepAlives: keepAlives, done: make(chan struct{})}
}

// Accept accepts a connection and returns it once a slot is free. It is
// called by one goroutine at a time, as http.Server does.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
		if l.off && len(l.slots) < cap(l.slots) {
			l.off = false
			l.keepAlives(true)
		}
	default:
		if !l.off {
			l.off = true
			l.keepAlives(false)
		}
		if l.waiting != nil {
			l.waiting()
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close closes the listener and ends a wait for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn is a connection that holds a slot of a limitListener until it
// is closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close releases the slot before it closes the connection, so that a
// client that sees its connection end finds the slot free.
func (c *limitConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
