//go:build race

package torture_test

// raceEnabled reports whether the test binary has the race detector; the
// worker binary is then built with it too.
const raceEnabled = true
