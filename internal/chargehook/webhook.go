package chargehook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/internal/payment"
	"effectively.dev/kafka"
)

// The webhook tier: processor -> load balancer -> two pods -> Kafka. Every
// piece is a real HTTP client or server on 127.0.0.1; the faults of the
// schedule are injected where they happen in production.

// HTTP headers the tier passes along, and the record headers the pods
// write.
const (
	hdrEventID = "Chargehook-Event-Id" // the processor names the event, as Stripe-Signature does
	hdrAttempt = "Chargehook-Attempt"  // the processor's attempt, from 1
	hdrLBTry   = "Chargehook-Lb-Try"   // the balancer's try, from 1

	recHop    = "hop"       // first | sender-retry | sibling-retry
	recID     = "record-id" // unique per record: pod and sequence number
	recEvent  = "event-id"  // the event a record is about
	hopFirst  = "first"
	hopSender = "sender-retry"
	hopSib    = "sibling-retry"
)

const (
	// lbTryTimeout is the balancer's per-try timeout: a pod that has not
	// answered by then is presumed frozen, and the balancer retries once on
	// the sibling.
	lbTryTimeout = 250 * time.Millisecond
	// gcPause is how long a pod freezes when the schedule says so: longer
	// than the balancer waits, by a margin that a loaded machine's late
	// timers do not eat, so that the balancer always retries on the sibling
	// and the frozen pod enqueues soon after the sibling did.
	gcPause = lbTryTimeout + 150*time.Millisecond
	// processorAttempts is how often the processor tries one event.
	processorAttempts = 8
)

// pod is one replica of the webhook handler: it enqueues the webhook to
// Kafka and answers 200 once the broker acked it (the essay's hop 3).
type pod struct {
	name   string
	faults map[string]Faults
	cl     *kgo.Client
	topic  string
	srv    *http.Server
	url    string
	seq    atomic.Int64
	queued atomic.Int64
}

func startPod(name string, faults map[string]Faults, cl *kgo.Client, topic string) (*pod, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pod{name: name, faults: faults, cl: cl, topic: topic, url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks", p.webhook)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// webhook enqueues one event.
func (p *pod) webhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	ev, err := payment.Decode(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	attempt, _ := strconv.Atoi(r.Header.Get(hdrAttempt))
	try, _ := strconv.Atoi(r.Header.Get(hdrLBTry))
	if p.faults[ev.ID].SiblingRetry && attempt == 1 && try == 1 {
		// A stop-the-world pause: the pod neither answers nor notices that
		// the balancer gave up on it, and enqueues when it thaws.
		time.Sleep(gcPause)
	}
	hop := hopFirst
	switch {
	case try > 1:
		hop = hopSib
	case attempt > 1:
		hop = hopSender
	}
	rec := &kgo.Record{
		Topic: p.topic,
		Value: body,
		Headers: []kgo.RecordHeader{
			{Key: kafka.KeyHeader, Value: []byte(ev.ID)}, // Delivery.ID: the event's id, the same for every copy
			{Key: recEvent, Value: []byte(ev.ID)},
			{Key: recHop, Value: []byte(hop)},
			{Key: recID, Value: []byte(fmt.Sprintf("%s/%d", p.name, p.seq.Add(1)))},
		},
	}
	// The enqueue is not tied to the request: a pod that already read the
	// webhook finishes enqueueing it even if its client went away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if err := p.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		http.Error(w, "enqueue failed: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	p.queued.Add(1)
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "queued\n")
}

// stop waits for the webhooks in progress (a frozen pod's too) and stops.
func (p *pod) stop(ctx context.Context) error {
	return p.srv.Shutdown(ctx)
}

// balancer is the edge load balancer: round robin over the pods, a
// per-try timeout, one retry on the sibling (hop 2).
type balancer struct {
	pods   []*pod
	faults map[string]Faults
	client *http.Client
	srv    *http.Server
	url    string
	next   atomic.Uint64

	siblingRetries atomic.Int64 // tries that went to the sibling
	droppedReplies atomic.Int64 // 200s the processor never saw
}

func startBalancer(pods []*pod, faults map[string]Faults) (*balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &balancer{
		pods:   pods,
		faults: faults,
		client: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}},
		url:    "http://" + ln.Addr().String(),
	}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

// ServeHTTP forwards one request.
func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	first := int(b.next.Add(1) % uint64(len(b.pods)))
	var (
		status int
		reply  []byte
	)
	for try := 1; try <= 2; try++ {
		p := b.pods[(first+try-1)%len(b.pods)]
		if try > 1 {
			b.siblingRetries.Add(1)
		}
		status, reply, err = b.forward(r, p, try, body)
		if err == nil {
			break
		}
	}
	if err != nil {
		http.Error(w, "upstream timed out: "+err.Error(), http.StatusGatewayTimeout)
		return
	}
	id := r.Header.Get(hdrEventID)
	if status == http.StatusOK && b.faults[id].SenderRetry && r.Header.Get(hdrAttempt) == "1" {
		// The 200 is lost on the way back: the edge connection resets
		// (or the answer comes after the processor's timeout; the
		// processor cannot tell the two apart, and retries either way).
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				b.droppedReplies.Add(1)
				_ = conn.Close()
				return
			}
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(reply)
}

// forward makes one try on p with the per-try timeout.
func (b *balancer) forward(r *http.Request, p *pod, try int, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(r.Context(), lbTryTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/webhooks", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hdrEventID, r.Header.Get(hdrEventID))
	req.Header.Set(hdrAttempt, r.Header.Get(hdrAttempt))
	req.Header.Set(hdrLBTry, strconv.Itoa(try))
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, reply, nil
}

func (b *balancer) stop(ctx context.Context) error {
	err := b.srv.Shutdown(ctx)
	b.client.CloseIdleConnections()
	return err
}

// processor is the payment processor: it POSTs each event to the balancer
// and retries until it sees a 2xx (hop 1). It keeps at most window events
// outstanding, pacing itself to what the pipeline has finished, as a live
// stream would rather than a backlog replay.
type processor struct {
	url    string
	faults map[string]Faults
	client *http.Client
	window chan struct{}

	mu       sync.Mutex
	released map[string]bool

	attempts atomic.Int64 // POSTs sent
	retries  atomic.Int64 // POSTs after the first, per event
	gaveUp   atomic.Int64 // events never acknowledged
}

func newProcessor(url string, faults map[string]Faults, window int) *processor {
	return &processor{
		url:      url,
		faults:   faults,
		client:   &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}},
		window:   make(chan struct{}, window),
		released: map[string]bool{},
	}
}

// done frees the window slot of an event the pipeline finished. Only the
// first call per event counts.
func (p *processor) done(id string) {
	p.mu.Lock()
	first := !p.released[id]
	p.released[id] = true
	p.mu.Unlock()
	if first {
		<-p.window
	}
}

// run sends every event and returns when each was acknowledged or given up.
func (p *processor) run(ctx context.Context, events []Event) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, ev := range events {
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !p.deliver(ctx, ev) {
				p.gaveUp.Add(1)
				p.done(ev.ID)
			}
		}()
	}
	return nil
}

// deliver sends ev until a 2xx, waiting between attempts.
func (p *processor) deliver(ctx context.Context, ev Event) bool {
	body, _ := json.Marshal(ev)
	wait := p.faults[ev.ID].RetryAfter
	for attempt := 1; attempt <= processorAttempts; attempt++ {
		if attempt > 1 {
			p.retries.Add(1)
			select {
			case <-ctx.Done():
				return false
			case <-time.After(wait):
			}
			wait = min(2*wait, 2*time.Second)
		}
		p.attempts.Add(1)
		if p.post(ctx, ev.ID, attempt, body) == nil {
			return true
		}
	}
	return false
}

func (p *processor) post(ctx context.Context, id string, attempt int, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/webhooks", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hdrEventID, id)
	req.Header.Set(hdrAttempt, strconv.Itoa(attempt))
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return errors.New(resp.Status)
	}
	return nil
}

func (p *processor) close() { p.client.CloseIdleConnections() }
