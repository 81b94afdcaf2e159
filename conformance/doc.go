// Package conformance is the shared test suite that holds every adapter to
// its declared [effects.Contract] under injected faults.
//
// An adapter's test implements a [Harness] (build the adapter against its
// backend through the suite's fault injector, produce inputs, count effects
// in the backend itself) and calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, "myadapter", func(t testing.TB) conformance.Harness[MyInput] {
//			return newHarness(t) // starts or connects to the backend, cleans up with t.Cleanup
//		})
//	}
//
// The scenarios are: sequential redelivery, concurrent duplicates, a lost
// reply at every round trip, a request cut at every round trip, a context
// cancelled at every round trip, key reuse with another payload, invalid
// keys, a replay storm, and a backend restart when the harness can do one.
// Each asserts against the contract the adapter declares: EffectivelyOnce
// means exactly one effect per key in every scenario; AtLeastOnce means at
// least one, and more only in scenarios the declared duplicate window
// covers; zero effects after a successful Apply always fails. A scenario the
// harness cannot support is reported as not run, never as passed.
//
// The suite is proven by its own tests: package
// effectively.dev/conformance/counterexamples holds adapters that claim
// EffectivelyOnce and lie, and the suite must fail each one in a named
// scenario.
//
// The package depends only on package effects and the standard library, so
// adapters outside this repository can use it.
package conformance
