// Command ticketd runs the example ticket service (package tickets) as its
// own process, so that the agent can be killed while the service lives on:
//
//	go run ./examples/agent/ticketd -addr 127.0.0.1:8765 -db /tmp/tickets.json
//	curl -s http://127.0.0.1:8765/tickets
//
// It honours Idempotency-Key: a POST repeated with the same key files no
// second ticket. With -accept-delay 5s it answers 202 Accepted and shows
// the ticket only 5 s later, the way a queue-backed service does.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/runstate/runstate/examples/agent/tickets"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8765", "listen address (keep it on 127.0.0.1)")
	db := flag.String("db", "", "JSON file that keeps the tickets across restarts (empty: memory only)")
	delay := flag.Duration("accept-delay", 0, "answer 202 Accepted and file the ticket this much later")
	flag.Parse()

	srv, err := tickets.NewServer(*db)
	if err != nil {
		log.Fatal(err)
	}
	srv.AcceptDelay = *delay
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	hs := &http.Server{Handler: logRequests(srv), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("ticketd listening on http://%s (tickets: %s)\n", ln.Addr(), orMemory(*db))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut)
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func orMemory(db string) string {
	if db == "" {
		return "in memory"
	}
	return db
}

// logRequests prints one line per request, so the demo shows each POST.
func logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rw, r)
		key := r.Header.Get("Idempotency-Key")
		if key != "" {
			key = " Idempotency-Key=" + key
		}
		log.Printf("%s %s -> %d%s", r.Method, r.URL.RequestURI(), rw.status, key)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}
