package mysqltest

// NewServer is the constructor Start wraps, for the test of its error
// without binaries.
var NewServer = newServer
