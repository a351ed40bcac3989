package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/remotestore"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/kafkabroker"
	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/rabbitbroker"
	"github.com/idem-dev/idem/redisstore"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

func pgURL(addr, db string) string {
	return "postgres://postgres@" + addr + "/" + db + "?sslmode=disable&connect_timeout=5"
}

func newPool(ctx context.Context, url string, max int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = max
	return pgxpool.NewWithConfig(ctx, cfg)
}

func mysqlDSN(addr, db string) string {
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr, c.DBName = "root", "tcp", addr, db
	c.Timeout = 5 * time.Second
	return c.FormatDSN()
}

// storeConn is an open store and what must be closed with it.
type storeConn struct {
	store idem.Store
	pool  *pgxpool.Pool  // pg: the pool the store uses (the tx effect shares it)
	pgs   *pgstore.Store // pg
	db    *sql.DB        // mysql
	close func()
}

// openStore opens spec's store at addr (the proxy's address for workers,
// the server's own for the harness's checks).
func openStore(ctx context.Context, spec Spec, addr string) (*storeConn, error) {
	ss := spec.Store
	switch ss.Kind {
	case "pg":
		pool, err := newPool(ctx, pgURL(addr, ss.DBName), 24)
		if err != nil {
			return nil, err
		}
		st, err := pgstore.New(pgstore.Config{Pool: pool, Schema: ss.Name, Table: "idem_records", Logger: quiet()})
		if err != nil {
			pool.Close()
			return nil, err
		}
		return &storeConn{store: st, pool: pool, pgs: st, close: func() { st.Close(); pool.Close() }}, nil
	case "redis":
		cl := redis.NewClient(&redis.Options{Addr: addr})
		st, err := redisstore.New(ctx, redisstore.Config{Client: cl, Prefix: ss.Name + ":", CloseClient: true, Logger: quiet()})
		if err != nil {
			cl.Close()
			return nil, err
		}
		return &storeConn{store: st, close: func() { st.Close() }}, nil
	case "bolt":
		cl := remotestore.Dial(addr, 10*time.Second)
		return &storeConn{store: cl, close: func() { cl.Close() }}, nil
	case "mysql":
		db, err := sql.Open("mysql", mysqlDSN(addr, ss.DBName))
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(24)
		st, err := mysqlstore.Open(ctx, mysqlstore.Config{DB: db, Table: ss.Name, Logger: quiet()})
		if err != nil {
			db.Close()
			return nil, err
		}
		return &storeConn{store: st, db: db, close: func() { st.Close(); db.Close() }}, nil
	}
	return nil, fmt.Errorf("unknown store %q", ss.Kind)
}

// migrateStore creates the cell's record table (pg, mysql) at addr.
func migrateStore(ctx context.Context, spec Spec, addr string) error {
	ss := spec.Store
	switch ss.Kind {
	case "pg":
		pool, err := newPool(ctx, pgURL(addr, ss.DBName), 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ss.Name); err != nil {
			return err
		}
		return pgstore.Migrate(ctx, pgstore.Config{Pool: pool, Schema: ss.Name, Table: "idem_records"})
	case "mysql":
		db, err := sql.Open("mysql", mysqlDSN(addr, ""))
		if err != nil {
			return err
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+ss.DBName); err != nil {
			return err
		}
		db2, err := sql.Open("mysql", mysqlDSN(addr, ss.DBName))
		if err != nil {
			return err
		}
		defer db2.Close()
		return mysqlstore.Migrate(ctx, mysqlstore.Config{DB: db2, Table: ss.Name})
	}
	return nil
}

func quiet() *slog.Logger { return e2etest.Quiet() }

// brokerConn is a connection to the cell's broker.
type brokerConn struct {
	kind    string
	nc      *nats.Conn
	js      jetstream.JetStream
	rc      *redis.Client // streams
	url     string        // rabbit
	brokers []string
	log     *slog.Logger
	// closers are the subscribers and publishers that must be closed
	// (streams: a subscriber sends its queued acks and hands its pending
	// entries back at Close).
	closers []interface{ Close() error }
}

func openBroker(ctx context.Context, bs BrokerSpec, log *slog.Logger) (*brokerConn, error) {
	b := &brokerConn{kind: bs.Kind, brokers: bs.Brokers, log: log}
	switch bs.Kind {
	case "nats":
		nc, err := nats.Connect(bs.URL, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond),
			nats.RetryOnFailedConnect(true), nats.Timeout(5*time.Second))
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		b.nc, b.js = nc, js
	case "streams":
		b.rc = redis.NewClient(&redis.Options{Addr: bs.URL})
	case "rabbit":
		b.url = bs.URL // each subscriber and publisher has a connection of its own
	case "kafka":
	default:
		return nil, fmt.Errorf("unknown broker %q", bs.Kind)
	}
	return b, nil
}

func (b *brokerConn) subscriber(ctx context.Context, bs BrokerSpec, t Timing) (broker.Subscriber, error) {
	switch b.kind {
	case "streams":
		sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: b.rc, Stream: bs.Topic, Group: bs.Group,
			AckWait: time.Duration(t.AckWait), Logger: b.log})
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, sub)
		return sub, nil
	case "rabbit":
		sub, err := rabbitbroker.NewSubscriber(rabbitSubConfig(bs, t, b.log))
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, sub)
		return sub, nil
	case "nats":
		return natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: b.js, Stream: bs.Stream, Durable: bs.Group,
			FilterSubject: bs.Topic, AckWait: time.Duration(t.AckWait), Logger: b.log})
	}
	return kafkabroker.NewSubscriber(kafkabroker.SubscriberConfig{Brokers: b.brokers, Group: bs.Group,
		Topics: []string{bs.Topic}, SessionTimeout: time.Duration(t.SessionTimeout), RebalanceTimeout: time.Duration(t.RebalanceTimeout),
		Logger: b.log})
}

// publisher: dedup false turns JetStream's Nats-Msg-Id dedup off (the
// producer's duplicates must reach the consumers, as after the window).
func (b *brokerConn) publisher(dedup bool) (broker.Publisher, error) {
	switch b.kind {
	case "streams":
		return streamsbroker.NewPublisher(streamsbroker.PublisherConfig{Client: b.rc, NoDedup: !dedup, Logger: b.log})
	case "rabbit":
		// RabbitMQ has no publish dedup: a relay's re-publish after a
		// crash reaches the consumers like any duplicate.
		p, err := rabbitbroker.NewPublisher(rabbitbroker.PublisherConfig{Conn: rabbitConn(b.url, Timing{}, b.log)})
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, p)
		return p, nil
	case "nats":
		return natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: b.js, NoDedup: !dedup, Logger: b.log})
	}
	return kafkabroker.NewPublisher(kafkabroker.PublisherConfig{Brokers: b.brokers, Logger: b.log})
}

// rabbitConn: the AMQP heartbeat is the timing's ack wait, so a stalled
// consumer's connection is found dead (two silent heartbeats) and its
// deliveries requeued within 2 x AckWait (Timing.redelivery).
func rabbitConn(url string, t Timing, log *slog.Logger) rabbitbroker.Conn {
	return rabbitbroker.Conn{URL: url, Heartbeat: time.Duration(t.AckWait), Reconnect: rabbitbroker.Backoff{Initial: 200 * time.Millisecond, Max: 2 * time.Second}, Logger: log}
}

// rabbitSubConfig is the cell's work queue (a quorum queue, delivery limit
// 20, the adapter's dead-letter exchange and queue for what it terminates)
// bound to the topic on the adapter's default exchange.
func rabbitSubConfig(bs BrokerSpec, t Timing, log *slog.Logger) rabbitbroker.SubscriberConfig {
	return rabbitbroker.SubscriberConfig{Conn: rabbitConn(bs.URL, t, log), Queue: bs.Group, Topics: []string{bs.Topic}}
}

// rabbitPoisonConfig is the queue the consumers' dead letters (published
// to the DLQ topic) land in: a classic durable queue. A quorum queue
// declared seconds before a SIGKILL of this single node was found without
// a leader for good after the restart (RabbitMQ 3.10.8: "leader not
// known"; the consumers held the dead letters they could not publish);
// the harness's own destination need not depend on that.
func rabbitPoisonConfig(bs BrokerSpec, log *slog.Logger) rabbitbroker.SubscriberConfig {
	return rabbitbroker.SubscriberConfig{Conn: rabbitConn(bs.URL, Timing{}, log), Queue: bs.Group + ".poison", Topics: []string{bs.DLQ}, Classic: true}
}

func (b *brokerConn) close() {
	for _, c := range b.closers {
		_ = c.Close()
	}
	if b.nc != nil {
		_ = b.nc.Drain()
	}
	if b.rc != nil {
		_ = b.rc.Close()
	}
}
