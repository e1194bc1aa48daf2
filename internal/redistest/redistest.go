// Package redistest starts real redis-server processes on loopback ports for tests, and stops them when the test ends.
//
// The servers keep nothing on disk (no RDB snapshots, no append-only file), so
// a restarted server is empty. Only Unix-like systems are supported, as with
// redis-server itself.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long a server may take to answer PING, and a
	// cluster to report cluster_state:ok.
	startTimeout = 15 * time.Second
	// pollEvery is how often a starting server or cluster is probed.
	pollEvery = 5 * time.Millisecond
	// bindAttempts is how many free ports are tried before giving up when
	// another process takes the chosen port first.
	bindAttempts = 8
)

// errAddrInUse reports a server that exited because its port was taken.
var errAddrInUse = errors.New("redistest: address in use")

// Node is one redis-server process listening on 127.0.0.1. Its methods must
// be called from the test's goroutine, since they may end the test.
type Node struct {
	// Addr is the server's address, "127.0.0.1:<port>"; it stays the same
	// across Restart.
	Addr string

	t    testing.TB
	bin  string
	args []string

	mu sync.Mutex
	// proc is the running server; nil after Kill.
	proc *process
}

// process is one run of redis-server.
type process struct {
	cmd *exec.Cmd
	// exited is closed once the process has exited and been reaped.
	exited chan struct{}
	// log receives the server's standard output and error.
	log *syncBuffer
}

// syncBuffer is a bytes.Buffer that the process's output copier and the
// test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Server starts a redis-server on a free loopback port, with persistence off
// and its working directory in t.TempDir(), and waits until it answers PING.
// The server is killed when the test ends, whether it passed or not.
//
// Without redis-server on PATH the test fails with an install hint, or is
// skipped under -short.
func Server(t testing.TB) *Node {
	t.Helper()
	bin := requireBinary(t, "redis-server", "redis-server", testing.Short())
	return startNode(t, bin, t.TempDir(), freePort, nil)
}

// ClusterNodes is a Redis Cluster of three masters on loopback ports, each
// holding a third of the hash slots, without replicas.
type ClusterNodes struct {
	// Nodes are the masters, in the order they were given to
	// redis-cli --cluster create.
	Nodes []*Node

	t testing.TB
}

// Cluster starts three redis-server processes in cluster mode, joins them
// with redis-cli --cluster create and waits until every node reports
// cluster_state:ok. The nodes are killed when the test ends.
//
// Without redis-server or redis-cli on PATH the test fails with an install
// hint, or is skipped under -short.
func Cluster(t testing.TB) *ClusterNodes {
	t.Helper()
	bin := requireBinary(t, "redis-server", "redis-server", testing.Short())
	cli := requireBinary(t, "redis-cli", "redis-tools", testing.Short())
	c := &ClusterNodes{t: t}
	for range 3 {
		dir := t.TempDir()
		c.Nodes = append(c.Nodes, startNode(t, bin, dir, freeClusterPort, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", dir + "/nodes.conf",
			"--cluster-node-timeout", "5000",
		}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for _, n := range c.Nodes {
		for {
			info, err := n.do(ctx, "CLUSTER INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: cluster node %s not ok within %v: %q, %v", n.Addr, startTimeout, info, err)
			case <-tick.C:
			}
		}
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *ClusterNodes) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a cluster client of the nodes that honours context
// deadlines (ContextTimeoutEnabled). It is closed when the test ends.
func (c *ClusterNodes) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		ContextTimeoutEnabled: true,
	})
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Client returns a client of the node that honours context deadlines
// (ContextTimeoutEnabled). It is closed when the test ends.
func (n *Node) Client() *redis.Client {
	cl := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true})
	n.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Kill stops the server with SIGKILL, as a crash would, and waits until it
// has exited. Killing a stopped server does nothing.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kill()
}

// Restart starts the server again on the same port, killing it first if it
// is running, and waits until it answers PING. It starts empty.
func (n *Node) Restart() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kill()
	var err error
	// The port was ours a moment ago, but another process may take it
	// meanwhile: retry a few times in case it lets go.
	for range bindAttempts {
		if err = n.start(); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		n.t.Fatalf("redistest: restart %s: %v", n.Addr, err)
	}
}

// Pause freezes the server with SIGSTOP: connections are accepted by the
// kernel but nothing is answered, as with a server stuck in a long pause.
func (n *Node) Pause() { n.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again with SIGCONT.
func (n *Node) Resume() { n.signal(syscall.SIGCONT) }

func (n *Node) signal(sig syscall.Signal) {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		n.t.Fatalf("redistest: signal %v to %s: server not running", sig, n.Addr)
	}
	if err := n.proc.cmd.Process.Signal(sig); err != nil {
		n.t.Fatalf("redistest: signal %v to %s: %v", sig, n.Addr, err)
	}
}

// startNode starts a server on a port from pick with the extra arguments,
// trying other ports while the chosen one turns out to be taken, and
// registers its cleanup.
func startNode(t testing.TB, bin, dir string, pick func() (int, error), extra []string) *Node {
	t.Helper()
	var err error
	for range bindAttempts {
		var port int
		if port, err = pick(); err != nil {
			break
		}
		n := &Node{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			t:    t,
			bin:  bin,
			args: append([]string{
				"--port", strconv.Itoa(port),
				"--bind", "127.0.0.1",
				"--save", "",
				"--appendonly", "no",
				"--dir", dir,
				"--daemonize", "no",
				"--logfile", "",
			}, extra...),
		}
		if err = n.start(); err == nil {
			t.Cleanup(n.Kill)
			return n
		}
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	t.Fatalf("redistest: start redis-server: %v", err)
	return nil
}

// start runs the server and waits until it answers PING. n.mu is held or n
// is not yet shared.
func (n *Node) start() error {
	p := &process{
		cmd:    exec.Command(n.bin, n.args...),
		exited: make(chan struct{}),
		log:    &syncBuffer{},
	}
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

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if reply, err := n.do(ctx, "PING"); err == nil && reply == "PONG" {
			n.proc = p
			return nil
		}
		select {
		case <-p.exited:
			out := p.log.String()
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("%w: %s", errAddrInUse, n.Addr)
			}
			return fmt.Errorf("redis-server %s exited at start:\n%s", strings.Join(n.args, " "), out)
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("redis-server on %s did not answer PING within %v:\n%s", n.Addr, startTimeout, p.log.String())
		case <-tick.C:
		}
	}
}

// kill kills the running server, if any, and waits for it. n.mu is held.
func (n *Node) kill() {
	if n.proc == nil {
		return
	}
	_ = n.proc.cmd.Process.Kill()
	<-n.proc.exited
	n.proc = nil
}

// do sends one inline command on a new connection and returns the reply: the
// text of a simple or bulk string reply, or an error for an error reply.
// It needs no client, so it works on a node that is still starting.
func (n *Node) do(ctx context.Context, cmd string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", n.Addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "$"):
		size, err := strconv.Atoi(line[1:])
		if err != nil || size < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:size]), nil
	default:
		return "", fmt.Errorf("reply %q", line)
	}
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

// freeClusterPort returns a loopback port that was free a moment ago along
// with its cluster bus port, port+10000.
func freeClusterPort() (int, error) {
	for range 100 {
		port, err := freePort()
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

// requireBinary returns the path of the named program, or ends the test:
// skipped under short, failed otherwise, with a hint to install pkg.
func requireBinary(t testing.TB, name, pkg string, short bool) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("redistest: %s is not on PATH (%v); these tests start real Redis servers: install it, e.g. apt-get install %s", name, err, pkg)
	if short {
		t.Skip(msg)
	}
	t.Fatal(msg)
	return ""
}

// killWithParent asks the kernel to kill the server when the test process
// dies, so that a test binary killed by -timeout leaves no server behind.
// Only Linux has the setting (SysProcAttr.Pdeathsig); elsewhere the servers
// are killed by the tests' cleanups alone.
func killWithParent(a *syscall.SysProcAttr) {
	if f := reflect.ValueOf(a).Elem().FieldByName("Pdeathsig"); f.IsValid() && f.CanSet() {
		f.Set(reflect.ValueOf(syscall.SIGKILL))
	}
}
