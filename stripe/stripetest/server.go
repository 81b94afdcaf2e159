package stripetest

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
	"effectively.dev/internal/testserver"
)

// APIKey is a secret key the server accepts. Any non-empty bearer token
// is accepted; each one is its own account, with its own idempotency keys
// and objects.
const APIKey = "sk_test_stripetest"

// maxKeyLen is the longest Idempotency-Key the server accepts, as Stripe.
const maxKeyLen = 255

// horizon is how long the server keeps an idempotency key after its first
// request, as Stripe: 24 hours.
const horizon = 24 * time.Hour

// Option configures a [Server]; see [New]. A nil Option is ignored.
type Option func(*config)

type config struct {
	now     func() time.Time
	latency time.Duration
}

// WithClock makes the server read the time from now, so a test can move
// past the 24-hour horizon without waiting. The default is time.Now; now must not
// be nil.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLatency makes every POST that passes validation take d to execute
// while its idempotency key is held, so concurrent requests with the key
// overlap and get 409 idempotency_key_in_use (default 0). d
// must not be negative.
func WithLatency(d time.Duration) Option { return func(c *config) { c.latency = d } }

// Server is a local Stripe API endpoint. Create it with [New] or
// [Start]. Its methods are safe for concurrent use.
type Server struct {
	// URL is the server's base URL, e.g. "http://127.0.0.1:40123", for
	// stripe.BackendConfig.URL. It stays the same across [Server.Restart].
	URL string

	cfg config
	hs  *testserver.HTTP // the listener, its restarts and the failures in front of the API

	mu       sync.Mutex
	keys     map[scopedKey]*entry
	objects  []*object
	byID     map[string]*object
	created  map[string]int  // objects created per idempotency key
	limits   []time.Duration // requests to answer with 429 before the idempotency layer, with their Retry-After (0: none)
	failNext []failure       // executing requests to fail
	conflict int             // POSTs with a key to answer 409 idempotency_key_in_use (ConflictNext)
	rng      *rand.Rand

	revoked    map[string]bool   // API keys answered with 401
	restricted map[string]bool   // API keys whose POSTs are answered with 403
	alias      map[string]string // rolled API key -> the key whose account it acts for
}

// scopedKey is an idempotency key within its account.
type scopedKey struct{ account, key string }

// entry is the idempotency layer's record of one key.
type entry struct {
	path    string
	params  string
	first   time.Time
	done    bool
	status  int
	body    []byte
	request string // Request-Id of the request whose response is stored
}

type failure struct {
	status      int
	afterCreate bool
}

// object is a created Stripe object.
type object struct {
	account string
	key     string // idempotency key of the request that created it
	id      string
	kind    string // Stripe's "object" field: "payment_intent", "customer", ...
	body    any    // what GET returns
	meta    map[string]string
	pi      *paymentIntent // the PaymentIntent, for refunds
}

// New starts a server on a free 127.0.0.1 port. Close it when done.
// It returns a *[effects.ConfigError] for an option with an invalid value,
// before listening.
func New(opts ...Option) (*Server, error) {
	cfg := config{now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	bad := func(option, reason string) error {
		return &effects.ConfigError{Op: "stripetest.New", Option: option, Reason: reason}
	}
	switch {
	case cfg.now == nil:
		return nil, bad("WithClock", "nil clock")
	case cfg.latency < 0:
		return nil, bad("WithLatency", fmt.Sprintf("latency %v is negative", cfg.latency))
	}
	s := &Server{
		cfg:     cfg,
		keys:    map[scopedKey]*entry{},
		byID:    map[string]*object{},
		created: map[string]int{},
		rng:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),

		revoked:    map[string]bool{},
		restricted: map[string]bool{},
		alias:      map[string]string{},
	}
	h, err := testserver.NewHTTP("stripetest", s.handler(), func(w http.ResponseWriter, status int) {
		writeError(w, &apiError{status: status, Type: "api_error",
			Message: fmt.Sprintf("%s (injected in front of the API).", http.StatusText(status))})
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

// Restart stops the server, dropping every connection once the requests in
// progress have finished, and starts it again on the same address with
// the same state (keys, stored responses, objects), as Stripe after a
// deploy: clients see their pooled connections closed.
func (s *Server) Restart() error { return s.hs.Restart(false) }

// Client returns a stripe-go client for this server that sends requests
// with hc (a new http.Client on http.DefaultTransport if nil), [APIKey],
// no network retries of its own, no telemetry and no logging. Tests that
// inject faults pass an http.Client whose Transport is the suite's.
func (s *Server) Client(hc *http.Client) *client.API { return ClientAt(s.URL, hc) }

// ClientAt is [Server.Client] for a server at url that this process did
// not start: a child process reaching its parent's server, say.
func ClientAt(url string, hc *http.Client) *client.API {
	if hc == nil {
		hc = &http.Client{}
	}
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:               stripego.String(url),
		HTTPClient:        hc,
		MaxNetworkRetries: stripego.Int64(0),
		EnableTelemetry:   stripego.Bool(false),
		LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	return client.New(APIKey, &stripego.Backends{API: b, Connect: b, Uploads: b})
}

// FailNext makes the next n requests that would execute a POST fail with
// status and a Stripe-shaped error, before anything is created. As at
// Stripe, the failure is stored under the request's idempotency key and
// replayed to every retry with that key, 500s included. Status 429 is the
// exception: Stripe's rate limiter answers before the idempotency layer, so
// the next n POSTs of any kind, replays included, get 429 and nothing is
// stored.
func (s *Server) FailNext(n int, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if status == http.StatusTooManyRequests {
		for range n {
			s.limits = append(s.limits, 0)
		}
		return
	}
	for i := 0; i < n; i++ {
		s.failNext = append(s.failNext, failure{status: status})
	}
}

// FailNextInFront makes the next n requests, of any kind, get status
// from something between the client and Stripe's API (a load balancer, an
// egress proxy) without reaching the API: nothing executes and nothing
// is stored under the idempotency key, so a retry with the key executes.
func (s *Server) FailNextInFront(n int, status int) { s.hs.FailInFront(n, status, false) }

// FailNextReplyInFront makes the next n requests reach the API, which
// runs each as usual (executing it and storing its response under the
// idempotency key), while the client gets status from something in front
// of the API instead of the response: a proxy that gave up waiting (504)
// or lost the reply (502). A retry with the key gets the stored response.
func (s *Server) FailNextReplyInFront(n int, status int) { s.hs.FailInFront(n, status, true) }

// ConflictNext makes the next n POSTs with an idempotency key get 409
// idempotency_key_in_use, as if another request with the key were in
// progress (a duplicate another process sent at the same moment):
// nothing executes and, as Stripe documents for a request that conflicted
// with a concurrent one, nothing is stored under the key.
func (s *Server) ConflictNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conflict += n
}

// RateLimitNext makes the next n POSTs of any kind, replays included, get
// 429 from the rate limiter with the header "Retry-After" saying
// retryAfter (in whole seconds, at least 1), before the idempotency layer:
// nothing is stored. It is [Server.FailNext] with status 429 and a hint,
// so a test can check that a client reads the hint.
func (s *Server) RateLimitNext(n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.limits = append(s.limits, max(retryAfter.Round(time.Second), time.Second))
	}
}

// RevokeKey makes the server refuse every request made with the secret
// key apiKey with 401, as Stripe refuses a key that was deleted, expired
// or rolled: nothing is stored under an idempotency key for such a
// request. [APIKey] can be revoked too.
func (s *Server) RevokeKey(apiKey string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoked[apiKey] = true
}

// RollKey revokes the secret key old ([Server.RevokeKey]) and makes
// newKey act for old's account from now on, with its idempotency keys and
// objects, as Stripe's "roll key" does: a client still using old gets
// 401, and one given newKey finds everything old created.
func (s *Server) RollKey(old, newKey string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoked[old] = true
	delete(s.revoked, newKey)
	s.alias[newKey] = s.resolveLocked(old)
}

// RestrictKey makes apiKey a restricted key that may read but not write:
// every POST made with it is refused with 403 before the idempotency
// layer (nothing stored), while GETs still work.
func (s *Server) RestrictKey(apiKey string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restricted[apiKey] = true
}

// resolveLocked returns the key whose account apiKey acts for; s.mu is
// held.
func (s *Server) resolveLocked(apiKey string) string {
	if a, ok := s.alias[apiKey]; ok {
		return a
	}
	return apiKey
}

// FailNextAfterCreate is like [Server.FailNext] but fails after the object
// was created: the client gets status (stored and replayed under the key)
// while the object exists. It models the indeterminate 500 that Stripe's
// documentation warns about.
func (s *Server) FailNextAfterCreate(n int, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < n; i++ {
		s.failNext = append(s.failNext, failure{status: status, afterCreate: true})
	}
}

// Created returns how many objects (of every kind) requests with the
// idempotency key created, in every account. Requests without a
// key count under "".
func (s *Server) Created(idempotencyKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created[idempotencyKey]
}

// CreatedWithMetadata returns how many objects were created whose metadata
// maps name to value, whatever their idempotency keys: a count for
// effects that do not keep their key (the way Stripe's search finds
// objects by metadata).
func (s *Server) CreatedWithMetadata(name, value string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, o := range s.objects {
		if v, ok := o.meta[name]; ok && v == value {
			n++
		}
	}
	return n
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

// resource is one kind of object the server creates: POST path, and
// GET path + "/{id}".
type resource struct {
	path     string // "/v1/customers"
	kind     string // the object's "object" field
	validate validator
	execute  executor
}

func (s *Server) resources() []resource {
	return []resource{
		{"/v1/payment_intents", "payment_intent", s.validatePaymentIntent, s.createPaymentIntent},
		{"/v1/refunds", "refund", s.validateRefund, s.createRefund},
		{"/v1/customers", "customer", s.validateCustomer, s.createCustomer},
		{"/v1/transfers", "transfer", s.validateTransfer, s.createTransfer},
		{"/v1/checkout/sessions", "checkout.session", s.validateCheckoutSession, s.createCheckoutSession},
	}
}

// handler is the API: its routes behind the API-key checks. Failures
// injected in front of the API (FailNextInFront) are answered before it.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	for _, res := range s.resources() {
		mux.HandleFunc("POST "+res.path, func(w http.ResponseWriter, r *http.Request) {
			s.post(w, r, res.validate, res.execute)
		})
		mux.HandleFunc("GET "+res.path+"/{id}", func(w http.ResponseWriter, r *http.Request) {
			s.get(w, r, res.kind)
		})
	}
	mux.HandleFunc("GET /v1/balance", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []byte(balanceJSON))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		id := s.newID("req_")
		s.mu.Unlock()
		w.Header().Set("Request-Id", id)
		w.Header().Set("Stripe-Version", stripego.APIVersion)
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			writeError(w, &apiError{status: http.StatusUnauthorized, Type: "invalid_request_error",
				Message: "You did not provide an API key. Provide it in the Authorization header, using Bearer auth."})
			return
		}
		s.mu.Lock()
		revoked, restricted := s.revoked[tok], s.restricted[tok]
		s.mu.Unlock()
		switch {
		case revoked:
			writeError(w, &apiError{status: http.StatusUnauthorized, Type: "invalid_request_error",
				Message: "Invalid API Key provided: " + maskKey(tok)})
			return
		case restricted && r.Method == http.MethodPost:
			writeError(w, &apiError{status: http.StatusForbidden, Type: "invalid_request_error",
				Message: fmt.Sprintf("The provided key '%s' does not have the required permissions for this endpoint. "+
					"Having the 'rak_write' permission would allow this request to continue.", maskKey(tok))})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// balanceJSON is the balance every account has: nothing.
const balanceJSON = `{"object":"balance","available":[{"amount":0,"currency":"usd"}],"livemode":false,"pending":[{"amount":0,"currency":"usd"}]}`

// maskKey shows an API key as Stripe's errors do: its prefix and its last
// four characters.
func maskKey(k string) string {
	if len(k) <= 12 {
		return strings.Repeat("*", len(k))
	}
	return k[:8] + strings.Repeat("*", len(k)-12) + k[len(k)-4:]
}

// account is the scope of idempotency keys and objects: the API key (or
// the key it was rolled from) plus the connected account the request acts
// for.
func (s *Server) account(r *http.Request) string {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	s.mu.Lock()
	tok = s.resolveLocked(tok)
	s.mu.Unlock()
	return tok + "\x00" + r.Header.Get("Stripe-Account")
}

type (
	validator func(acct string, f url.Values) *apiError
	executor  func(acct, key string, f url.Values) (status int, body any)
)

// post runs a POST through the idempotency layer: rate limiter, key
// checks, validation (nothing stored on failure), execution (stored).
func (s *Server) post(w http.ResponseWriter, r *http.Request, validate validator, execute executor) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		// The request was cut: no endpoint began executing.
		return
	}
	form, err := url.ParseQuery(string(raw))
	if err != nil {
		writeError(w, &apiError{status: http.StatusBadRequest, Type: "invalid_request_error",
			Message: "Invalid request body: " + err.Error()})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key != "" {
		w.Header().Set("Idempotency-Key", key)
	}
	if len(key) > maxKeyLen {
		writeError(w, &apiError{status: http.StatusBadRequest, Type: "invalid_request_error",
			Message: fmt.Sprintf("Invalid Idempotency-Key: it is %d characters long, the maximum is %d.", len(key), maxKeyLen)})
		return
	}
	acct := s.account(r)
	sk := scopedKey{acct, key}
	params := form.Encode() // sorted by name: the same parameters compare equal

	s.mu.Lock()
	if len(s.limits) > 0 {
		wait := s.limits[0]
		s.limits = s.limits[1:]
		s.mu.Unlock()
		if wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
		}
		writeError(w, &apiError{status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "rate_limit",
			Message: "Too many requests hit the API too quickly."})
		return
	}
	if key != "" && s.conflict > 0 {
		s.conflict--
		s.mu.Unlock()
		writeError(w, keyInUse())
		return
	}
	var e *entry
	if key != "" {
		if old := s.keys[sk]; old != nil && s.cfg.now().Sub(old.first) < horizon {
			s.mu.Unlock()
			s.answerKnown(w, r, old, key, params)
			return
		}
		e = &entry{path: r.URL.Path, params: params, first: s.cfg.now()}
		s.keys[sk] = e // held while executing: concurrent requests get 409
	}
	if aerr := validate(acct, form); aerr != nil {
		if e != nil {
			delete(s.keys, sk)
		}
		s.mu.Unlock()
		writeError(w, aerr)
		return
	}
	s.mu.Unlock()

	if s.cfg.latency > 0 {
		time.Sleep(s.cfg.latency)
	}

	s.mu.Lock()
	var fail *failure
	if len(s.failNext) > 0 {
		fail = &s.failNext[0]
		s.failNext = s.failNext[1:]
	}
	var (
		status int
		body   any
	)
	if fail == nil || fail.afterCreate {
		status, body = execute(acct, key, form)
	}
	if fail != nil {
		status, body = fail.status, errorBody(&apiError{Type: "api_error",
			Message: fmt.Sprintf("An unknown error occurred (injected %d).", fail.status)})
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // our own types always marshal
	}
	if e != nil {
		e.done, e.status, e.body, e.request = true, status, b, w.Header().Get("Request-Id")
	}
	s.mu.Unlock()
	writeJSON(w, status, b)
}

// keyInUse is Stripe's answer to a request whose idempotency key another
// request in progress holds.
func keyInUse() *apiError {
	return &apiError{status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_use",
		Message: "There is currently another in-progress request using this Idempotency-Key. Please try again later."}
}

// answerKnown answers a request whose key is remembered: 409 while the
// first request executes, 400 for other parameters, else the replay.
func (s *Server) answerKnown(w http.ResponseWriter, r *http.Request, e *entry, key, params string) {
	s.mu.Lock()
	done, path, stored, status, body, req := e.done, e.path, e.params, e.status, e.body, e.request
	s.mu.Unlock()
	switch {
	case !done:
		writeError(w, keyInUse())
	case path != r.URL.Path:
		writeError(w, &apiError{status: http.StatusBadRequest, Type: "idempotency_error",
			Message: fmt.Sprintf("Keys for idempotent requests can only be used for the same endpoint they were first used for ('%s' vs '%s'). Try using a key other than '%s' if you meant to execute a different request.", r.URL.Path, path, key)})
	case stored != params:
		writeError(w, &apiError{status: http.StatusBadRequest, Type: "idempotency_error",
			Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", key)})
	default:
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Original-Request", req)
		writeJSON(w, status, body)
	}
}

// get serves GET <path>/{id} for objects of kind.
func (s *Server) get(w http.ResponseWriter, r *http.Request, kind string) {
	id := r.PathValue("id")
	acct := s.account(r)
	s.mu.Lock()
	var b []byte
	if o := s.byID[id]; o != nil && o.account == acct && o.kind == kind {
		b, _ = json.Marshal(o.body)
	}
	s.mu.Unlock()
	if b == nil {
		writeError(w, &apiError{status: http.StatusNotFound, Type: "invalid_request_error", Code: "resource_missing",
			Param: "id", Message: fmt.Sprintf("No such %s: '%s'", kind, id)})
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// record adds a created object; s.mu is held.
func (s *Server) record(o *object) {
	s.objects = append(s.objects, o)
	s.byID[o.id] = o
	s.created[o.key]++
}

const idChars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix and 24 random characters, like Stripe's ids; s.mu
// is held.
func (s *Server) newID(prefix string) string {
	b := make([]byte, 24)
	for i := range b {
		b[i] = idChars[s.rng.IntN(len(idChars))]
	}
	return prefix + string(b)
}

// apiError is Stripe's error object.
type apiError struct {
	status        int
	Type          string         `json:"type"`
	Code          string         `json:"code,omitempty"`
	DeclineCode   string         `json:"decline_code,omitempty"`
	DocURL        string         `json:"doc_url,omitempty"`
	Message       string         `json:"message"`
	Param         string         `json:"param,omitempty"`
	PaymentIntent *paymentIntent `json:"payment_intent,omitempty"`
}

func errorBody(e *apiError) any { return map[string]*apiError{"error": e} }

func writeError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(errorBody(e))
	writeJSON(w, e.status, b)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
