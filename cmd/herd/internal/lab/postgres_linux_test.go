package lab

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
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

// TestSlowOriginPostgres runs slow-origin against a throwaway PostgreSQL:
// it ends within its bound (three rungs one after the other, each its run
// and a load timeout), every rung's calls reach the database, and the
// static limit at the default, which lets far more calls in than the
// capacity, finds the database slower by the backends PostgreSQL counts
// itself: its p99 while overloaded is several times that of the static
// limit tuned to the capacity.
func TestSlowOriginPostgres(t *testing.T) {
	dsn := startPostgres(t)
	o := Quick()
	o.Scenarios = []string{slowScenario}
	o.SlowScale = 0
	o.PostgresDSN = dsn
	bound := 3*(slowDuration(&o)+slowLoadTimeout(&o)) + 30*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	s, err := RunSuite(ctx, o)
	if err != nil {
		t.Fatalf("after %v (bound %v): %v", time.Since(s.Started), bound, err)
	}
	if len(s.Runs) != len(SlowRungs) {
		t.Fatalf("%d runs, want %d", len(s.Runs), len(SlowRungs))
	}
	for _, r := range s.Runs {
		if r.OriginCalls == 0 {
			t.Errorf("%s: no database call", r.Layer)
		}
	}
	def, tuned := s.Runs[0].Extra["db_p99_overload_ms"], s.Runs[1].Extra["db_p99_overload_ms"]
	if def < 3*tuned {
		t.Errorf("database p99 while overloaded: static-default %.0fms, want at least 3× static-tuned's %.0fms", def, tuned)
	}
	t.Logf("database p99 while overloaded: static-default %.0fms, static-tuned %.0fms, adaptive %.0fms",
		def, tuned, s.Runs[2].Extra["db_p99_overload_ms"])
}

// startTimeout bounds how long initdb, a server's start and its stop may
// take on a busy machine.
const startTimeout = 30 * time.Second

// startPostgres initialises a throwaway PostgreSQL cluster in a temporary
// directory and runs it on a free loopback port, without fsync; it returns
// a DSN for its superuser, postgres, whom it trusts without a password. The
// server is stopped (immediate shutdown) and its directory removed when
// the test ends. PostgreSQL refuses to run as root, so under root both
// initdb and the server run as the OS user postgres. Without initdb the
// test fails under CI=true and is skipped elsewhere.
func startPostgres(t *testing.T) string {
	t.Helper()
	bin, err := postgresBin()
	if err != nil {
		msg := fmt.Sprintf("initdb not found (%v); this test starts a real server: install it, e.g. apt-get install postgresql", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "herd-lab-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, and no OS user postgres to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")

	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data,
		"--username=postgres", "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
	initdb.Dir, initdb.SysProcAttr = dir, attr
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}

	port := freePort(t)
	log := &serverLog{ready: make(chan struct{})}
	pg := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	pg.Dir, pg.SysProcAttr = dir, attr
	pg.Stdout, pg.Stderr = log, log
	pg.WaitDelay = startTimeout // backends that outlive the postmaster hold its stderr
	if err := pg.Start(); err != nil {
		t.Fatalf("postgres: %v", err)
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
		case <-time.After(startTimeout):
			_ = pg.Process.Kill()
			<-exited
		}
	})
	select {
	case <-log.ready:
	case <-exited:
		t.Fatalf("postgres exited at start:\n%s", log)
	case <-ctx.Done():
		t.Fatalf("postgres not ready within %v:\n%s", startTimeout, log)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// postgresBin returns the directory that holds initdb and postgres: that
// of initdb on PATH (symlinks followed), or else the newest
// /usr/lib/postgresql/*/bin, where Debian puts them.
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
func freePort(t *testing.T) int {
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
