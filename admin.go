package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// pinger is what readiness needs of the store.
type pinger interface{ Ping(context.Context) error }

// admin serves /healthz and /readyz on the admin listener.
type admin struct {
	mux      *http.ServeMux
	store    pinger
	draining atomic.Bool
}

func newAdmin(store pinger) *admin {
	a := &admin{mux: http.NewServeMux(), store: store}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	a.mux.HandleFunc("GET /readyz", a.ready)
	return a
}

func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// ready is false while shutting down or when the store cannot be written.
func (a *admin) ready(w http.ResponseWriter, r *http.Request) {
	if a.draining.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.store.Ping(ctx); err != nil {
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(strings.ToUpper(s)))
	return l, err
}
