package herdhttp_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"
)

// pipeNet is an in-memory network for tests inside testing/synctest:
// servers listen on names, and clients dial them over net.Pipe, so that
// real net/http runs on both sides with the bubble's fake clock.
type pipeNet struct {
	mu        sync.Mutex
	listeners map[string]*pipeListener
}

func newPipeNet() *pipeNet { return &pipeNet{listeners: map[string]*pipeListener{}} }

// serve runs h on a new address of n until the test ends, and returns its
// base URL.
func (n *pipeNet) serve(t *testing.T, name string, h http.Handler) *url.URL {
	t.Helper()
	l := &pipeListener{addr: name + ":80", conns: make(chan net.Conn), done: make(chan struct{})}
	n.mu.Lock()
	n.listeners[l.addr] = l
	n.mu.Unlock()
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		srv.Close()
	})
	return &url.URL{Scheme: "http", Host: l.addr}
}

func (n *pipeNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: errors.New("connection refused")}
	}
	c1, c2 := net.Pipe()
	select {
	case l.conns <- c2:
		return c1, nil
	case <-l.done:
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: errors.New("connection refused")}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// down makes name refuse connections from now on.
func (n *pipeNet) down(name string) {
	n.mu.Lock()
	l := n.listeners[name+":80"]
	delete(n.listeners, name+":80")
	n.mu.Unlock()
	if l != nil {
		l.kill()
	}
}

// transport is a client transport on n; it is closed when the test ends.
func (n *pipeNet) transport(t *testing.T) *http.Transport {
	tr := &http.Transport{DialContext: n.dial, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func (n *pipeNet) client(t *testing.T) *http.Client {
	return &http.Client{Transport: n.transport(t)}
}

type pipeListener struct {
	addr  string
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu       sync.Mutex
	accepted []net.Conn
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		l.mu.Lock()
		l.accepted = append(l.accepted, c)
		l.mu.Unlock()
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; kill also drops the connections accepted.
func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) kill() {
	l.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.accepted {
		c.Close()
	}
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.addr) }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
