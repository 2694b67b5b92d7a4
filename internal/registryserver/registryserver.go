// SPDX-License-Identifier: Apache-2.0

// Package registryserver runs discovery's embedded HTTP registry on a listener of its own: the
// registry kvxbench, the stress harness and the tests start. A serving program mounts
// discovery.Handler on its own mux instead (or passes it to observe.HandlerConfig.Registry).
package registryserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery"
)

// Server is discovery's embedded registry (discovery.Handler) on a listener of its own.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
	once sync.Once
}

// Serve listens on addr ("127.0.0.1:7300"; ":0" for a free port) and serves discovery.Handler until
// Close. The listener is open when Serve returns.
func Serve(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kvxfer/registryserver: listening on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	h := discovery.Handler()
	mux.Handle(discovery.WorkersPath, h)
	mux.Handle(discovery.WorkersPath+"/", h)
	s := &Server{ln: ln, done: make(chan error, 1), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// URL is the target to pass to discovery.Open: "http://" and the address listened on.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server, bounded by ctx. Later calls return nil.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		err = s.srv.Shutdown(ctx)
		if err != nil {
			err = errors.Join(err, s.srv.Close())
		}
		if serveErr := <-s.done; !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
	})
	return err
}
