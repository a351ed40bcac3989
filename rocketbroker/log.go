package rocketbroker

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// The client library logs through one process-wide logger (rlog), by
// default logrus on stdout at info level: a line per rebalance, pull
// error and offset update. The adapter replaces it, once, before its
// first client starts, with slogLogger over clientLogger.
var (
	clientLogger   atomic.Pointer[slog.Logger]
	installLogOnce sync.Once
)

// SetClientLogger sends the RocketMQ client library's logs to l (default
// slog.Default(), read when a line is logged): its errors and warnings at
// those levels, its info and debug lines at debug level. The library has
// one logger per process, so this is process-wide.
func SetClientLogger(l *slog.Logger) {
	clientLogger.Store(l)
	installLog()
}

func installLog() {
	installLogOnce.Do(func() { rlog.SetLogger(slogLogger{}) })
}

// slogLogger implements rlog.Logger on slog.
type slogLogger struct{}

func (slogLogger) logger() *slog.Logger {
	if l := clientLogger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

func (s slogLogger) log(level slog.Level, msg string, fields map[string]any) {
	l := s.logger()
	if !l.Enabled(context.Background(), level) {
		return
	}
	args := make([]any, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v := fields[k]
		if e, ok := v.(error); ok {
			v = e.Error()
		} else if st, ok := v.(fmt.Stringer); ok {
			v = st.String()
		}
		args = append(args, k, v)
	}
	l.Log(context.Background(), level, "rocketmq: "+msg, args...)
}

func (s slogLogger) Debug(msg string, fields map[string]any)   { s.log(slog.LevelDebug, msg, fields) }
func (s slogLogger) Info(msg string, fields map[string]any)    { s.log(slog.LevelDebug, msg, fields) }
func (s slogLogger) Warning(msg string, fields map[string]any) { s.log(slog.LevelWarn, msg, fields) }
func (s slogLogger) Error(msg string, fields map[string]any)   { s.log(slog.LevelError, msg, fields) }
func (s slogLogger) Fatal(msg string, fields map[string]any)   { s.log(slog.LevelError, msg, fields) }
func (slogLogger) Level(string)                                {}
func (slogLogger) OutputPath(string) error                     { return nil }
