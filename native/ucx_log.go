// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include <ucs/debug/log_def.h>
#include "ucx_log.h"

// kvx_ucx_log_warn logs msg through UCX's own dispatch, as UCX logs its warnings.
static void kvx_ucx_log_warn(const char *msg) { ucs_warn("%s", msg); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// UCX's log is one per process, so its lines go to one logger: that of the oldest open
// Context whose logger takes warnings. With none (no Context, or only no-op loggers), UCX
// prints them itself, as it would without kvxfer.
//
// The lines come through ucx_log.c's bounded queue: UCX's handler (on whatever thread UCX
// logs from) only copies a line in and wakes the drain goroutine, which logs it; a UCX thread
// never waits on Go or on a logger. A full queue drops lines and counts them, and the drain
// logs the count.
var ucxLog struct {
	sync.Mutex
	wakeFD  int           // the queue's wake pipe, once installed; -1 before
	loggers []*zap.Logger // by age; a Context's is removed when it closes
	wake    *os.File      // the drain goroutine's copy of the wake pipe; nil while no logger
	drained chan struct{} // closed when that goroutine returns
}

// ucxLogDrain serializes draining, so that lines reach the logger in UCX's order.
var ucxLogDrain sync.Mutex

func init() { ucxLog.wakeFD = -1 }

// routeUCXLog sends UCX's log lines to l while the returned func has not been called. A
// logger that drops warnings (zap.NewNop) is not added: UCX then keeps its own stderr lines.
// The returned func first drains what UCX logged until then, so a Context's lines reach its
// logger before Close returns.
func routeUCXLog(l *zap.Logger) (stop func()) {
	if l == nil || !l.Core().Enabled(zap.WarnLevel) {
		return func() {}
	}
	l = l.Named("ucx")
	if err := startUCXLog(l); err != nil {
		l.Warn("UCX's log lines stay on stderr", zap.Error(err))
		return func() {}
	}
	var once sync.Once
	return func() { once.Do(func() { stopUCXLog(l) }) }
}

func startUCXLog(l *zap.Logger) error {
	ucxLog.Lock()
	defer ucxLog.Unlock()
	if ucxLog.wakeFD < 0 {
		fd, err := C.kvx_ucx_log_install()
		if fd < 0 {
			return fmt.Errorf("ucx log queue: %w", err)
		}
		ucxLog.wakeFD = int(fd)
	}
	if len(ucxLog.loggers) == 0 {
		// The goroutine reads a copy of the pipe's read end, so that closing it (when the last
		// logger goes) stops the goroutine and leaves the pipe to the C side.
		fd, err := syscall.Dup(ucxLog.wakeFD)
		if err != nil {
			return fmt.Errorf("ucx log queue: %w", err)
		}
		syscall.CloseOnExec(fd)
		if err := syscall.SetNonblock(fd, true); err != nil {
			_ = syscall.Close(fd)
			return fmt.Errorf("ucx log queue: %w", err)
		}
		ucxLog.wake = os.NewFile(uintptr(fd), "ucx-log-wake")
		ucxLog.drained = make(chan struct{})
		go drainUCXLogOnWake(ucxLog.wake, ucxLog.drained)
		C.kvx_ucx_log_route(1)
	}
	ucxLog.loggers = append(ucxLog.loggers, l)
	return nil
}

func stopUCXLog(l *zap.Logger) {
	flushUCXLog() // what UCX said while l's Context was open, to the oldest logger
	ucxLog.Lock()
	for i, x := range ucxLog.loggers {
		if x == l {
			ucxLog.loggers = append(ucxLog.loggers[:i], ucxLog.loggers[i+1:]...)
			break
		}
	}
	var wake *os.File
	var drained chan struct{}
	if len(ucxLog.loggers) == 0 {
		C.kvx_ucx_log_route(0)
		wake, drained = ucxLog.wake, ucxLog.drained
		ucxLog.wake, ucxLog.drained = nil, nil
	}
	ucxLog.Unlock()
	if wake != nil {
		_ = wake.Close()
		<-drained
		flushUCXLog() // a line queued just before routing stopped: printed as UCX would
	}
}

// drainUCXLogOnWake logs the queue's lines each time the C handler says it is no longer
// empty, until wake is closed.
func drainUCXLogOnWake(wake *os.File, drained chan<- struct{}) {
	defer close(drained)
	buf := make([]byte, 64)
	for {
		if _, err := wake.Read(buf); err != nil {
			return
		}
		flushUCXLog()
	}
}

// flushUCXLog logs every line queued now, then how many the queue dropped, if any.
func flushUCXLog() {
	ucxLogDrain.Lock()
	defer ucxLogDrain.Unlock()
	var line C.kvx_ucx_log_line_t
	for i := 0; i < C.KVX_UCX_LOG_QUEUE && C.kvx_ucx_log_take(&line) == 1; i++ {
		logUCXLine(int(line.level), C.GoString(&line.file[0]), uint(line.line), C.GoString(&line.msg[0]))
	}
	if n := uint64(C.kvx_ucx_log_take_dropped()); n > 0 {
		if l := oldestUCXLogger(); l != nil {
			logSafely(l, zapcore.WarnLevel, "UCX log lines dropped: UCX logged faster than the logger took them",
				zap.Uint64("dropped", n), zap.Int("queue", C.KVX_UCX_LOG_QUEUE))
		}
	}
}

func oldestUCXLogger() *zap.Logger {
	ucxLog.Lock()
	defer ucxLog.Unlock()
	if len(ucxLog.loggers) == 0 {
		return nil
	}
	return ucxLog.loggers[0]
}

// logUCXLine logs one of UCX's lines to the oldest logger; with none left (the line was
// queued just before the last one went), it prints it on stderr as UCX would have.
func logUCXLine(level int, file string, line uint, msg string) {
	l := oldestUCXLogger()
	if l == nil {
		fmt.Fprintf(os.Stderr, "%s:%d UCX %s %s\n", file, line, ucxLevelName(level), msg)
		return
	}
	logSafely(l, ucxZapLevel(level, file, msg), msg,
		zap.String("ucx_level", ucxLevelName(level)), zap.String("at", fmt.Sprintf("%s:%d", file, line)))
}

// logSafely logs and survives a logger's panic (zaptest's, once its test has ended while
// another test's context still makes UCX talk): the drain goroutine must not die of it.
func logSafely(l *zap.Logger, level zapcore.Level, msg string, fields ...zap.Field) {
	defer func() { _ = recover() }()
	if ce := l.Check(level, msg); ce != nil {
		ce.Write(fields...)
	}
}

// ucxPeerGoneLines are the lines UCX logs as ERROR when it cannot reach a peer that went
// away: a refused or reset TCP connection, a dead process's shared memory. UCX returns the
// same failure to kvxfer as a status, which the engine reports itself, naming the peer, so
// these are debug lines, not errors: a peer's death would otherwise fill the logs with them.
var ucxPeerGoneLines = []struct{ file, text string }{
	{"sock.c", "Connection refused"},
	{"sock.c", "Connection reset by peer"},
	{"sock.c", "Broken pipe"},
	{"tcp_ep.c", ""},
	{"tcp_cm.c", ""},
	{"mm_posix.c", "/proc/"},
	{"mm_ep.c", "failed to connect to remote FIFO"},
	{"cma_ep.c", "No such process"},
}

// ucxZapLevel maps a UCX level onto zap's. UCX's ERROR is a warning at most: UCX says ERROR
// of what it returns to kvxfer as a status, which the engine handles and reports.
func ucxZapLevel(level int, file, msg string) zapcore.Level {
	switch level {
	case C.UCS_LOG_LEVEL_ERROR, C.UCS_LOG_LEVEL_WARN:
		for _, g := range ucxPeerGoneLines {
			if file == g.file && strings.Contains(msg, g.text) {
				return zapcore.DebugLevel
			}
		}
		return zapcore.WarnLevel
	case C.UCS_LOG_LEVEL_DIAG, C.UCS_LOG_LEVEL_INFO:
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}

func ucxLevelName(level int) string {
	switch level {
	case C.UCS_LOG_LEVEL_ERROR:
		return "ERROR"
	case C.UCS_LOG_LEVEL_WARN:
		return "WARN"
	case C.UCS_LOG_LEVEL_DIAG:
		return "DIAG"
	case C.UCS_LOG_LEVEL_INFO:
		return "INFO"
	}
	return "DEBUG"
}

// ucxWarnForTest logs msg through UCX's own log dispatch (ucs_warn), as UCX logs a warning.
func ucxWarnForTest(msg string) {
	c := C.CString(msg)
	defer C.free(unsafe.Pointer(c))
	C.kvx_ucx_log_warn(c)
}

// ucxLogQueueForTest is the queue's capacity, for tests.
const ucxLogQueueForTest = C.KVX_UCX_LOG_QUEUE
