package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// client is one raw HTTP/1.1 connection to a server.
type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, proxyDeadline)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(proxyDeadline))
	return &client{c, bufio.NewReader(c)}
}

// send writes a GET of path.
func (c *client) send(t *testing.T, path string) {
	t.Helper()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
}

// answer reads an answer and reports whether the server keeps the
// connection open past it.
func (c *client) answer(t *testing.T, path string) (keepAlive bool) {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	return !resp.Close
}

// closed waits until the server closes c.
func (c *client) closed(t *testing.T) {
	t.Helper()
	if _, err := c.r.ReadByte(); err != io.EOF {
		t.Fatalf("read on a connection the server should close: %v; want EOF", err)
	}
}

// TestConnLimit serves on a real listener limited to 2 connections, with
// a handler that holds each request until its gate opens: a third
// connection waits unserved while two are open. Then the server keeps
// no connection open past its answer, so the first, once answered, is
// closed and the third is served; once a connection is accepted below the
// limit, keep-alives are back. Idle connections give way at once to one
// that waits.
func TestConnLimit(t *testing.T) {
	var mu sync.Mutex
	gates := map[string]chan struct{}{}
	gate := func(path string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[path] == nil {
			gates[path] = make(chan struct{})
		}
		return gates[path]
	}
	entered := make(chan string, 10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Path
		<-gate(r.URL.Path)
		io.WriteString(w, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lim := newServer(h, ln, 2)
	waiting := make(chan struct{}, 10)
	lim.(*limitListener).waiting = func() { waiting <- struct{}{} }
	idle := make(chan struct{}, 10)
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle <- struct{}{}
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	expect := func(want string) {
		t.Helper()
		select {
		case p := <-entered:
			if p != want {
				t.Fatalf("the handler got %s; want %s", p, want)
			}
		case <-time.After(proxyDeadline):
			t.Fatalf("%s not served within %v", want, proxyDeadline)
		}
	}

	c1, c2 := dial(t, addr), dial(t, addr)
	c1.send(t, "/1")
	expect("/1")
	c2.send(t, "/2")
	expect("/2")
	c3 := dial(t, addr)
	c3.send(t, "/3")
	select {
	case <-waiting:
	case p := <-entered:
		t.Fatalf("%s served while 2 connections are open; want it to wait", p)
	case <-time.After(proxyDeadline):
		t.Fatalf("the third connection did not wait within %v", proxyDeadline)
	}
	select {
	case p := <-entered:
		t.Fatalf("%s served while it waits for a slot", p)
	default:
	}

	close(gate("/1"))
	if c1.answer(t, "/1") {
		t.Error("/1 answered with keep-alive while a connection waits; want Connection: close")
	}
	c1.closed(t)
	expect("/3") // the slot /1 left
	close(gate("/3"))
	close(gate("/2"))
	if c3.answer(t, "/3") || c2.answer(t, "/2") {
		t.Error("an answer kept its connection open while the listener was full")
	}
	c3.closed(t)
	c2.closed(t)

	// Below the limit again: keep-alives are back.
	c4 := dial(t, addr)
	close(gate("/4"))
	c4.send(t, "/4")
	expect("/4")
	if !c4.answer(t, "/4") {
		t.Error("/4 answered with Connection: close below the limit; want keep-alive")
	}
	c5 := dial(t, addr)
	close(gate("/5"))
	c5.send(t, "/5")
	expect("/5")
	if !c5.answer(t, "/5") {
		t.Error("/5 answered with Connection: close with a slot taken but none waiting; want keep-alive")
	}
	for range 2 {
		select {
		case <-idle:
		case <-time.After(proxyDeadline):
			t.Fatalf("/4 and /5 not idle within %v", proxyDeadline)
		}
	}
	// Both slots held by idle connections: one that waits closes them.
	c6 := dial(t, addr)
	close(gate("/6"))
	c6.send(t, "/6")
	expect("/6")
	c6.answer(t, "/6")
	c4.closed(t)
	c5.closed(t)
}
