package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// errNil is what call returns for a nil reply.
var errNil = errors.New("nil reply")

// client talks to the server at addr, one connection per call, so that it
// follows the server through kills and restarts.
type client string

// call sends one command and returns its reply: a simple or bulk string, an
// integer in decimal, or an array's elements joined by newlines. An error
// reply is an error; a nil reply is errNil. ctx's deadline bounds the call.
func (c client) call(ctx context.Context, args ...string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", string(c))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch kind, rest := line[0], line[1:]; kind {
	case '+', ':':
		return rest, nil
	case '-':
		return "", errors.New(rest)
	case '$', '*':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return "", fmt.Errorf("bad length %q", rest)
		}
		if n < 0 {
			return "", errNil
		}
		if kind == '*' {
			parts := make([]string, n)
			for i := range parts {
				if parts[i], err = readReply(r); err != nil {
					return "", err
				}
			}
			return strings.Join(parts, "\n"), nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unknown reply %q", line)
}

// startServer starts a server as o says, within a context that also bounds
// the rest of the test, and stops it when the test ends.
func startServer(t *testing.T, o *Options) (context.Context, *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := StartWith(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return ctx, s
}

// TestKillRestartStop proves the lifecycle the node-kill scenario relies on:
// a started server answers on a loopback address, Kill makes it unreachable,
// Restart brings it back empty on the same address, and Stop removes it and
// its directory for good.
func TestKillRestartStop(t *testing.T) {
	ctx, s := startServer(t, nil)
	addr := s.Addr()
	if host := addr[:len("127.0.0.1:")]; host != "127.0.0.1:" {
		t.Fatalf("Addr() = %q, want a 127.0.0.1 address", addr)
	}
	c := client(addr)
	if _, err := c.call(ctx, "SET", "k", "v"); err != nil {
		t.Fatalf("SET on a started server: %v", err)
	}

	s.Kill()
	if s.Running() {
		t.Fatal("Running() after Kill")
	}
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	_, err := c.call(pctx, "PING")
	pcancel()
	if err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Kill() // killing a dead server does nothing

	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Fatalf("Addr() after Restart = %q, want %q", s.Addr(), addr)
	}
	if _, err := c.call(ctx, "GET", "k"); !errors.Is(err, errNil) {
		t.Fatalf("GET after Restart: err %v, want a nil reply (a restarted server is empty)", err)
	}

	dir := s.dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s after Stop: %v, want it removed", dir, err)
	}
	if err := s.Restart(ctx); err == nil {
		t.Fatal("Restart after Stop succeeded")
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// TestStartCanceled proves a start bounded by an ended context fails rather
// than hanging, and leaves no directory behind.
func TestStartCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s, err := Start(ctx); err == nil {
		s.Stop()
		t.Fatal("Start with an ended context succeeded")
	}
}

// TestStartWithArgs proves the extra arguments reach the server after the
// fixed ones, that a relative path in them lands in the server's directory,
// and that a cluster-mode server starts on a port whose bus port is usable.
func TestStartWithArgs(t *testing.T) {
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--appendonly", "yes", // overrides the fixed "--appendonly no"
	}
	ctx, s := startServer(t, &Options{Args: args, ClusterBus: true})
	args[1] = "no" // StartWith keeps no reference to the caller's slice
	c := client(s.Addr())
	if got, err := c.call(ctx, "CONFIG", "GET", "appendonly"); err != nil || got != "appendonly\nyes" {
		t.Fatalf("CONFIG GET appendonly = %v, %v; want yes from Options.Args", got, err)
	}
	if info, err := c.call(ctx, "CLUSTER", "INFO"); err != nil || !strings.Contains(info, "cluster_state:") {
		t.Fatalf("CLUSTER INFO = %q, %v; want a cluster-mode server", info, err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "nodes.conf")); err != nil {
		t.Fatalf("cluster config not in the server's directory: %v", err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart with Options.Args: %v", err)
	}
	if _, err := c.call(ctx, "CLUSTER", "INFO"); err != nil {
		t.Fatalf("CLUSTER INFO after Restart: %v; want the arguments given to StartWith kept", err)
	}
}

// TestFreeClusterPort proves a port whose bus port, port+10000, is taken is
// passed over, as is one whose bus port would be past 65535.
func TestFreeClusterPort(t *testing.T) {
	var taken, free int
	for taken == 0 || free == 0 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if p+10000 > 65535 {
			continue
		}
		if taken == 0 {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
			if err != nil {
				continue
			}
			defer l.Close()
			taken = p
			continue
		}
		free = p
	}
	ports := []int{65000, taken, free}
	got, err := freeClusterPort(func() (int, error) {
		p := ports[0]
		ports = ports[1:]
		return p, nil
	})
	if err != nil || got != free {
		t.Fatalf("freeClusterPort = %d, %v; want %d (65000 has no bus port, %d's bus port is taken)", got, err, free, taken)
	}

	boom := errors.New("boom")
	if _, err := freeClusterPort(func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("freeClusterPort with a failing picker: %v, want %v", err, boom)
	}
}

// TestPauseResume proves Pause stops the server answering without closing
// its port, Resume brings it back, and Kill ends a paused server.
func TestPauseResume(t *testing.T) {
	ctx, s := startServer(t, nil)
	c := client(s.Addr())
	if _, err := c.call(ctx, "PING"); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c.call(pctx, "PING")
	pcancel()
	if err == nil {
		t.Fatal("PING answered while paused")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.call(ctx, "PING"); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	s.Kill() // must not hang on a stopped process
	if err := s.Pause(); err == nil {
		t.Fatal("Pause of a killed server succeeded")
	}
	if err := s.Resume(); err == nil {
		t.Fatal("Resume of a killed server succeeded")
	}
}

// TestStartWithConf proves Options.Conf is the server's config file: its
// settings apply, the fixed arguments and Args override it, and a Sentinel,
// which needs a file it can rewrite, starts from it.
func TestStartWithConf(t *testing.T) {
	conf := "maxmemory-policy allkeys-lru\nappendonly yes\n"
	ctx, s := startServer(t, &Options{Conf: conf})
	c := client(s.Addr())
	if got, err := c.call(ctx, "CONFIG", "GET", "maxmemory-policy"); err != nil || got != "maxmemory-policy\nallkeys-lru" {
		t.Fatalf("CONFIG GET maxmemory-policy = %v, %v; want allkeys-lru from Options.Conf", got, err)
	}
	if got, err := c.call(ctx, "CONFIG", "GET", "appendonly"); err != nil || got != "appendonly\nno" {
		t.Fatalf("CONFIG GET appendonly = %v, %v; want the fixed \"--appendonly no\" over Options.Conf", got, err)
	}

	_, sentinel := startServer(t, &Options{
		Conf: "sentinel monitor m " + strings.Replace(s.Addr(), ":", " ", 1) + " 1\n",
		Args: []string{"--sentinel"},
	})
	got, err := client(sentinel.Addr()).call(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m")
	if want := strings.Replace(s.Addr(), ":", "\n", 1); err != nil || got != want {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME m = %q, %v; want %q", got, err, want)
	}
}
