package stripetest

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// paymentIntent is the JSON shape of a Stripe PaymentIntent, as far as
// stripe-go's PaymentIntent decodes it.
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           *string           `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *apiError         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	ReceiptEmail       *string           `json:"receipt_email"`
	Status             string            `json:"status"`

	refunded int64 // amount refunded so far, for refund checks
}

// refund is the JSON shape of a Stripe Refund.
type refund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	Metadata      map[string]string `json:"metadata"`
	PaymentIntent string            `json:"payment_intent"`
	Reason        *string           `json:"reason"`
	Status        string            `json:"status"`
}

// declining lists the test payment methods whose confirmation is declined.
var declining = map[string]string{
	"pm_card_chargeDeclined":                  "generic_decline",
	"pm_card_visa_chargeDeclined":             "generic_decline",
	"pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
}

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, Type: "invalid_request_error", Param: param,
		Message: fmt.Sprintf(format, args...)}
}

func missing(param string) *apiError {
	e := invalid(param, "Missing required param: %s.", param)
	e.Code = "parameter_missing"
	return e
}

// positiveInt validates an optional integer parameter that must be >= 1.
func positiveInt(f url.Values, param string, required bool) (int64, *apiError) {
	v := f.Get(param)
	if v == "" {
		if required {
			return 0, missing(param)
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, invalid(param, "Invalid integer: %s", v)
	}
	if n < 1 {
		return 0, invalid(param, "This value must be greater than or equal to 1.")
	}
	return n, nil
}

func oneOf(f url.Values, param string, allowed ...string) *apiError {
	v := f.Get(param)
	if v == "" {
		return nil
	}
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return invalid(param, "Invalid %s: must be one of %s", param, strings.Join(allowed, ", "))
}

func metadata(f url.Values) map[string]string {
	m := map[string]string{}
	for k, v := range f {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			m[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	return m
}

func optional(f url.Values, param string) *string {
	if v := f.Get(param); v != "" {
		return &v
	}
	return nil
}

// validCurrency checks a required three-letter lower-case currency code.
func validCurrency(f url.Values) *apiError {
	cur := f.Get("currency")
	if cur == "" {
		return missing("currency")
	}
	if len(cur) != 3 || strings.ToLower(cur) != cur || strings.Trim(cur, "abcdefghijklmnopqrstuvwxyz") != "" {
		return invalid("currency", "Invalid currency: %s. Stripe currently supports these currencies: usd, eur, ...", cur)
	}
	return nil
}

// validatePaymentIntent checks the parameters of POST /v1/payment_intents
// before anything executes; s.mu is held.
func (s *Server) validatePaymentIntent(_ string, f url.Values) *apiError {
	if _, err := positiveInt(f, "amount", true); err != nil {
		return err
	}
	if err := validCurrency(f); err != nil {
		return err
	}
	if err := oneOf(f, "confirm", "true", "false"); err != nil {
		return err
	}
	if err := oneOf(f, "capture_method", "automatic", "automatic_async", "manual"); err != nil {
		return err
	}
	if f.Get("confirm") == "true" && f.Get("payment_method") == "" {
		return invalid("payment_method", "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the PaymentIntent, provide a payment_method.")
	}
	return nil
}

// createPaymentIntent executes POST /v1/payment_intents; s.mu is held.
func (s *Server) createPaymentIntent(acct, key string, f url.Values) (int, any) {
	amount, _ := strconv.ParseInt(f.Get("amount"), 10, 64)
	pi := &paymentIntent{
		ID:                 s.newID("pi_"),
		Object:             "payment_intent",
		Amount:             amount,
		CaptureMethod:      "automatic",
		ConfirmationMethod: "automatic",
		Created:            s.cfg.now().Unix(),
		Currency:           f.Get("currency"),
		Customer:           optional(f, "customer"),
		Description:        optional(f, "description"),
		Metadata:           metadata(f),
		PaymentMethod:      optional(f, "payment_method"),
		PaymentMethodTypes: []string{"card"},
		ReceiptEmail:       optional(f, "receipt_email"),
		Status:             "requires_payment_method",
	}
	pi.ClientSecret = pi.ID + "_secret_" + s.newID("")
	if m := f.Get("capture_method"); m != "" {
		pi.CaptureMethod = m
	}
	status, body := http.StatusOK, any(pi)
	switch {
	case f.Get("confirm") == "true" && declining[f.Get("payment_method")] != "":
		e := &apiError{Type: "card_error", Code: "card_declined", DeclineCode: declining[f.Get("payment_method")],
			Message: "Your card was declined.", DocURL: "https://stripe.com/docs/error-codes/card-declined"}
		pi.LastPaymentError, pi.PaymentMethod = e, nil
		e2 := *e
		e2.PaymentIntent = pi
		status, body = http.StatusPaymentRequired, errorBody(&e2)
	case f.Get("confirm") == "true" && pi.CaptureMethod == "manual":
		pi.Status, pi.AmountCapturable = "requires_capture", amount
		ch := s.newID("ch_")
		pi.LatestCharge = &ch
	case f.Get("confirm") == "true":
		pi.Status, pi.AmountReceived = "succeeded", amount
		ch := s.newID("ch_")
		pi.LatestCharge = &ch
	case pi.PaymentMethod != nil:
		pi.Status = "requires_confirmation"
	}
	o := &object{account: acct, key: key, id: pi.ID, kind: "payment_intent", body: pi, meta: pi.Metadata, pi: pi}
	s.record(o)
	if pi.LatestCharge != nil {
		s.byID[*pi.LatestCharge] = o
	}
	return status, body
}

// chargedIntent finds the PaymentIntent a refund names, by payment_intent
// or charge; s.mu is held.
func (s *Server) chargedIntent(acct string, f url.Values) (*paymentIntent, *apiError) {
	param, id := "payment_intent", f.Get("payment_intent")
	if id == "" {
		param, id = "charge", f.Get("charge")
	}
	o := s.byID[id]
	if o == nil || o.pi == nil || o.account != acct ||
		(param == "payment_intent" && o.pi.ID != id) ||
		(param == "charge" && (o.pi.LatestCharge == nil || *o.pi.LatestCharge != id)) {
		e := invalid(param, "No such %s: '%s'", param, id)
		e.Code = "resource_missing"
		return nil, e
	}
	return o.pi, nil
}

// validateRefund checks the parameters of POST /v1/refunds; s.mu is held.
func (s *Server) validateRefund(acct string, f url.Values) *apiError {
	if f.Get("payment_intent") == "" && f.Get("charge") == "" {
		return invalid("payment_intent", "One of the following params should be provided for this request: payment_intent or charge.")
	}
	if f.Get("payment_intent") != "" && f.Get("charge") != "" {
		return invalid("charge", "You cannot specify both charge and payment_intent.")
	}
	if _, err := positiveInt(f, "amount", false); err != nil {
		return err
	}
	if err := oneOf(f, "reason", "duplicate", "fraudulent", "requested_by_customer"); err != nil {
		return err
	}
	_, err := s.chargedIntent(acct, f)
	return err
}

// createRefund executes POST /v1/refunds; s.mu is held.
func (s *Server) createRefund(acct, key string, f url.Values) (int, any) {
	pi, aerr := s.chargedIntent(acct, f)
	if aerr != nil { // validated before; kept for safety
		return aerr.status, errorBody(aerr)
	}
	if pi.Status != "succeeded" || pi.LatestCharge == nil {
		e := invalid("payment_intent", "This PaymentIntent (%s) does not have a successful charge to refund.", pi.ID)
		return e.status, errorBody(e)
	}
	left := pi.AmountReceived - pi.refunded
	if left <= 0 {
		e := invalid("", "Charge %s has already been refunded.", *pi.LatestCharge)
		e.Code = "charge_already_refunded"
		return e.status, errorBody(e)
	}
	amount, _ := positiveInt(f, "amount", false)
	if amount == 0 {
		amount = left
	}
	if amount > left {
		e := invalid("amount", "Refund amount (%d) is greater than unrefunded amount on charge (%d)", amount, left)
		e.Code = "amount_too_large"
		return e.status, errorBody(e)
	}
	pi.refunded += amount
	re := &refund{
		ID:            s.newID("re_"),
		Object:        "refund",
		Amount:        amount,
		Charge:        *pi.LatestCharge,
		Created:       s.cfg.now().Unix(),
		Currency:      pi.Currency,
		Metadata:      metadata(f),
		PaymentIntent: pi.ID,
		Reason:        optional(f, "reason"),
		Status:        "succeeded",
	}
	s.record(&object{account: acct, key: key, id: re.ID, kind: "refund", body: re, meta: re.Metadata})
	return http.StatusOK, re
}

// customer is the JSON shape of a Stripe Customer.
type customer struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	Description *string           `json:"description"`
	Email       *string           `json:"email"`
	Livemode    bool              `json:"livemode"`
	Metadata    map[string]string `json:"metadata"`
	Name        *string           `json:"name"`
	Phone       *string           `json:"phone"`
}

// validateCustomer checks the parameters of POST /v1/customers: all are
// optional, an email must look like one.
func (s *Server) validateCustomer(_ string, f url.Values) *apiError {
	if e := f.Get("email"); e != "" && (strings.Count(e, "@") != 1 || strings.HasPrefix(e, "@") ||
		strings.HasSuffix(e, "@") || strings.ContainsAny(e, " \t\r\n")) {
		e := invalid("email", "Invalid email address: %s", e)
		e.Code = "email_invalid"
		return e
	}
	return nil
}

// createCustomer executes POST /v1/customers; s.mu is held.
func (s *Server) createCustomer(acct, key string, f url.Values) (int, any) {
	c := &customer{
		ID:          s.newID("cus_"),
		Object:      "customer",
		Created:     s.cfg.now().Unix(),
		Description: optional(f, "description"),
		Email:       optional(f, "email"),
		Metadata:    metadata(f),
		Name:        optional(f, "name"),
		Phone:       optional(f, "phone"),
	}
	s.record(&object{account: acct, key: key, id: c.ID, kind: c.Object, body: c, meta: c.Metadata})
	return http.StatusOK, c
}

// transfer is the JSON shape of a Stripe Transfer (Connect).
type transfer struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountReversed int64             `json:"amount_reversed"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	Description    *string           `json:"description"`
	Destination    string            `json:"destination"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Reversed       bool              `json:"reversed"`
	TransferGroup  *string           `json:"transfer_group"`
}

// validateTransfer checks the parameters of POST /v1/transfers: amount,
// currency and a connected account as destination are required.
func (s *Server) validateTransfer(_ string, f url.Values) *apiError {
	if _, err := positiveInt(f, "amount", true); err != nil {
		return err
	}
	if err := validCurrency(f); err != nil {
		return err
	}
	dest := f.Get("destination")
	if dest == "" {
		return missing("destination")
	}
	if !strings.HasPrefix(dest, "acct_") {
		e := invalid("destination", "No such destination: '%s'", dest)
		e.Code = "resource_missing"
		return e
	}
	return nil
}

// createTransfer executes POST /v1/transfers; s.mu is held.
func (s *Server) createTransfer(acct, key string, f url.Values) (int, any) {
	amount, _ := positiveInt(f, "amount", true)
	tr := &transfer{
		ID:            s.newID("tr_"),
		Object:        "transfer",
		Amount:        amount,
		Created:       s.cfg.now().Unix(),
		Currency:      f.Get("currency"),
		Description:   optional(f, "description"),
		Destination:   f.Get("destination"),
		Metadata:      metadata(f),
		TransferGroup: optional(f, "transfer_group"),
	}
	s.record(&object{account: acct, key: key, id: tr.ID, kind: tr.Object, body: tr, meta: tr.Metadata})
	return http.StatusOK, tr
}

// checkoutSession is the JSON shape of a Stripe Checkout Session.
type checkoutSession struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	CancelURL         *string           `json:"cancel_url"`
	ClientReferenceID *string           `json:"client_reference_id"`
	Created           int64             `json:"created"`
	Customer          *string           `json:"customer"`
	CustomerEmail     *string           `json:"customer_email"`
	ExpiresAt         int64             `json:"expires_at"`
	Livemode          bool              `json:"livemode"`
	Metadata          map[string]string `json:"metadata"`
	Mode              string            `json:"mode"`
	PaymentStatus     string            `json:"payment_status"`
	Status            string            `json:"status"`
	SuccessURL        *string           `json:"success_url"`
	URL               string            `json:"url"`
}

// validateCheckoutSession checks the parameters of POST
// /v1/checkout/sessions: a mode, a success_url, and line items in payment
// and subscription mode.
func (s *Server) validateCheckoutSession(_ string, f url.Values) *apiError {
	mode := f.Get("mode")
	if mode == "" {
		return missing("mode")
	}
	if err := oneOf(f, "mode", "payment", "setup", "subscription"); err != nil {
		return err
	}
	if f.Get("success_url") == "" {
		return missing("success_url")
	}
	if mode != "setup" {
		items := false
		for k := range f {
			if strings.HasPrefix(k, "line_items[0]") {
				items = true
				break
			}
		}
		if !items {
			return missing("line_items")
		}
	}
	return nil
}

// createCheckoutSession executes POST /v1/checkout/sessions; s.mu is held.
func (s *Server) createCheckoutSession(acct, key string, f url.Values) (int, any) {
	now := s.cfg.now()
	cs := &checkoutSession{
		ID:                s.newID("cs_test_"),
		Object:            "checkout.session",
		CancelURL:         optional(f, "cancel_url"),
		ClientReferenceID: optional(f, "client_reference_id"),
		Created:           now.Unix(),
		Customer:          optional(f, "customer"),
		CustomerEmail:     optional(f, "customer_email"),
		ExpiresAt:         now.Add(24 * time.Hour).Unix(),
		Metadata:          metadata(f),
		Mode:              f.Get("mode"),
		PaymentStatus:     "unpaid",
		Status:            "open",
		SuccessURL:        optional(f, "success_url"),
	}
	cs.URL = "https://checkout.stripe.com/c/pay/" + cs.ID
	s.record(&object{account: acct, key: key, id: cs.ID, kind: cs.Object, body: cs, meta: cs.Metadata})
	return http.StatusOK, cs
}
