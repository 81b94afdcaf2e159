package stripetest

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
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

// validatePaymentIntent checks the parameters of POST /v1/payment_intents
// before anything executes; s.mu is held.
func (s *Server) validatePaymentIntent(_ string, f url.Values) *apiError {
	if _, err := positiveInt(f, "amount", true); err != nil {
		return err
	}
	cur := f.Get("currency")
	if cur == "" {
		return missing("currency")
	}
	if len(cur) != 3 || strings.ToLower(cur) != cur || strings.Trim(cur, "abcdefghijklmnopqrstuvwxyz") != "" {
		return invalid("currency", "Invalid currency: %s. Stripe currently supports these currencies: usd, eur, ...", cur)
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
	o := &object{account: acct, key: key, pi: pi}
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
	s.record(&object{account: acct, key: key, re: re})
	return http.StatusOK, re
}
