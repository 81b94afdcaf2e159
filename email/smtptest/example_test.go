package smtptest_test

import (
	"fmt"
	"net/smtp"

	"effectively.dev/email/smtptest"
)

// A test starts the server (Start registers its Close with t.Cleanup;
// New is the form without a testing.TB), sends to it over a real
// socket, and counts what arrived by Message-ID.
func Example() {
	srv, err := smtptest.New()
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	msg := "Message-ID: <receipt-42@shop.example>\r\nSubject: Your receipt\r\n\r\nThanks.\r\n"
	for range 2 { // a retry after a lost 250 sends the same message again
		if err := smtp.SendMail(srv.Addr(), nil, "shop@shop.example", []string{"ada@example.com"}, []byte(msg)); err != nil {
			panic(err)
		}
	}
	fmt.Println("copies of receipt-42:", srv.Count("receipt-42@shop.example"))
	fmt.Println("messages in all:", srv.Total())
	// Output:
	// copies of receipt-42: 2
	// messages in all: 2
}
