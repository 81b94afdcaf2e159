// Package testserver holds what the test kits share: for pgtest and
// mysqltest, the registry of a test binary's shared servers, their
// TestMain, database names made from test names, the process handling of
// a server started from the system's binaries (its process group, its
// log, a free port, a bounded shutdown), and a TCP proxy a test can
// stall; for stripetest and httpkeytest, an HTTP server that keeps its
// address across restarts and fails requests in front of its handler.
package testserver
