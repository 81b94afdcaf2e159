// Command conformance-matrix merges the conformance reports that tests wrote
// into a directory (set CONFORMANCE_REPORT=dir when running go test) into
// Markdown tables: adapter × scenario → effects observed, verdict; per
// adapter and field of its declared contract (guarantee, duplicate
// window, horizon, key reuse), verified, not verified or failed, with the
// scenarios that verified it and those left out and why; the same for
// the journals (conformance.RunJournal), sources (conformance.RunSource)
// and plans (conformance.RunPlan).
// Counterexamples (reports made with conformance.ReportOnly) are listed
// apart, with the scenarios that caught them.
//
// Usage:
//
//	CONFORMANCE_REPORT=/tmp/conf go test ./...
//	go run effectively.dev/cmd/conformance-matrix /tmp/conf
//
// It exits with status 1 if any scenario of a report held to its contract
// failed, or such a report has a field that could not be verified and no
// reason was given (conformance.Report.Verify), and 2 if the directory
// holds no report (a suite that ran nothing is not a pass).
package main

import (
	"fmt"
	"os"

	"effectively.dev/conformance"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: conformance-matrix DIR")
		os.Exit(2)
	}
	table, failed, err := conformance.MergeMatrix(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance-matrix:", err)
		os.Exit(2)
	}
	fmt.Print(table)
	if failed {
		os.Exit(1)
	}
}
