// Package mysqltest gives tests a throwaway MariaDB database: a uniquely
// named database created on the server under test and dropped in cleanup;
// and, for tests that crash or restart the server, a mariadbd of their own
// (StartServer). It fails the test (never skips) when the server is
// unreachable or cannot be started.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Addr is the server under test: $IDEM_MYSQL_ADDR or 127.0.0.1:3306
// (user root, no password).
func Addr() string {
	if a := os.Getenv("IDEM_MYSQL_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:3306"
}

// DSN is a go-sql-driver/mysql DSN for user root at addr, database db.
func DSN(addr, db string) string {
	c := mysql.NewConfig()
	c.User = "root"
	c.Net = "tcp"
	c.Addr = addr
	c.DBName = db
	c.Timeout = 5 * time.Second
	return c.FormatDSN()
}

// NewDB creates a database named idem_t_<random> and returns its name and
// a pool on it; cleanup closes the pool and drops the database.
func NewDB(t testing.TB) (string, *sql.DB) {
	t.Helper()
	admin, err := sql.Open("mysql", DSN(Addr(), ""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("MariaDB at %s unreachable or refusing: %v", Addr(), err)
	}
	db, err := sql.Open("mysql", DSN(Addr(), name))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	t.Cleanup(func() {
		db.Close()
		a, err := sql.Open("mysql", DSN(Addr(), ""))
		if err != nil {
			t.Error(err)
			return
		}
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := a.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name, db
}
