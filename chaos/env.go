package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem/chaos/internal/netns"
	"github.com/idem-dev/idem/chaos/internal/servers"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
)

// env is what a run owns: its temporary directory, the workers' network
// namespace, and the servers, each started on first use and kept for the
// run's cells (every cell has its own schema, key prefix, stream, topics).
type env struct {
	dir        string
	ns         *netns.NS
	brokerHost string // where workers reach the broker and the ledger
	storeHost  string // where workers reach the store (the proxy listens here)

	mu     sync.Mutex
	pg     *servers.Server
	ledger *pgxpool.Pool // the harness's own pool on the ledger database
	redis  *servers.Server
	maria  *servers.Server
	nats   *servers.Server
	kafka  *kafkaServer
	// streams is the Redis Streams broker: a redis-server of its own, so
	// that a store restart is not a broker restart too.
	streams *servers.Server
	rabbit  *servers.Server // a RabbitMQ node of the run's own
}

const ledgerDB = "chaos"

func newEnv(dir string, useNS bool) (*env, error) {
	e := &env{dir: dir, brokerHost: "127.0.0.1", storeHost: "127.0.0.1"}
	if useNS {
		netns.Sweep()
		ns, err := netns.Create()
		if err != nil {
			return nil, err
		}
		e.ns, e.brokerHost, e.storeHost = ns, ns.BrokerHost, ns.StoreHost
	}
	return e, nil
}

func (e *env) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ledger != nil {
		e.ledger.Close()
	}
	for _, s := range []*servers.Server{e.pg, e.redis, e.maria, e.nats, e.streams, e.rabbit} {
		if s != nil {
			_ = s.Close()
		}
	}
	if e.kafka != nil {
		e.kafka.close()
	}
	if e.ns != nil {
		_ = e.ns.Delete()
	}
}

// postgres is the ledger's (and outbox's) server, also the pg store's.
func (e *env) postgres(ctx context.Context) (*servers.Server, *pgxpool.Pool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pg != nil {
		return e.pg, e.ledger, nil
	}
	listen := "127.0.0.1"
	if e.brokerHost != "127.0.0.1" {
		listen += "," + e.brokerHost
	}
	s, err := servers.StartPostgres(ctx, filepath.Join(e.dir, "postgres"), listen)
	if err != nil {
		return nil, nil, err
	}
	e.pg = s
	admin, err := newPool(ctx, pgURL(s.Addr(), "postgres"), 2)
	if err != nil {
		return nil, nil, err
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+ledgerDB)
	admin.Close()
	if err != nil {
		return nil, nil, err
	}
	e.ledger, err = newPool(ctx, pgURL(s.Addr(), ledgerDB), 16)
	return e.pg, e.ledger, err
}

// pgAddr is the PostgreSQL address as the workers reach it.
func (e *env) pgAddr() string {
	return net.JoinHostPort(e.brokerHost, strconv.Itoa(e.pg.Port))
}

// server starts the run's server *slot on first use (start(ctx, dir,
// host)) and returns it.
func (e *env) server(ctx context.Context, slot **servers.Server, name, host string,
	start func(ctx context.Context, dir, host string) (*servers.Server, error)) (*servers.Server, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if *slot == nil {
		s, err := start(ctx, filepath.Join(e.dir, name), host)
		if err != nil {
			return nil, err
		}
		*slot = s
	}
	return *slot, nil
}

func (e *env) redisServer(ctx context.Context) (*servers.Server, error) {
	return e.server(ctx, &e.redis, "redis", "127.0.0.1", servers.StartRedis)
}

func (e *env) mariadb(ctx context.Context) (*servers.Server, error) {
	return e.server(ctx, &e.maria, "mariadb", "127.0.0.1", servers.StartMariaDB)
}

func (e *env) natsServer(ctx context.Context) (*servers.Server, error) {
	return e.server(ctx, &e.nats, "nats", e.brokerHost, servers.StartNATS)
}

// streamsServer is the Redis Streams broker's redis-server (append-only
// file, appendfsync always: a SIGKILL loses no acknowledged XADD or XACK),
// where the workers reach the broker.
func (e *env) streamsServer(ctx context.Context) (*servers.Server, error) {
	return e.server(ctx, &e.streams, "streams", e.brokerHost, servers.StartRedis)
}

func (e *env) rabbitNode(ctx context.Context) (*servers.Server, error) {
	return e.server(ctx, &e.rabbit, "rabbit", e.brokerHost, servers.StartRabbit)
}

func (e *env) kafkaCluster() (*kafkaServer, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kafka == nil {
		k := &kafkaServer{dir: filepath.Join(e.dir, "kafka"), host: e.brokerHost}
		port, err := servers.FreePort(k.host)
		if err != nil {
			return nil, err
		}
		k.port = port
		if err := k.start(); err != nil {
			return nil, err
		}
		e.kafka = k
	}
	return e.kafka, nil
}

// kafkaServer is kfake in the harness's process, persisted to a directory
// (fsync per batch) so that it can be restarted: the workers, in their own
// processes, reach it over TCP.
type kafkaServer struct {
	dir  string
	host string
	port int

	mu sync.Mutex
	c  *kfake.Cluster
}

func (k *kafkaServer) Addr() string { return net.JoinHostPort(k.host, strconv.Itoa(k.port)) }

func (k *kafkaServer) start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := os.MkdirAll(k.dir, 0o755); err != nil {
		return err
	}
	var (
		c   *kfake.Cluster
		err error
	)
	// The port may still be held for a moment after a close.
	for try := 0; try < 50; try++ {
		c, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(k.port), kfake.DataDir(k.dir), kfake.SyncWrites(),
			kfake.GroupMinSessionTimeout(time.Second),
			kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, k.Addr()) }))
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	k.c = c
	return nil
}

// Crash closes the cluster (connections drop; what it wrote stays).
func (k *kafkaServer) Crash() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		k.c.Close()
		k.c = nil
	}
	return nil
}

func (k *kafkaServer) Start(context.Context) error { return k.start() }

func (k *kafkaServer) close() { _ = k.Crash() }
