package httpkey_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"effectively.dev/effects"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// A charge sent twice with one key, as a redelivered message would send
// it, against a local API that stores its first response per key and marks
// replays: the second Apply creates nothing and reports the first charge's
// id as a replay.
func Example() {
	srv, err := httpkeytest.New(httpkeytest.WithReplayHeader("Idempotent-Replayed", "true"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	type Charge struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	charges, err := httpkey.New(http.DefaultClient,
		func(ctx context.Context, c Charge) (*http.Request, error) {
			body, err := json.Marshal(c)
			if err != nil {
				return nil, err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Content-Type", "application/json")
			return req, nil
		},
		httpkey.IETF,
		httpkey.WithHorizon(24*time.Hour), // from the API's documentation
		httpkey.WithReplayHeader("Idempotent-Replayed", "true"),
		httpkey.WithRef(httpkey.JSONField("id")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(charges.Contract().Guarantee, charges.Contract().Horizon)

	key := effects.MustKey("billing", "order-42", "charge")
	for range 2 {
		res, err := charges.Apply(context.Background(), key, Charge{Amount: 2000, Currency: "EUR"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Status, res.Ref)
	}
	wire, _ := charges.WireKey(key)
	fmt.Println("charges created:", srv.Count(wire))
	// Output:
	// effectively-once 24h0m0s
	// applied obj_1
	// replayed obj_1
	// charges created: 1
}
