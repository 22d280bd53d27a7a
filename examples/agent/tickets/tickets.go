// Package tickets is a small ticket service and its client, the receiving
// system of examples/agent's side effect. Like Stripe's API it honours an
// Idempotency-Key header: a POST repeated with the same key creates no
// second ticket and answers with the first one; the same key with another
// request is refused (422).
//
// HTTP API:
//
//	POST /tickets                    {"title": ..., "body": ...}, header Idempotency-Key (required)
//	                                 201 the ticket; 200 the same ticket again for a known key;
//	                                 202 accepted, visible later (Server.AcceptDelay); 422 key reused
//	GET  /tickets?idempotency_key=K  200 the ticket filed with key K; 404 none (yet)
//	GET  /tickets                    200 every visible ticket
//
// The service keeps its tickets in memory and, when given a path, in a JSON
// file rewritten atomically after each change, so that it survives a
// restart as a real service would.
package tickets

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Ticket is one filed ticket.
type Ticket struct {
	ID      string    `json:"id"`
	Key     string    `json:"idempotency_key"`
	Title   string    `json:"title"`
	Body    string    `json:"body"`
	Created time.Time `json:"created"`
	// Visible is when the ticket shows in GETs: Created, or later when the
	// service accepted it for later processing (202).
	Visible time.Time `json:"visible"`

	request string // hash of the request that created it
}

// NewTicket is the request to file a ticket.
type NewTicket struct {
	Title string `json:"title"`
	Body  string `json:"body"`
}

// Server is the ticket service. It is safe for concurrent use.
type Server struct {
	// AcceptDelay, when positive, makes POST answer 202 Accepted: the
	// ticket exists but shows in GETs only that much later.
	AcceptDelay time.Duration

	path string

	mu      sync.Mutex
	tickets []*Ticket
	byKey   map[string]*Ticket
	posts   int
}

// stored is the JSON form of the service's file.
type stored struct {
	Tickets []*storedTicket `json:"tickets"`
}

type storedTicket struct {
	Ticket
	Request string `json:"request"`
}

// NewServer returns a service that keeps its tickets in the JSON file at
// path (created when missing; "" keeps them in memory only).
func NewServer(path string) (*Server, error) {
	s := &Server{path: path, byKey: map[string]*Ticket{}}
	if path == "" {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	var st stored
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("tickets: %s: %v", path, err)
	}
	for _, t := range st.Tickets {
		t.request = t.Request
		s.tickets = append(s.tickets, &t.Ticket)
		s.byKey[t.Key] = &t.Ticket
	}
	return s, nil
}

// Tickets returns every ticket the service holds, visible or not.
func (s *Server) Tickets() []Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Ticket, 0, len(s.tickets))
	for _, t := range s.tickets {
		out = append(out, *t)
	}
	return out
}

// Release files every accepted ticket now, ahead of AcceptDelay: they
// show in GETs from here on.
func (s *Server) Release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	for _, t := range s.tickets {
		if now.Before(t.Visible) {
			t.Visible = now
		}
	}
	return s.save()
}

// Posts returns how many POSTs the service answered.
func (s *Server) Posts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posts
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/tickets" {
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodPost:
		s.post(w, r)
	case http.MethodGet:
		s.get(w, r)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (s *Server) post(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "an Idempotency-Key header is required"})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	var req NewTicket
	if err := json.Unmarshal(body, &req); err != nil || req.Title == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want a JSON body with a title"})
		return
	}
	canon, _ := json.Marshal(req)
	sum := sha256.Sum256(canon)
	hash := hex.EncodeToString(sum[:])

	s.mu.Lock()
	defer s.mu.Unlock()
	s.posts++
	if t := s.byKey[key]; t != nil {
		if t.request != hash {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "Idempotency-Key " + key + " was used with another request"})
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		status := http.StatusOK
		if time.Now().Before(t.Visible) {
			status = http.StatusAccepted
		}
		writeJSON(w, status, t)
		return
	}
	now := time.Now().UTC()
	t := &Ticket{ID: fmt.Sprintf("T-%d", len(s.tickets)+1), Key: key, Title: req.Title, Body: req.Body,
		Created: now, Visible: now.Add(s.AcceptDelay), request: hash}
	s.tickets = append(s.tickets, t)
	s.byKey[key] = t
	if err := s.save(); err != nil {
		s.tickets = s.tickets[:len(s.tickets)-1]
		delete(s.byKey, key)
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	if s.AcceptDelay > 0 {
		writeJSON(w, http.StatusAccepted, t)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if key := r.URL.Query().Get("idempotency_key"); key != "" {
		t := s.byKey[key]
		if t == nil || now.Before(t.Visible) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no ticket with that key (yet)"})
			return
		}
		writeJSON(w, http.StatusOK, t)
		return
	}
	list := []*Ticket{}
	for _, t := range s.tickets {
		if !now.Before(t.Visible) {
			list = append(list, t)
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// save writes the tickets to the service's file: a temp file renamed over
// it. The caller holds s.mu.
func (s *Server) save() error {
	if s.path == "" {
		return nil
	}
	var st stored
	for _, t := range s.tickets {
		st.Tickets = append(st.Tickets, &storedTicket{Ticket: *t, Request: t.request})
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(s.path), ".tickets-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), s.path)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ErrAccepted is returned by Client.Create when the service accepted the
// ticket for later processing (202): it will show in Lookup later.
var ErrAccepted = errors.New("tickets: accepted, not filed yet")

// Client talks to a ticket service.
type Client struct {
	URL  string       // base URL, such as http://127.0.0.1:8765
	HTTP *http.Client // nil means one with a 10 s timeout
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// Create files a ticket with the idempotency key key and returns the
// service's answer as JSON. It returns an error wrapping ErrAccepted, with
// the answer, when the service accepted it without filing it yet.
func (c *Client) Create(ctx context.Context, key string, t NewTicket) (json.RawMessage, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/tickets", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		return json.RawMessage(bytes.TrimSpace(data)), nil
	case http.StatusAccepted:
		var t Ticket
		_ = json.Unmarshal(data, &t)
		return json.RawMessage(bytes.TrimSpace(data)), fmt.Errorf("%w: %s will show at %s", ErrAccepted, t.ID, t.Visible.Format(time.RFC3339))
	}
	return nil, fmt.Errorf("tickets: POST %s/tickets: %s: %s", c.URL, resp.Status, bytes.TrimSpace(data))
}

// Lookup returns the ticket filed with key, as JSON, and whether there is
// one.
func (c *Client) Lookup(ctx context.Context, key string) (json.RawMessage, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/tickets?idempotency_key="+url.QueryEscape(key), nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, false, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return json.RawMessage(bytes.TrimSpace(data)), true, nil
	case http.StatusNotFound:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("tickets: GET %s/tickets: %s: %s", c.URL, resp.Status, bytes.TrimSpace(data))
}

// List returns every visible ticket.
func (c *Client) List(ctx context.Context) ([]Ticket, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/tickets", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tickets: GET %s/tickets: %s", c.URL, resp.Status)
	}
	var list []Ticket
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	return list, nil
}
