// Package testserver holds what the test kits pgtest and mysqltest share:
// the registry of a test binary's shared servers, their TestMain, database
// names made from test names, the process handling of a server started
// from the system's binaries (its process group, its log, a free port, a
// bounded shutdown), and a TCP proxy a test can stall.
package testserver
