package mysqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem/mysqlstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverAddr is the MariaDB under test (IDEM_MYSQL_ADDR overrides).
func serverAddr() string {
	if a := os.Getenv("IDEM_MYSQL_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:3306"
}

func dsn(addr, db string) string {
	c := mysql.NewConfig()
	c.User = "root"
	c.Net = "tcp"
	c.Addr = addr
	c.DBName = db
	c.Timeout = 5 * time.Second
	return c.FormatDSN()
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newDB creates a uniquely named database, returns its name and a pool on
// it, and drops it in cleanup. It fails (never skips) when the server is
// unreachable.
func newDB(t testing.TB) (string, *sql.DB) {
	t.Helper()
	admin, err := sql.Open("mysql", dsn(serverAddr(), ""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_t_" + hex.EncodeToString(b[:])
	ctx := testCtx(t)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("MariaDB at %s unreachable or refusing: %v", serverAddr(), err)
	}
	db, err := sql.Open("mysql", dsn(serverAddr(), name))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	t.Cleanup(func() {
		db.Close()
		a, err := sql.Open("mysql", dsn(serverAddr(), ""))
		if err != nil {
			t.Error(err)
			return
		}
		defer a.Close()
		if _, err := a.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name, db
}

// newStore migrates cfg on a fresh database and opens a store on it.
func newStore(t testing.TB, cfg mysqlstore.Config) (*mysqlstore.Store, *sql.DB) {
	t.Helper()
	_, db := newDB(t)
	cfg.DB = db
	if err := mysqlstore.Migrate(testCtx(t), cfg); err != nil {
		t.Fatal(err)
	}
	s, err := mysqlstore.Open(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, db
}

// fakeTB lets examples reuse newDB: it collects cleanups and panics on
// failure.
type fakeTB struct {
	testing.TB
	cleanups []func()
}

func (f *fakeTB) Helper()                   {}
func (f *fakeTB) Cleanup(fn func())         { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (f *fakeTB) Fatalf(s string, a ...any) { panic(fmt.Sprintf(s, a...)) }
func (f *fakeTB) Errorf(s string, a ...any) { panic(fmt.Sprintf(s, a...)) }
func (f *fakeTB) Error(args ...any)         { panic(fmt.Sprint(args...)) }
func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
