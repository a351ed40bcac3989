package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/httpidem"
)

// serverFlags are the HTTP server settings shared by serve and proxy: a
// timeout on every phase of a connection, a bounded header, and how to shut
// down.
type serverFlags struct {
	addr              string
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	maxHeaderBytes    int
	shutdownTimeout   time.Duration
	drainDelay        time.Duration
	logFormat         string
	logLevel          string
}

// add defines the flags on cmd with environment variables named
// env+"_"+FLAG (IDEM_SERVE_ADDR...).
func (f *serverFlags) add(cmd *cobra.Command, env, defaultAddr string, writeTimeout time.Duration) {
	fs := cmd.Flags()
	fs.StringVar(&f.addr, "addr", defaultAddr, "listen on HOST:PORT")
	fs.DurationVar(&f.readHeaderTimeout, "read-header-timeout", 5*time.Second, "time to read a request's header")
	fs.DurationVar(&f.readTimeout, "read-timeout", 30*time.Second, "time to read a whole request")
	fs.DurationVar(&f.writeTimeout, "write-timeout", writeTimeout, "time from the end of the request header to the end of the answer")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 120*time.Second, "time a keep-alive connection may wait for its next request")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", 64<<10, "largest request header")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM/SIGINT, time the requests in flight have to finish")
	fs.DurationVar(&f.drainDelay, "drain-delay", 0, "on SIGTERM/SIGINT, time /readyz answers 503 before the listener closes (let load balancers notice)")
	fs.StringVar(&f.logFormat, "log-format", "text", "request log format: text or json (on stderr)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error (warn: no per-request lines)")
	for _, name := range []string{"addr", "read-header-timeout", "read-timeout", "write-timeout", "idle-timeout", "max-header-bytes", "shutdown-timeout", "drain-delay", "log-format", "log-level"} {
		bindEnv(fs, name, env+"_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
}

func (f *serverFlags) validate() error {
	if _, _, err := net.SplitHostPort(f.addr); err != nil {
		return usageError("--addr %q: want HOST:PORT: %v", f.addr, err)
	}
	for name, d := range map[string]time.Duration{
		"--read-header-timeout": f.readHeaderTimeout, "--read-timeout": f.readTimeout, "--write-timeout": f.writeTimeout,
		"--idle-timeout": f.idleTimeout, "--shutdown-timeout": f.shutdownTimeout,
	} {
		if d <= 0 {
			return usageError("%s %s: want a positive duration (a server phase without a timeout lets one slow client hold a connection forever)", name, d)
		}
	}
	if f.drainDelay < 0 {
		return usageError("--drain-delay %s < 0", f.drainDelay)
	}
	if f.maxHeaderBytes < 1024 || f.maxHeaderBytes > 16<<20 {
		return usageError("--max-header-bytes %d outside [1024, 16777216]", f.maxHeaderBytes)
	}
	if _, err := f.logger(io.Discard); err != nil {
		return err
	}
	return nil
}

// logger is the slog logger the flags ask for, writing to w.
func (f *serverFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError("--log-format %q: want text or json", f.logFormat)
}

// testHookListening, when set, is told the address the server listens on.
var testHookListening func(net.Addr)

// runServer serves h until ctx is done, then shuts down gracefully: drain
// (make readiness fail), wait drainDelay, stop accepting, let the requests
// in flight finish within shutdownTimeout.
func runServer(ctx context.Context, f serverFlags, h http.Handler, drain func(), log *slog.Logger) error {
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.addr, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: f.readHeaderTimeout,
		ReadTimeout:       f.readTimeout,
		WriteTimeout:      f.writeTimeout,
		IdleTimeout:       f.idleTimeout,
		MaxHeaderBytes:    f.maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	log.Info("listening", "addr", ln.Addr().String())
	if testHookListening != nil {
		testHookListening(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: draining", "drain_delay", f.drainDelay, "shutdown_timeout", f.shutdownTimeout)
	if drain != nil {
		drain()
	}
	if f.drainDelay > 0 {
		time.Sleep(f.drainDelay)
	}
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if sErr := <-served; !errors.Is(sErr, http.ErrServerClosed) && err == nil {
		err = sErr
	}
	if err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: requests still in flight after --shutdown-timeout %s were cut: %w", f.shutdownTimeout, err)
	}
	log.Info("stopped")
	return nil
}

// accessLog logs one line per request handled by h (the proxy's; the API
// logs its own): method, path, status, duration, remote address, and
// whether the answer was a replay. Never a key or a query.
func accessLog(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		level := slog.LevelInfo
		if sw.code >= 500 {
			level = slog.LevelWarn
		}
		if !log.Enabled(r.Context(), level) {
			return
		}
		log.LogAttrs(r.Context(), level, "http request", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.code), slog.Duration("duration", time.Since(start)), slog.String("remote", r.RemoteAddr),
			slog.Bool("replayed", w.Header().Get(httpidem.ReplayHeader) != ""))
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 && code >= 200 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush through.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
