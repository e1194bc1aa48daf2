// Package pgtest starts throwaway PostgreSQL servers for tests.
package pgtest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long initdb, a server's start and its stop may
// take on a busy machine.
const StartTimeout = 30 * time.Second

// Options configures a server started by [StartWith].
type Options struct {
	// Settings are server parameters, each name = value given to postgres
	// with -c, after pgtest's own (listen_addresses,
	// unix_socket_directories, fsync, synchronous_commit,
	// full_page_writes), which they may override; for example
	// {"max_connections": "10"}. Nil sets none.
	Settings map[string]string
}

// Start initialises a throwaway PostgreSQL cluster in a temporary directory
// and runs it on a free loopback port, without fsync; it returns a DSN for
// its superuser, postgres, whom it trusts without a password. The server is
// stopped (immediate shutdown) and its directory removed when the test
// ends. PostgreSQL refuses to run as root, so under root both initdb and
// the server run as the OS user postgres. initdb and postgres are found on
// PATH, or else in the newest /usr/lib/postgresql/*/bin, where Debian puts
// them. Without them the test fails under CI=true, where a skipped test
// would pass unseen, and is skipped elsewhere.
func Start(t testing.TB) string {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is [Start] with the server configured by o; a nil o is
// [Start]'s configuration.
func StartWith(t testing.TB, o *Options) string {
	t.Helper()
	if o == nil {
		o = &Options{}
	}
	bin, err := postgresBin()
	if err != nil {
		msg := fmt.Sprintf("pgtest: initdb not found (%v); this test starts a real server: install it, e.g. apt-get install postgresql", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "herd-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	attr := &syscall.SysProcAttr{}
	dieWithParent(attr)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root, and no OS user postgres to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")

	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data,
		"--username=postgres", "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
	initdb.Dir, initdb.SysProcAttr = dir, attr
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}

	port := freePort(t)
	args := []string{"-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
	for _, name := range slices.Sorted(maps.Keys(o.Settings)) {
		args = append(args, "-c", name+"="+o.Settings[name])
	}
	log := &serverLog{ready: make(chan struct{})}
	pg := exec.Command(filepath.Join(bin, "postgres"), args...)
	pg.Dir, pg.SysProcAttr = dir, attr
	pg.Stdout, pg.Stderr = log, log
	pg.WaitDelay = StartTimeout // backends that outlive the postmaster hold its stderr
	if err := pg.Start(); err != nil {
		t.Fatalf("pgtest: postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = pg.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = pg.Process.Signal(syscall.SIGQUIT) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(StartTimeout):
			_ = pg.Process.Kill()
			<-exited
		}
	})
	select {
	case <-log.ready:
	case <-exited:
		t.Fatalf("pgtest: postgres exited at start:\n%s", log)
	case <-ctx.Done():
		t.Fatalf("pgtest: postgres not ready within %v:\n%s", StartTimeout, log)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// postgresBin returns the directory that holds initdb and postgres: that
// of initdb on PATH (symlinks followed), or else the newest
// /usr/lib/postgresql/*/bin.
func postgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(p), nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("no initdb on PATH or under /usr/lib/postgresql/*/bin")
	}
	version := func(p string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(p))), 64)
		return v
	}
	newest := slices.MaxFunc(found, func(a, b string) int { return cmp.Compare(version(a), version(b)) })
	return filepath.Dir(newest), nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serverLog keeps what PostgreSQL logs and closes ready once it says it
// accepts connections.
type serverLog struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	seen  bool // ready is closed
	ready chan struct{}
}

var readyLine = []byte("database system is ready to accept connections")

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if !l.seen && bytes.Contains(l.buf.Bytes(), readyLine) {
		l.seen = true
		close(l.ready)
	}
	return len(p), nil
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
