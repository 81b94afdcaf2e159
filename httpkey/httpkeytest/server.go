package httpkeytest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/httpkey"
	"effectively.dev/internal/testserver"
)

// DeclineMarker, anywhere in a request's body, makes the server decline
// the request, as a test card makes a card processor decline a payment: it
// creates nothing and answers 402 (Adyen: 422 with errorCode "010";
// Braintree: an UNPROCESSABLE error in a 200), and the answer is stored
// under the key and replayed, as a vendor's refusal is. A service's test
// puts it in the input it wants declined.
const DeclineMarker = "httpkeytest-decline"

// defaultHorizon is how long the server keeps a key after its first
// request when neither the provider nor [WithHorizon] says otherwise: 24
// hours, a common choice (the draft leaves it to each server).
const defaultHorizon = 24 * time.Hour

// defaultMaxKeyLen is the longest key the server accepts unless the
// provider documents another limit; a longer one gets 400.
const defaultMaxKeyLen = 255

// Option configures a [Server]; see [New]. A nil Option is ignored.
// [As] sets several values at once; options after it change them.
type Option func(*config)

type placement int

const (
	inHeader           placement = iota + 1 // the value as it is
	inStructuredHeader                      // an RFC 8941 String
	inField                                 // a member of a JSON object body
)

// mode is the vendor whose answers the server gives.
type mode int

const (
	ietf mode = iota
	adyen
	paypal
	worldline
	checkout
	gocardless
	mollie
	square
	razorpayx
	braintree
	neutral
)

type config struct {
	mode        mode
	place       placement
	name        string
	field       []string // the key's member path, for inField
	minKeyLen   int
	maxKeyLen   int
	alphabet    string // "" : any key the placement allows
	replayName  string
	replayValue string
	replayStamp bool // the replay header holds the first request's time in ms
	horizon     time.Duration
	inFlight    int  // status while a key's first request is in progress
	reused      int  // status for another payload; 0: replay the stored response
	failsKept   bool // failures are stored under the key (false: only 2xx)
	latency     time.Duration
	now         func() time.Time
	token       string
	unknown     string // As's provider, when the server cannot play it
}

// ietfServer sets the IETF draft's server: the key in the Idempotency-Key
// header as a Structured Field String; 409 while the key's first request
// is in progress; 422 for the key with another payload; failures stored;
// no replay signal; keys kept for [defaultHorizon].
func ietfServer(c *config) {
	c.mode = ietf
	c.place, c.name, c.field = inStructuredHeader, "Idempotency-Key", nil
	c.minKeyLen, c.maxKeyLen, c.alphabet = 1, defaultMaxKeyLen, ""
	c.replayName, c.replayValue, c.replayStamp = "", "", false
	c.horizon = defaultHorizon
	c.inFlight, c.reused = http.StatusConflict, http.StatusUnprocessableEntity
	c.failsKept = true
	c.unknown = ""
}

// vendor starts a vendor's mode from the draft's: the key in header name
// as it is, another payload answered with the stored response (key reuse
// goes unnoticed), which is where vendors that document nothing leave it.
func vendor(c *config, m mode, name string) {
	ietfServer(c)
	c.mode = m
	c.place, c.name = inHeader, name
	c.reused = 0
}

// servers are the providers the server can play, by httpkey.Provider's
// String. Each follows the provider's documentation (see httpkey's
// values); where it says nothing, the server takes the case that is
// hardest on an adapter that claims nothing.
var servers = map[string]func(c *config){
	"IETF":    ietfServer,
	"Neutral": func(c *config) { vendor(c, neutral, "Idempotency-Key") },
	"Adyen": func(c *config) {
		vendor(c, adyen, "Idempotency-Key")
		c.maxKeyLen = 64
		c.horizon = 7 * 24 * time.Hour
		c.inFlight = http.StatusUnprocessableEntity
	},
	"PayPal": func(c *config) {
		vendor(c, paypal, "PayPal-Request-Id")
		c.maxKeyLen = 108
	},
	"Worldline": func(c *config) {
		vendor(c, worldline, "X-GCS-Idempotence-Key")
		c.maxKeyLen = 40
		c.replayName, c.replayStamp = "X-GCS-Idempotence-Request-Timestamp", true
	},
	"Checkout": func(c *config) {
		vendor(c, checkout, "Cko-Idempotency-Key")
		c.failsKept = false
	},
	"GoCardless": func(c *config) { vendor(c, gocardless, "Idempotency-Key") },
	"Mollie": func(c *config) {
		vendor(c, mollie, "Idempotency-Key")
		c.replayName, c.replayValue = "Idempotent-Replayed", "true"
		c.reused = http.StatusBadRequest
	},
	"Square": func(c *config) {
		vendor(c, square, "")
		c.place, c.field = inField, []string{"idempotency_key"}
		c.maxKeyLen = 45
		c.reused = http.StatusBadRequest
	},
	"RazorpayX": func(c *config) {
		vendor(c, razorpayx, "X-Payout-Idempotency")
		c.minKeyLen, c.maxKeyLen = 4, 36
		c.alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _-"
		c.reused = http.StatusBadRequest
	},
	"Braintree": func(c *config) {
		vendor(c, braintree, "")
		c.place, c.field = inField, []string{"variables", "input", "apiRequestKey"}
		c.horizon = 30 * 24 * time.Hour
		c.reused = http.StatusOK // a VALIDATION error, in a 200
	},
}

// As makes the server behave as provider p documents, which is what
// httpkey's effect built with p expects (see each of httpkey's Provider
// values): where the key goes, its length and alphabet, how long it is
// kept, what a request in progress and a reused key get, whether replays
// are marked and failures stored. Where the provider's documentation says
// nothing, the server takes the case that is hardest on an adapter that
// claims nothing (a key repeated with another payload gets the stored
// response: reuse goes unnoticed), and a provider that publishes no
// retention keeps keys for 24 hours (set the one you test with
// [WithHorizon]). In particular:
//
//   - httpkey.IETF, what [New] does without As: the key in the
//     Idempotency-Key header as a Structured Field String; 409 while the
//     key's first request is in progress; 422 for the key with another
//     payload; no replay signal.
//   - httpkey.Neutral: the key in the Idempotency-Key header as it is, at
//     most 255 bytes; no replay signal; reuse unnoticed.
//   - httpkey.Adyen: at most 64 characters, kept 7 days; a request while
//     the key's first one is in progress gets 422 (409 with
//     [WithInFlightStatus]) with errorCode "704" and "transient-error:
//     true"; a declined request ([DeclineMarker]) gets 422 with errorCode
//     "010".
//   - httpkey.PayPal: PayPal-Request-Id, 1 to 108 characters.
//   - httpkey.Worldline: X-GCS-Idempotence-Key, at most 40 characters;
//     every response to a repeat carries
//     X-GCS-Idempotence-Request-Timestamp, the first request's time in
//     milliseconds since the Unix epoch.
//   - httpkey.Checkout: Cko-Idempotency-Key; only a 2xx answer is stored,
//     so a repeat of a request that failed (a 4xx, or a 5xx even after the
//     payment was created: [Server.FailNextAfterCreate]) executes again.
//   - httpkey.GoCardless: a repeat of a finished creation, whatever its
//     payload, gets 409 with {"error": {"type": "invalid_state", "code":
//     409, "errors": [{"reason": "idempotent_creation_conflict", "links":
//     {"conflicting_resource_id": <the object's id>}}], "request_id":
//     ...}}; a repeat while the first request is in progress a plain 409.
//   - httpkey.Mollie: a repeat gets "Idempotent-Replayed: true"; the key
//     with another payload gets 400.
//   - httpkey.Square: the key in the JSON body's idempotency_key, at most
//     45 characters; the key with another payload gets 400 with the error
//     code IDEMPOTENCY_KEY_REUSED.
//   - httpkey.RazorpayX: X-Payout-Idempotency, 4 to 36 characters of
//     letters, digits, space, '-' and '_' (any other key gets 400); another
//     payload gets 400 BAD_REQUEST_ERROR naming the header.
//   - httpkey.Braintree: the key is variables.input.apiRequestKey of the
//     JSON body; kept 30 days; every answer is HTTP 200, a success as
//     {"data": <the object>}, an error as {"errors": [{"message": ...,
//     "extensions": {"errorClass": ...}}]}; a request in progress and the
//     key with another payload get an error of class VALIDATION, a
//     declined request one of class UNPROCESSABLE.
//
// [New] returns an *[effects.ConfigError] for a Provider it cannot play
// (the zero Provider).
func As(p httpkey.Provider) Option {
	name := p.String()
	set, ok := servers[name]
	if !ok {
		return func(c *config) { c.unknown = fmt.Sprintf("%q", name) }
	}
	return set
}

// WithReplayHeader makes the server mark every stored response it replays
// with header name: value (Stripe's "Idempotent-Replayed: true"). Without
// it (the draft's case) replays are not marked: a server configured so
// while the adapter claims a replay signal shows the suite a dishonest
// contract. An empty name makes the server mark no replay, whatever the
// provider does: the misbehaviour "no replay marker" for a provider that
// has one (httpkey.Worldline).
func WithReplayHeader(name, value string) Option {
	return func(c *config) { c.replayName, c.replayValue, c.replayStamp = name, value, false }
}

// WithHorizon sets how long the server keeps a key after its first request
// (default: the provider's, else 24 hours); a request with an older key executes again.
// A horizon shorter than the adapter declares is the misbehaviour "forgets
// keys early". d must be positive.
func WithHorizon(d time.Duration) Option { return func(c *config) { c.horizon = d } }

// WithInFlightStatus sets the status of a request whose key's first
// request is still in progress (default 409).
func WithInFlightStatus(code int) Option { return func(c *config) { c.inFlight = code } }

// WithLatency makes every new request take d to execute while its key is
// held, so concurrent requests with the key overlap and get the in-flight
// status (default 0). d must not be negative.
func WithLatency(d time.Duration) Option { return func(c *config) { c.latency = d } }

// WithToken makes the server require "Authorization: Bearer token" and
// answer 401 without it (default: no credentials needed).
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// Server is a local HTTP API with the IETF draft's idempotency semantics:
// POST (or PATCH) to any path creates an object and answers 201 with
// {"id": "obj_...", "key": ..., "request": <the request's JSON body>}, and
// GET /objects/{id} reads it back. It listens on 127.0.0.1 only. Its
// idempotency layer:
//
//   - a request without a key gets 400, one with a malformed or too long
//     key 400, nothing stored;
//   - the first request with a key executes; its response, success or
//     failure ([Server.FailNext]), is stored for the horizon, as the
//     server's clock tells;
//   - a request while the key's first request executes gets 409
//     ([WithInFlightStatus]), nothing stored;
//   - a request with the key and another payload (method, path, query and
//     body) gets 422;
//   - a request with the key and the same payload gets the stored
//     response, marked as a replay when [WithReplayHeader] says so;
//   - past the horizon the key is forgotten and a request executes again;
//   - a request whose body holds [DeclineMarker] is declined (402),
//     creating nothing; the refusal is stored under the key.
//
// [As] changes what these answers look like as a vendor documents them.
//
// It counts the objects created per key ([Server.Count]): the count a
// conformance harness's Count needs. Create it with [New] or
// [Start]; its methods are safe for concurrent use.
type Server struct {
	// URL is the server's base URL, e.g. "http://127.0.0.1:40123". It stays
	// the same across [Server.Restart].
	URL string

	cfg config
	hs  *testserver.HTTP // the listener, its restarts and the failures in front of the server

	mu        sync.Mutex
	aged      time.Duration // Age's offset to the clock
	keys      map[string]*entry
	objects   []object
	byID      map[string]int
	created   map[string]int // objects per key
	limitNext int
	failNext  []failure
	conflicts int             // ConflictNext's
	gate      chan struct{}   // closed by Hold's release; nil: requests execute at once
	held      chan<- struct{} // told of each request the gate holds
}

// entry is the idempotency layer's record of one key.
type entry struct {
	payload [32]byte
	first   time.Time
	done    bool
	status  int
	body    []byte
	id      string // the object the request created, if any
}

type failure struct {
	status      int
	afterCreate bool
}

type object struct {
	ID      string          `json:"id"`
	Key     string          `json:"key"`
	Request json.RawMessage `json:"request"`
}

// New starts a server on a free 127.0.0.1 port. Close it when done.
// It returns a *[effects.ConfigError] for an option with an invalid value,
// before listening.
func New(opts ...Option) (*Server, error) {
	cfg := config{now: time.Now}
	ietfServer(&cfg)
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	bad := func(option, format string, args ...any) error {
		return &effects.ConfigError{Op: "httpkeytest.New", Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case cfg.unknown != "":
		return nil, bad("As", "no server for provider %s", cfg.unknown)
	case cfg.horizon <= 0:
		return nil, bad("WithHorizon", "horizon %v is not positive", cfg.horizon)
	case cfg.inFlight < 400 || cfg.inFlight > 599:
		return nil, bad("WithInFlightStatus", "%d is not a 4xx or 5xx status", cfg.inFlight)
	case cfg.latency < 0:
		return nil, bad("WithLatency", "latency %v is negative", cfg.latency)
	}
	s := &Server{
		cfg:     cfg,
		keys:    map[string]*entry{},
		byID:    map[string]int{},
		created: map[string]int{},
	}
	h, err := testserver.NewHTTP("httpkeytest", http.HandlerFunc(s.route), func(w http.ResponseWriter, status int) {
		writeProblem(w, status, http.StatusText(status), "injected in front of the server")
	})
	if err != nil {
		return nil, err
	}
	s.hs, s.URL = h, h.URL
	return s, nil
}

// Start is [New] for tests: it fails tb if the server cannot start,
// and closes it when tb ends.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Close stops the server after the requests in progress have finished.
func (s *Server) Close() { s.hs.Close() }

// Restart stops the server, dropping every connection once the requests
// in progress have finished, and starts it again on the same address with
// the same keys, stored responses and objects, as a deploy of the real API
// would: clients see their pooled connections closed.
func (s *Server) Restart() error { return s.hs.Restart(false) }

// CrashRestart stops the server at once, cutting every connection with
// requests in progress (whose clients get no reply), and starts it again
// on the same address, as a killed API process is restarted. The keys,
// stored responses and objects stay: they model the vendor's durable key
// store, which a process crash does not lose; a request cut while it
// executed keeps its key in progress until it finishes. Its signature is
// conformance.CrashRestarter's.
func (s *Server) CrashRestart(context.Context) error { return s.hs.Restart(true) }

// FailNext makes the next n requests that execute fail with status before
// creating anything. The failure is the key's first response: stored and
// replayed to every later request with the key, as the draft has it.
// Status 429 is the exception: the next n requests of any kind, replays
// included, get 429 before the idempotency layer, and nothing is stored.
func (s *Server) FailNext(n int, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if status == http.StatusTooManyRequests {
		s.limitNext += n
		return
	}
	for range n {
		s.failNext = append(s.failNext, failure{status: status})
	}
}

// FailNextAfterCreate is like [Server.FailNext], but the object is created
// before the failure is answered (and stored): the indeterminate 5xx that
// an adapter must treat as possibly applied.
func (s *Server) FailNextAfterCreate(n int, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failNext = append(s.failNext, failure{status: status, afterCreate: true})
	}
}

// FailNextInFront makes the next n requests, of any kind, get status
// from something in front of the server (a load balancer, a gateway, a
// proxy that sheds load) without reaching it: nothing executes and
// nothing is stored under the key, so a retry with the key executes.
// This is the 5xx a vendor's documentation says to retry with the same
// key, because the request "never reached" its idempotency layer.
func (s *Server) FailNextInFront(n int, status int) { s.hs.FailInFront(n, status, false) }

// FailNextReplyInFront makes the next n requests reach the server, which
// runs each through its idempotency layer as usual (executing it and
// storing its response under the key), while the client gets status from
// something in front of the server instead of the response: a gateway
// that gave up waiting (504) or lost the upstream's reply (502). A retry
// with the key gets the stored response.
func (s *Server) FailNextReplyInFront(n int, status int) { s.hs.FailInFront(n, status, true) }

// ConflictNext makes the next n requests that carry a valid key get the
// in-flight answer ([WithInFlightStatus], in the format of the
// provider the server plays), as if another request with the key were executing (a
// duplicate another process sent at the same moment): nothing executes
// and nothing is stored, as vendors document for a concurrent request
// (Stripe's 409 idempotency_key_in_use, the draft's 409).
func (s *Server) ConflictNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conflicts += n
}

// Hold makes every request that begins executing from now on wait, its
// key held in flight (a repeat gets the in-flight status), until release
// is called; held receives a value as each request begins to wait, so a
// test can act while a first request is known to be in progress without
// timing it. Call release (once or more) before [Server.Close], which
// waits for requests in progress; at most 1024 requests can wait at once.
func (s *Server) Hold() (held <-chan struct{}, release func()) {
	ch, gate := make(chan struct{}, 1024), make(chan struct{})
	s.mu.Lock()
	s.gate, s.held = gate, ch
	s.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			if s.gate == gate {
				s.gate, s.held = nil, nil
			}
			s.mu.Unlock()
			close(gate)
		})
	}
}

// Count returns how many objects requests with the idempotency key key
// created, the key as the server received it (httpkey's Effect.WireKey).
func (s *Server) Count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created[key]
}

// Total returns how many objects were created in all.
func (s *Server) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.objects)
}

// Requests returns how many HTTP requests reached the server, so a test
// can prove that a call made none.
func (s *Server) Requests() int { return s.hs.Requests() }

// problem is an RFC 9457 problem detail, the draft's error format.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// route answers a request that reached the server.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if s.cfg.token != "" && r.Header.Get("Authorization") != "Bearer "+s.cfg.token {
		writeProblem(w, http.StatusUnauthorized, "Unauthorized", "missing or wrong bearer token")
		return
	}
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/objects/"):
		s.get(w, strings.TrimPrefix(r.URL.Path, "/objects/"))
	case r.Method == http.MethodPost || r.Method == http.MethodPatch:
		s.post(w, r)
	default:
		writeProblem(w, http.StatusMethodNotAllowed, "Method not allowed", r.Method+" "+r.URL.Path)
	}
}

// post runs a request through the idempotency layer.
func (s *Server) post(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the request was cut: nothing began executing
	}
	key, title, detail := s.key(r, body)
	if title != "" {
		writeProblem(w, http.StatusBadRequest, title, detail)
		return
	}
	payload := sha256.Sum256([]byte(r.Method + "\x00" + r.URL.RequestURI() + "\x00" + string(body)))

	s.mu.Lock()
	if s.limitNext > 0 {
		s.limitNext--
		s.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusTooManyRequests, "Too many requests", "rate limited before the idempotency layer")
		return
	}
	if s.conflicts > 0 {
		s.conflicts--
		s.mu.Unlock()
		s.writeInFlight(w)
		return
	}
	now := s.now()
	if e := s.keys[key]; e != nil && now.Sub(e.first) < s.cfg.horizon && (e.stored() || s.cfg.failsKept) {
		done, status, stored, same, first, id := e.done, e.status, e.body, e.payload == payload, e.first, e.id
		s.mu.Unlock()
		switch {
		case !done:
			s.writeInFlight(w)
		case !same && s.cfg.reused != 0:
			s.writeReused(w)
		case s.cfg.mode == gocardless && id != "":
			writeJSON(w, http.StatusConflict, goCardlessConflict(id))
		default:
			switch {
			case s.cfg.replayStamp:
				w.Header().Set(s.cfg.replayName, strconv.FormatInt(first.UnixMilli(), 10))
			case s.cfg.replayName != "":
				w.Header().Set(s.cfg.replayName, s.cfg.replayValue)
			}
			writeJSON(w, status, stored)
		}
		return
	}
	e := &entry{payload: payload, first: now}
	s.keys[key] = e // held while executing: concurrent requests get the in-flight status
	s.mu.Unlock()

	if s.cfg.latency > 0 {
		time.Sleep(s.cfg.latency)
	}
	s.mu.Lock()
	gate, held := s.gate, s.held
	s.mu.Unlock()
	if gate != nil {
		held <- struct{}{}
		<-gate
	}
	status, out := s.execute(key, body)
	s.mu.Lock()
	e.done, e.status, e.body = true, status, out
	s.mu.Unlock()
	writeJSON(w, status, out)
}

// stored reports whether the entry's answer is one a server that stores
// only 2xx answers keeps: in progress, or a success.
func (e *entry) stored() bool { return !e.done || e.status >= 200 && e.status <= 299 }

// execute runs a request that the idempotency layer let through: a
// failure from FailNext, a decline, or an object created.
func (s *Server) execute(key string, body []byte) (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var fail *failure
	if len(s.failNext) > 0 {
		fail = &s.failNext[0]
		s.failNext = s.failNext[1:]
	}
	if fail == nil && bytes.Contains(body, []byte(DeclineMarker)) {
		return s.declined()
	}
	var out []byte
	status := http.StatusCreated
	if fail == nil || fail.afterCreate {
		o := object{ID: fmt.Sprintf("obj_%d", len(s.objects)+1), Key: key, Request: requestJSON(body)}
		s.byID[o.ID] = len(s.objects)
		s.objects = append(s.objects, o)
		s.created[key]++
		out, _ = json.Marshal(o) // RawMessage of valid JSON always marshals
		if e := s.keys[key]; e != nil {
			e.id = o.ID
		}
		if s.cfg.mode == braintree {
			status = http.StatusOK
			out, _ = json.Marshal(map[string]json.RawMessage{"data": out})
		}
	}
	if fail != nil {
		status = fail.status
		out, _ = json.Marshal(problem{Type: "about:blank", Title: http.StatusText(fail.status), Status: fail.status, Detail: "injected failure"})
	}
	return status, out
}

// declined returns the mode's refusal of a declined request.
func (s *Server) declined() (int, []byte) {
	switch s.cfg.mode {
	case adyen:
		b, _ := json.Marshal(map[string]any{"status": 422, "errorCode": "010", "message": "Not allowed", "errorType": "validation"})
		return http.StatusUnprocessableEntity, b
	case braintree:
		return http.StatusOK, braintreeError("UNPROCESSABLE", "the payment was declined")
	}
	b, _ := json.Marshal(problem{Type: "about:blank", Title: "Payment declined", Status: http.StatusPaymentRequired, Detail: "declined by the test marker"})
	return http.StatusPaymentRequired, b
}

// writeInFlight answers a request whose key's first request is in
// progress, as the mode's vendor does.
func (s *Server) writeInFlight(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	switch s.cfg.mode {
	case adyen:
		w.Header().Set("Transient-Error", "true")
		b, _ := json.Marshal(map[string]any{"status": s.cfg.inFlight, "errorCode": "704",
			"message": "request already processed or in progress", "errorType": "validation"})
		writeJSON(w, s.cfg.inFlight, b)
	case braintree:
		writeJSON(w, http.StatusOK, braintreeError("VALIDATION", "a request with this apiRequestKey is being processed"))
	default:
		writeProblem(w, s.cfg.inFlight, "A request with this key is being processed", "retry later with the same key")
	}
}

// writeReused answers the key with another payload, as the mode's vendor
// does.
func (s *Server) writeReused(w http.ResponseWriter) {
	switch s.cfg.mode {
	case square:
		b, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"category": "INVALID_REQUEST_ERROR",
			"code": "IDEMPOTENCY_KEY_REUSED", "detail": "the idempotency key was used with another request"}}})
		writeJSON(w, s.cfg.reused, b)
	case razorpayx:
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": "BAD_REQUEST_ERROR",
			"description": "Different payload for the same idempotency key", "source": "business", "field": "X-Payout-Idempotency"}})
		writeJSON(w, s.cfg.reused, b)
	case braintree:
		writeJSON(w, http.StatusOK, braintreeError("VALIDATION", "the apiRequestKey was used with another request"))
	default:
		writeProblem(w, s.cfg.reused, "Idempotency-Key is already used", "the key was used with another payload")
	}
}

// goCardlessConflict is GoCardless's answer to a repeated creation.
func goCardlessConflict(id string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": "A resource has already been created with this idempotency key",
		"type":    "invalid_state", "code": 409, "request_id": "req_" + id,
		"errors": []map[string]any{{"reason": "idempotent_creation_conflict",
			"message": "A resource has already been created with this idempotency key",
			"links":   map[string]string{"conflicting_resource_id": id}}},
	}})
	return b
}

// braintreeError is a GraphQL error of class in a Braintree answer.
func braintreeError(class, message string) []byte {
	b, _ := json.Marshal(map[string]any{
		"errors":     []map[string]any{{"message": message, "extensions": map[string]string{"errorClass": class}}},
		"extensions": map[string]string{"requestId": "req-braintree"},
	})
	return b
}

// key reads the request's key as configured. When it is missing or
// unusable, title and detail say so, for a 400.
func (s *Server) key(r *http.Request, body []byte) (key, title, detail string) {
	const missing, invalid = "Idempotency-Key is missing", "Idempotency-Key is invalid"
	switch s.cfg.place {
	case inField:
		where := strings.Join(s.cfg.field, ".")
		raw := json.RawMessage(body)
		for _, name := range s.cfg.field {
			var obj map[string]json.RawMessage
			if json.Unmarshal(raw, &obj) != nil {
				return "", missing, "the body has no JSON object holding " + where
			}
			var ok bool
			if raw, ok = obj[name]; !ok {
				return "", missing, "the body has no " + where + " member"
			}
		}
		if json.Unmarshal(raw, &key) != nil || key == "" {
			return "", invalid, "the " + where + " member is not a non-empty string"
		}
	default:
		vals := r.Header.Values(s.cfg.name)
		switch {
		case len(vals) == 0:
			return "", missing, "no " + s.cfg.name + " header"
		case len(vals) > 1:
			return "", invalid, "more than one " + s.cfg.name + " header"
		}
		key = vals[0]
		if s.cfg.place == inStructuredHeader {
			var ok bool
			if key, ok = parseString(key); !ok {
				return "", invalid, s.cfg.name + " is not a Structured Field String (RFC 8941): " + vals[0]
			}
		}
		if key == "" {
			return "", missing, "empty " + s.cfg.name
		}
	}
	if len(key) > s.cfg.maxKeyLen || len(key) < s.cfg.minKeyLen {
		return "", invalid, fmt.Sprintf("the key is %d bytes long; it must be %d to %d", len(key), s.cfg.minKeyLen, s.cfg.maxKeyLen)
	}
	if s.cfg.alphabet != "" {
		for i := 0; i < len(key); i++ {
			if strings.IndexByte(s.cfg.alphabet, key[i]) < 0 {
				return "", invalid, fmt.Sprintf("the key holds %q, which is not allowed", key[i])
			}
		}
	}
	return key, "", ""
}

// now is the server's clock: the wall clock, moved by Age. s.mu is held.
func (s *Server) now() time.Time { return s.cfg.now().Add(s.aged) }

// Age makes every key and stored response d older, as if d more time had
// passed on the server's clock, so a test sees
// the server forget keys past its horizon without waiting. Its signature
// is conformance.Ager's: a harness passes it on, and it reaches the one
// thing that keeps the keys. d must not be negative.
func (s *Server) Age(_ context.Context, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("httpkeytest: Age(%v): negative", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aged += d
	return nil
}

// parseString parses an RFC 8941 sf-string: DQUOTE *( unescaped / "\"
// ( DQUOTE / "\" ) ) DQUOTE, unescaped being printable ASCII other than
// DQUOTE and "\".
func parseString(v string) (string, bool) {
	v = strings.TrimSpace(v)
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"' || c < 0x20 || c > 0x7E:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// requestJSON returns body as JSON to embed in the object: itself when it
// is JSON, else a JSON string of it.
func requestJSON(body []byte) json.RawMessage {
	if len(bytes.TrimSpace(body)) > 0 && json.Valid(body) {
		var buf bytes.Buffer
		if json.Compact(&buf, body) == nil {
			return buf.Bytes()
		}
	}
	b, _ := json.Marshal(string(body))
	return b
}

func (s *Server) get(w http.ResponseWriter, id string) {
	s.mu.Lock()
	i, ok := s.byID[id]
	var b []byte
	if ok {
		b, _ = json.Marshal(s.objects[i])
	}
	s.mu.Unlock()
	if !ok {
		writeProblem(w, http.StatusNotFound, "No such object", id)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	b, _ := json.Marshal(problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
