package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"

	"effectively.dev/conformance"
)

// A crashed process, as its backend sees it: Sever cuts every connection
// made through the Faults and refuses new ones. The journal and source
// suites crash instances this way.
func ExampleFaults_Sever() {
	srv, err := newLedgerServer(0)
	if err != nil {
		panic(err)
	}
	defer srv.stop()
	f := new(conformance.Faults)
	c, err := f.DialContext(context.Background(), "tcp", srv.Addr())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "PING")
	reply, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print("before: ", reply)

	f.Sever()
	_, err = fmt.Fprintln(c, "PING")
	fmt.Println("write after Sever:", errors.Is(err, conformance.ErrSevered))
	_, err = f.DialContext(context.Background(), "tcp", srv.Addr())
	fmt.Println("dial after Sever:", errors.Is(err, conformance.ErrSevered))
	fmt.Println("round trips:", f.RoundTrips())
	// Output:
	// before: PONG
	// write after Sever: true
	// dial after Sever: true
	// round trips: 1
}
