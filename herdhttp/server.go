package herdhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A Server serves a Handler over HTTP/1.1 connections, answering the
// requests that are plain cache hits on each connection's own loop, with
// no net/http server in between, and handing every other connection to
// Fallback.
//
// A connection is read by the loop one request head at a time. A GET or
// HEAD over HTTP/1.1 of an origin-form target, with one valid Host,
// fields of plain bytes, and no body, Expect, Upgrade, Pragma or
// Connection but keep-alive, that the Handler answers from memory (the
// requests Handler.ServeHTTP answers on its hit path: fresh, selected by
// the request, with no fetch of its key running here, or 304 to a
// conditional one) is answered by the loop with the fields and body that
// ServeHTTP under a net/http server gives, Date and a sniffed
// Content-Type included. The first request of a connection that is
// anything else, or whose head is longer than the loop's 4 KiB buffer
// (or than Fallback's MaxHeaderBytes), passes, with the bytes read of it
// and after the answers before it are written, to Fallback, which
// serves the connection from then on: through its own Handler, which
// should wrap this Server's Handler, with every bound and hook it has.
// The loop applies Fallback's IdleTimeout (its ReadTimeout when that is
// zero) between requests and ReadHeaderTimeout (ReadTimeout) within a
// head, and answers pipelined requests in order.
//
// A Server saves a net/http server's costs per request, which are most
// of a hit's: its request parsing into maps, its response writer, a read
// in the background and deadlines set for every request. On two cores,
// with wrk over 64 keep-alive connections to herd proxy, hits took 19.6
// µs of CPU each instead of about 28, and their throughput rose from
// 0.85–0.88× nginx's proxy_cache and 1.0× Varnish's to 1.18× and 1.31×
// (bench/http/hit.sh).
type Server struct {
	// Handler answers the hits. It is required.
	Handler *Handler
	// Fallback serves the connections the loop hands over. It is
	// required; its Handler serves them, and Serve starts and ends it.
	Fallback *http.Server
	// Admit, when set, is called before each hit is answered: ok false
	// hands the connection to Fallback instead, at that request, and
	// release is called once the answer is written. It lets a bound on
	// the requests in flight, kept by Fallback's Handler, count hits too.
	Admit func() (release func(), ok bool)

	keepAlivesOff atomic.Bool
	shutdown      atomic.Bool

	mu    sync.Mutex
	ln    net.Listener
	conns map[*hitConn]struct{}
	hand  *handoff
}

// maxHead bounds the request head the loop reads when Fallback sets no
// MaxHeaderBytes: net/http's default, 1 MiB.
const maxHead = http.DefaultMaxHeaderBytes

// Serve accepts connections on ln and serves them until Shutdown or an
// error of ln, which it returns (http.ErrServerClosed after Shutdown).
// It starts Fallback on a listener of the connections the loop hands
// over.
func (s *Server) Serve(ln net.Listener) error {
	if s.Handler == nil || s.Fallback == nil {
		return errors.New("herdhttp: Server needs a Handler and a Fallback")
	}
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.ln = ln
	s.conns = make(map[*hitConn]struct{})
	s.hand = newHandoff(ln.Addr())
	s.mu.Unlock()
	fallback := make(chan error, 1)
	go func() { fallback <- s.Fallback.Serve(s.hand) }()
	var err error
	var pause time.Duration
	for {
		var c net.Conn
		c, err = ln.Accept()
		if ne, ok := err.(interface{ Temporary() bool }); ok && ne.Temporary() && !s.shutdown.Load() {
			// Out of file descriptors and the like: wait and accept
			// again, as net/http does.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			time.Sleep(pause)
			continue
		}
		if err != nil {
			break
		}
		pause = 0
		hc := s.track(c)
		if hc == nil {
			c.Close()
			break
		}
		go s.serve(hc)
	}
	if s.shutdown.Load() {
		return http.ErrServerClosed
	}
	_ = s.hand.Close()
	return errors.Join(err, <-fallback)
}

// Shutdown stops the Server as http.Server's Shutdown does: it closes
// the listener, closes the loop's idle connections and those that finish
// their answer, shuts Fallback down, and waits, until ctx ends, for the
// loop's connections to close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdown.Store(true)
	s.mu.Lock()
	var lerr error
	if s.ln != nil {
		lerr = s.ln.Close()
	}
	for hc := range s.conns {
		hc.closeIfIdle()
	}
	hand := s.hand
	s.mu.Unlock()
	var ferr error
	if hand != nil {
		_ = hand.Close()
		ferr = s.Fallback.Shutdown(ctx)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		for hc := range s.conns {
			hc.closeIfIdle()
		}
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return errors.Join(lerr, ferr, ctx.Err())
		case <-tick.C:
		}
	}
	if errors.Is(lerr, net.ErrClosed) {
		lerr = nil
	}
	return errors.Join(lerr, ferr)
}

// SetKeepAlivesEnabled is http.Server's: off, each answer of the loop
// closes its connection and idle connections are closed; Fallback's is
// set too.
func (s *Server) SetKeepAlivesEnabled(v bool) {
	s.keepAlivesOff.Store(!v)
	s.Fallback.SetKeepAlivesEnabled(v)
	if v {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for hc := range s.conns {
		hc.closeIfIdle()
	}
}

// track registers c as a connection of the loop; nil after Shutdown.
func (s *Server) track(c net.Conn) *hitConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		return nil
	}
	hc := &hitConn{c: c}
	s.conns[hc] = struct{}{}
	return hc
}

// untrack forgets hc, closed or handed over.
func (s *Server) untrack(hc *hitConn) {
	s.mu.Lock()
	delete(s.conns, hc)
	s.mu.Unlock()
}

// hitConn is a connection on the loop, and whether it waits for a request
// (idle) or has been closed.
type hitConn struct {
	c      net.Conn
	mu     sync.Mutex
	idle   bool
	closed bool
}

// setIdle marks hc idle or busy; false when it has been closed.
func (hc *hitConn) setIdle(idle bool) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.idle = idle
	return !hc.closed
}

// closeIfIdle closes hc if it waits for a request.
func (hc *hitConn) closeIfIdle() {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.idle && !hc.closed {
		hc.closed = true
		_ = hc.c.Close()
	}
}

// timeouts returns the loop's bounds from Fallback's: the idle time
// between requests, the time a head may take, and the longest head.
func (s *Server) timeouts() (idle, head time.Duration, max int) {
	f := s.Fallback
	idle, head = f.IdleTimeout, f.ReadHeaderTimeout
	if idle <= 0 {
		idle = f.ReadTimeout
	}
	if head <= 0 {
		head = f.ReadTimeout
	}
	max = f.MaxHeaderBytes
	if max <= 0 {
		max = maxHead
	}
	return idle, head, max
}

// serve is the loop of one connection.
func (s *Server) serve(hc *hitConn) {
	c := hc.c
	handed := false
	defer func() {
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			logf := log.Printf
			if s.Fallback.ErrorLog != nil {
				logf = s.Fallback.ErrorLog.Printf
			}
			logf("herdhttp: panic serving %v: %v", c.RemoteAddr(), p)
		}
		s.untrack(hc)
		if !handed {
			hc.mu.Lock()
			hc.closed = true
			hc.mu.Unlock()
			_ = c.Close()
		}
	}()
	idle, headTimeout, limit := s.timeouts()
	br := bufio.NewReaderSize(c, 4<<10)
	bw := bufio.NewWriterSize(c, 4<<10)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), http.LocalAddrContextKey, c.LocalAddr()))
	defer cancel()
	ctx = context.WithValue(ctx, http.ServerContextKey, s.Fallback)
	cs := connState{remote: c.RemoteAddr().String(), base: new(http.Request).WithContext(ctx), w: hitWriter{bw: bw}}
	for answered := false; ; answered = true {
		if br.Buffered() == 0 {
			// Idle between requests, not before the first (whose bytes may
			// be on their way), as net/http counts it.
			if !hc.setIdle(answered) {
				return
			}
			if s.shutdown.Load() || answered && s.keepAlivesOff.Load() {
				return
			}
			setDeadline(c, idle)
			if _, err := br.Peek(1); err != nil {
				return
			}
			if !hc.setIdle(false) {
				return
			}
		}
		head, err := readHead(c, br, bw, headTimeout, limit)
		if err != nil && !errors.Is(err, errHeadTooLong) {
			return
		}
		var req *http.Request
		if err == nil {
			req = cs.parse(head)
		}
		release := func() {}
		ok := req != nil
		if ok && s.Admit != nil {
			if release, ok = s.Admit(); !ok {
				release = func() {}
			}
		}
		closing := s.keepAlivesOff.Load() || s.shutdown.Load()
		if ok {
			ok = cs.hit(s, req, closing)
			if !ok {
				release()
			}
		}
		if !ok {
			if bw.Flush() != nil {
				return
			}
			_ = c.SetDeadline(time.Time{})
			handed = s.hand.give(&replayConn{Conn: c, r: br})
			return
		}
		_, _ = br.Discard(len(head))
		err = cs.w.finish()
		release()
		if err == nil && (br.Buffered() == 0 || closing) {
			err = bw.Flush()
		}
		if err != nil {
			return
		}
		if closing {
			closeWrite(c)
			return
		}
	}
}

// rstAvoidance is how long a connection closed after an answer waits,
// its write side shut, before it closes: net/http's delay, so that a
// request the client sent meanwhile does not make the kernel reset the
// connection before the client has read the answer.
const rstAvoidance = 500 * time.Millisecond

// closeWrite shuts c's write side, when it can, and waits rstAvoidance,
// as net/http does before it closes a connection after an answer.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		time.Sleep(rstAvoidance)
	}
}

// setDeadline sets c's read deadline d from now, or none when d is zero.
func setDeadline(c net.Conn, d time.Duration) {
	if d > 0 {
		_ = c.SetReadDeadline(time.Now().Add(d))
	} else {
		_ = c.SetReadDeadline(time.Time{})
	}
}

// errHeadTooLong is readHead's error for a head longer than its bound or
// than br's buffer.
var errHeadTooLong = errors.New("herdhttp: request head too long for the hit loop")

// readHead returns the next request head buffered in br, from its first
// byte through the empty line that ends it, reading more within timeout
// once bw's answers are flushed; errHeadTooLong when the head is longer
// than limit or than br's buffer. The head stays buffered.
func readHead(c net.Conn, br *bufio.Reader, bw *bufio.Writer, timeout time.Duration, limit int) ([]byte, error) {
	from := 0
	waited := false
	for {
		buf, _ := br.Peek(br.Buffered())
		if i := headEnd(buf, from); i > 0 {
			return buf[:i], nil
		}
		if len(buf) >= limit || len(buf) >= br.Size() {
			return nil, errHeadTooLong
		}
		from = max(len(buf)-3, 0)
		if !waited {
			if err := bw.Flush(); err != nil {
				return nil, err
			}
			setDeadline(c, timeout)
			waited = true
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

// headEnd returns the length of the head at the start of buf, through
// the empty line that ends it ("\n\n" or "\n\r\n", as net/http reads
// lines), searching from from; 0 when buf holds no complete head.
func headEnd(buf []byte, from int) int {
	for i := from; i < len(buf); i++ {
		if buf[i] != '\n' || i == 0 {
			continue
		}
		switch {
		case buf[i-1] == '\n':
			return i + 1
		case buf[i-1] == '\r' && i >= 2 && buf[i-2] == '\n':
			return i + 1
		}
	}
	return 0
}

// connState is what the loop keeps across a connection's requests.
type connState struct {
	remote string
	// base is an empty request with the connection's context, which each
	// request's is copied from.
	base *http.Request
	w    hitWriter
}

// parse parses head, as net/http's server would, into a request the loop
// may try to answer: a GET or HEAD over HTTP/1.1 of an origin-form
// target, with one valid Host and fields of plain bytes, and no body,
// Expect, Upgrade, Pragma or Connection but keep-alive. It returns nil
// for any other head, which goes to net/http, whatever it is.
func (cs *connState) parse(head []byte) *http.Request {
	line, rest, _ := bytes.Cut(head, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	var method string
	switch {
	case bytes.HasPrefix(line, []byte("GET ")):
		method, line = http.MethodGet, line[4:]
	case bytes.HasPrefix(line, []byte("HEAD ")):
		method, line = http.MethodHead, line[5:]
	default:
		return nil
	}
	target, ok := bytes.CutSuffix(line, []byte(" HTTP/1.1"))
	if !ok || len(target) == 0 || target[0] != '/' || !plain(target, false) {
		return nil
	}
	uri := string(target)
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil
	}
	h := make(http.Header, 8)
	host := ""
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !token(line[:colon]) {
			return nil // an obs-fold line, a name that is not a token: net/http's to judge
		}
		value := bytes.Trim(line[colon+1:], " \t")
		if !plain(value, true) {
			return nil
		}
		name := fieldName(line[:colon])
		switch name {
		case "Host":
			if host != "" || !validHost(string(value)) {
				return nil
			}
			host = string(value)
			continue
		case "Content-Length":
			if string(value) != "0" || h[name] != nil { // net/http folds repeated ones
				return nil
			}
		case "Connection":
			if !strings.EqualFold(string(value), "keep-alive") {
				return nil
			}
		case "Transfer-Encoding", "Expect", "Upgrade", "Pragma":
			return nil
		}
		h[name] = append(h[name], string(value))
	}
	if host == "" {
		return nil
	}
	req := new(http.Request)
	*req = *cs.base
	req.Method, req.URL, req.RequestURI, req.Host, req.Header = method, u, uri, host, h
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	req.Body, req.RemoteAddr = http.NoBody, cs.remote
	return req
}

// fieldName returns the canonical form of the field name b, without an
// allocation for the common names already in it.
func fieldName(b []byte) string {
	if n, ok := commonFields[string(b)]; ok {
		return n
	}
	return textproto.CanonicalMIMEHeaderKey(string(b))
}

// commonFields are field names requests often carry, canonical.
var commonFields = func() map[string]string {
	m := make(map[string]string)
	for _, n := range []string{"Host", "User-Agent", "Accept", "Accept-Encoding", "Accept-Language", "Connection",
		"Cache-Control", "If-None-Match", "If-Modified-Since", "Cookie", "Referer", "Authorization", "Content-Length",
		"Origin", "X-Forwarded-For", "X-Forwarded-Proto", "X-Request-Id", "Sec-Fetch-Mode", "Sec-Fetch-Site", "Sec-Fetch-Dest"} {
		m[n] = n
	}
	return m
}()

// token reports whether b is an HTTP token (RFC 9110 §5.6.2).
func token(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// plain reports whether b holds visible ASCII bytes only, and spaces and
// tabs too when spaces.
func plain(b []byte, spaces bool) bool {
	for _, c := range b {
		if c > ' ' && c < 0x7f || spaces && (c == ' ' || c == '\t') {
			continue
		}
		return false
	}
	return true
}

// validHost reports whether h is a Host value the loop takes: non-empty,
// of the bytes of a host name, an IPv4 or bracketed IPv6 address and a
// port. Any other goes to net/http, which checks it its own way.
func validHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_':
		default:
			return false
		}
	}
	return true
}

// hit answers req on the loop when the Handler answers it from memory.
// The answer says Connection: close when closing.
func (cs *connState) hit(s *Server, req *http.Request, closing bool) bool {
	cs.w.reset(req.Method == http.MethodHead, closing)
	done, _ := s.Handler.e.serveHit(&cs.w, req)
	return done
}

// hitWriter is the http.ResponseWriter of the loop's hits: it writes the
// answer as net/http's server writes it (status line, the header's fields
// in order, Date and a sniffed Content-Type where it adds them, the body
// unless the request was HEAD or the status has none).
type hitWriter struct {
	bw     *bufio.Writer
	h      http.Header
	status int
	head   bool // the request was HEAD
	close  bool // the connection closes after the answer
	wrote  bool // the status line and fields are written
	err    error
}

func (w *hitWriter) reset(head, close bool) {
	if w.h == nil {
		w.h = make(http.Header)
	} else {
		clear(w.h)
	}
	w.status, w.head, w.close, w.wrote, w.err = 0, head, close, false, nil
}

func (w *hitWriter) Header() http.Header { return w.h }

func (w *hitWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *hitWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.writeHead(p)
	}
	if w.head {
		return len(p), nil // as net/http eats them
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.bw.Write(p)
	w.err = err
	return n, err
}

// finish writes the head if nothing wrote it.
func (w *hitWriter) finish() error {
	if !w.wrote {
		w.writeHead(nil)
	}
	return w.err
}

// writeHead writes the status line and the fields, p being the first
// bytes of the body.
func (w *hitWriter) writeHead(p []byte) {
	w.wrote = true
	if w.status == 0 {
		w.status = http.StatusOK
	}
	h := w.h
	if bodyAllowed(w.status) {
		if _, typed := h["Content-Type"]; !typed && h.Get("Content-Encoding") == "" && len(p) > 0 {
			h["Content-Type"] = []string{http.DetectContentType(p)}
		}
	} else {
		for _, k := range suppressed(w.status) {
			delete(h, k)
		}
	}
	if _, ok := h["Date"]; !ok {
		h["Date"] = []string{httpNow()}
	}
	if w.close {
		h["Connection"] = []string{"close"}
	}
	delete(h, "Transfer-Encoding") // the hits have a Content-Length, or no body
	bw := w.bw
	bw.WriteString("HTTP/1.1 ")
	var num [3]byte
	bw.Write(strconv.AppendInt(num[:0], int64(w.status), 10))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(w.status))
	bw.WriteString("\r\n")
	if err := h.Write(bw); err != nil {
		w.err = err
		return
	}
	_, w.err = bw.WriteString("\r\n")
}

// bodyAllowed reports whether a response of status may have a body.
func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// suppressed returns the fields net/http drops from a response of a
// status without a body.
func suppressed(status int) []string {
	if status == http.StatusNotModified {
		return []string{"Content-Type", "Content-Length", "Transfer-Encoding"}
	}
	return []string{"Content-Length", "Transfer-Encoding"}
}

// httpDate holds the current second in http.TimeFormat, made once a
// second.
var httpDate struct {
	mu   sync.Mutex
	unix int64
	v    atomic.Pointer[string]
}

// httpNow returns the current time in http.TimeFormat.
func httpNow() string {
	now := time.Now()
	if p := httpDate.v.Load(); p != nil && httpDate.unix == now.Unix() {
		return *p
	}
	httpDate.mu.Lock()
	defer httpDate.mu.Unlock()
	s := now.UTC().Format(http.TimeFormat)
	httpDate.unix = now.Unix()
	httpDate.v.Store(&s)
	return s
}

// handoff is the listener Fallback serves: the connections the loop
// hands over.
type handoff struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	addr  net.Addr
}

func newHandoff(addr net.Addr) *handoff {
	return &handoff{conns: make(chan net.Conn), done: make(chan struct{}), addr: addr}
}

// give hands c to Fallback; false once the listener is closed.
func (h *handoff) give(c net.Conn) bool {
	select {
	case h.conns <- c:
		return true
	case <-h.done:
		return false
	}
}

func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoff) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

// replayConn is a connection handed over with bytes the loop read of it
// and did not answer: they are read first.
type replayConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.r != nil {
		if c.r.Buffered() > 0 {
			return c.r.Read(p)
		}
		c.r = nil
	}
	return c.Conn.Read(p)
}
