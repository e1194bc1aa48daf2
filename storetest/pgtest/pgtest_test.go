package pgtest_test

import (
	"net"
	"net/url"
	"testing"

	"github.com/herdcache/herd/storetest/pgtest"
)

// TestStart starts a server: its DSN names a loopback address that accepts
// connections while the test runs, and refuses them once the test has
// ended and its cleanup stopped the server.
func TestStart(t *testing.T) {
	var host string
	t.Run("server", func(t *testing.T) {
		dsn := pgtest.Start(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if u.Scheme != "postgres" || u.User.Username() != "postgres" {
			t.Errorf("DSN %q, want postgres://postgres@...", dsn)
		}
		host = u.Host
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatalf("dialling %s while the server runs: %v", host, err)
		}
		c.Close()
	})
	if host == "" {
		return // the subtest failed or was skipped
	}
	if c, err := net.Dial("tcp", host); err == nil {
		c.Close()
		t.Errorf("%s accepts connections after the test that started its server ended", host)
	}
}
