// Package redisproc starts, kills and restarts local redis-server processes on loopback ports, for the load-test lab.
package redisproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binary is the redis-server program Start runs, looked up on PATH when it
// holds no slash.
const Binary = "redis-server"

const (
	// startTimeout bounds how long a server may take to answer PING, within
	// the caller's context.
	startTimeout = 10 * time.Second
	// pollEvery is how often a starting server is probed.
	pollEvery = 5 * time.Millisecond
	// bindAttempts is how many times a start is retried when the chosen port
	// turns out to be taken.
	bindAttempts = 8
)

// errAddrInUse reports a server that exited because its port was taken.
var errAddrInUse = errors.New("redisproc: address in use")

// Server is one redis-server process listening on 127.0.0.1 with
// persistence off: a restarted server is empty. Its methods are safe for
// concurrent use.
type Server struct {
	// addr is "127.0.0.1:<port>"; it stays the same across Restart.
	addr string
	bin  string
	args []string
	// dir is the server's working directory, made by StartWith and removed
	// by Stop.
	dir string

	mu sync.Mutex
	// proc is the running process; nil after Kill or Stop.
	proc *process
	// stopped is set by Stop; a stopped server cannot be restarted.
	stopped bool
}

// process is one run of redis-server.
type process struct {
	cmd *exec.Cmd
	// exited is closed once the process has exited and been reaped.
	exited chan struct{}
	log    *syncBuffer
}

// syncBuffer is a bytes.Buffer that the process's output copier and the
// starter may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		return len(p), nil // keep the start of the log, which says why a start failed
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Options says how StartWith runs a server. A nil *Options runs the same
// server as Start.
type Options struct {
	// Args are extra redis-server arguments, passed after the ones Start
	// always passes, so they may override them; nil adds none. A relative
	// path in them lies in the server's working directory, which keeps its
	// files across Restart: "--cluster-config-file", "nodes.conf".
	Args []string
	// ClusterBus, when set, picks a port whose cluster bus port, port+10000,
	// is also free, as a server run with "--cluster-enabled", "yes" needs.
	// When false any free port will do.
	ClusterBus bool
	// Conf, when not empty, is written to redis.conf in the server's working
	// directory, which is given to redis-server as its config file (its
	// first argument), before the ones Start always passes. A Sentinel needs one,
	// which it rewrites: Conf "sentinel monitor <name> <ip> <port> <quorum>"
	// with Args "--sentinel".
	Conf string
}

// Start runs `redis-server --port <free> --bind 127.0.0.1 --save ""
// --appendonly no --dir <temporary directory>` and waits until it answers
// PING. The caller must Stop it; on Linux the kernel also kills it if this
// process dies first.
func Start(ctx context.Context) (*Server, error) {
	return StartWith(ctx, nil)
}

// StartWith is Start with the config file, extra arguments and port choice
// of o. It does
// not keep o.
func StartWith(ctx context.Context, o *Options) (*Server, error) {
	if o == nil {
		o = &Options{}
	}
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("redisproc: %s is not on PATH (install it, e.g. apt-get install redis-server): %w", Binary, err)
	}
	pick := freePort
	if o.ClusterBus {
		pick = func() (int, error) { return freeClusterPort(freePort) }
	}
	for range bindAttempts {
		var port int
		if port, err = pick(); err != nil {
			break
		}
		// A fresh directory for each attempt, so that a server which
		// failed to bind leaves no files (such as a cluster config) to
		// the next one.
		var dir string
		if dir, err = os.MkdirTemp("", "herd-redis-"); err != nil {
			break
		}
		var conf []string
		if o.Conf != "" {
			path := filepath.Join(dir, "redis.conf")
			if err = os.WriteFile(path, []byte(o.Conf), 0o600); err != nil {
				_ = os.RemoveAll(dir)
				break
			}
			conf = []string{path}
		}
		s := &Server{
			addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:  bin,
			dir:  dir,
			args: append(append(conf,
				"--port", strconv.Itoa(port),
				"--bind", "127.0.0.1",
				"--save", "",
				"--appendonly", "no",
				"--dir", dir,
				"--daemonize", "no",
				"--logfile", "",
			), o.Args...),
		}
		if err = s.start(ctx); err == nil {
			return s, nil
		}
		_ = os.RemoveAll(dir)
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, fmt.Errorf("redisproc: start %s: %w", Binary, err)
}

// Addr returns the server's address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return s.addr }

// Running reports whether the server process is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Kill stops the server with SIGKILL, as a crash would, and waits until it
// has exited. Killing a server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
}

// Restart starts the server again on the same port, killing it first if it
// is running, and waits until it answers PING. It starts empty.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("redisproc: restart %s: server stopped", s.addr)
	}
	s.kill()
	var err error
	// The port was ours a moment ago, but another process may take it
	// meanwhile: retry a few times in case it lets go.
	for range bindAttempts {
		if err = s.start(ctx); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("redisproc: restart %s: %w", s.addr, err)
	}
	return nil
}

// Pause freezes the server with SIGSTOP: the kernel still accepts
// connections but nothing is answered, as with a server stuck in a long
// pause. Kill, Restart and Stop work on a paused server.
func (s *Server) Pause() error { return s.signal("pause", syscall.SIGSTOP) }

// Resume lets a paused server run again with SIGCONT.
func (s *Server) Resume() error { return s.signal("resume", syscall.SIGCONT) }

func (s *Server) signal(verb string, sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redisproc: %s %s: server not running", verb, s.addr)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redisproc: %s %s: %w", verb, s.addr, err)
	}
	return nil
}

// Stop kills the server and removes its working directory. It may be called
// more than once.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
	if s.stopped {
		return nil
	}
	s.stopped = true
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("redisproc: %w", err)
	}
	return nil
}

// start runs the server and waits until it answers PING. s.mu is held or s
// is not yet shared.
func (s *Server) start(ctx context.Context) error {
	p := &process{
		cmd:    exec.Command(s.bin, s.args...),
		exited: make(chan struct{}),
		log:    &syncBuffer{},
	}
	p.cmd.Dir = s.dir
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{}
	killWithParent(p.cmd.SysProcAttr)
	if err := p.cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if reply, err := s.ping(ctx); err == nil && reply == "+PONG" {
			s.proc = p
			return nil
		}
		select {
		case <-p.exited:
			out := p.log.String()
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("%w: %s", errAddrInUse, s.addr)
			}
			return fmt.Errorf("%s exited at start:\n%s", s.bin, out)
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("no answer to PING on %s: %w\n%s", s.addr, ctx.Err(), p.log.String())
		case <-tick.C:
		}
	}
}

// kill kills the running process, if any, and waits for it. s.mu is held.
func (s *Server) kill() {
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-s.proc.exited
	s.proc = nil
}

// ping sends PING on a new connection and returns the first reply line.
func (s *Server) ping(ctx context.Context) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSuffix(line, "\r\n"), err
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freeClusterPort returns a port from pick whose cluster bus port,
// port+10000, was also free a moment ago.
func freeClusterPort(pick func() (int, error)) (int, error) {
	for range 100 {
		port, err := pick()
		if err != nil {
			return 0, err
		}
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port, nil
	}
	return 0, errors.New("no free port whose cluster bus port is also free")
}

// killWithParent asks the kernel to kill the server when this process dies,
// so that a crashed lab leaves no server behind. Only Linux has the setting
// (SysProcAttr.Pdeathsig); elsewhere Stop alone kills the server.
func killWithParent(a *syscall.SysProcAttr) {
	if f := reflect.ValueOf(a).Elem().FieldByName("Pdeathsig"); f.IsValid() && f.CanSet() {
		f.Set(reflect.ValueOf(syscall.SIGKILL))
	}
}
