package httpkeytest_test

import (
	"fmt"
	"net/http"
	"strings"

	"effectively.dev/httpkey/httpkeytest"
)

// The server stores the first response per key: the same request with the
// same key replays it and creates nothing; the key with another payload is
// refused with 422.
func Example() {
	srv, err := httpkeytest.New() // in a test: httpkeytest.Start(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	post := func(body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/objects", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"order-42"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(post(`{"amount":100}`), post(`{"amount":100}`), post(`{"amount":999}`))
	fmt.Println(srv.Count("order-42"), srv.Total())
	// Output:
	// 201 201 422
	// 1 1
}
