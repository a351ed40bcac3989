package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/mysqlstore/mysqltest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serverAddr() string { return mysqltest.Addr() }

func dsn(addr, db string) string { return mysqltest.DSN(addr, db) }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newDB(t testing.TB) (string, *sql.DB) { return mysqltest.NewDB(t) }

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
